"""Cold start of README command 1: `catbp-jit run examples/grid3_d2__prob_float64`.

Each round runs, each in a new process:
  import  `python -c "import catbp_jit"`: the interpreter, numpy and Numba loading;
  cold    the command with CATBP_JIT_CACHE_DIR a new empty directory: every kernel compiled;
  warm    the command again on that directory: every kernel loaded from disk.
It prints per round the wall time of each process and, for the two runs, the compile time
the command reports ("compiled in X s"), then the medians. Times vary a lot with the
machine's load: the header records the load average, and only rounds of one run of this
script compare.

    .venv/bin/python perf/cold_start.py [--rounds 3] [--workers N] [--mode compiled|loop]
                                        [--bundle DIR]

--workers sets CATBP_JIT_COMPILE_WORKERS for the runs (default: the environment's, else
one per CPU; 0: compile in the command's own process).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "grid3_d2__prob_float64"
COMPILED_RE = re.compile(r"compiled in ([0-9.]+) s: .*\(cache: (\d+) hits, (\d+) misses\)")


def timed(cmd, env):
    """(wall seconds, stdout) of one new process; exits on failure."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"cold_start: {' '.join(map(str, cmd))} failed ({proc.returncode}):\n"
                 f"{proc.stderr[-2000:]}")
    return wall, proc.stdout


def run_command(bundle, mode, env):
    wall, out = timed([sys.executable, "-m", "catbp_jit", "run", str(bundle), "--mode", mode,
                       "--repeat", "1"], env)
    m = COMPILED_RE.search(out)
    if m is None:
        sys.exit(f"cold_start: no 'compiled in' line in the command's output:\n{out}")
    return wall, float(m.group(1)), int(m.group(2)), int(m.group(3))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--mode", choices=("compiled", "loop"), default="compiled")
    ap.add_argument("--bundle", default=str(EXAMPLE))
    args = ap.parse_args(argv)

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.pop("CATBP_JIT_CACHE", None)  # the default policy: compile on a miss
    if args.workers is not None:
        env["CATBP_JIT_COMPILE_WORKERS"] = str(args.workers)
    workers = env.get("CATBP_JIT_COMPILE_WORKERS", "default (one per CPU)")
    print(f"# cold start: catbp-jit run {Path(args.bundle).name} --mode {args.mode}")
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, compile workers {workers}")
    print()
    print("| round | import s | cold s | cold compile s | misses | warm s | warm compile s | hits |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for r in range(args.rounds):
        imp, _ = timed([sys.executable, "-c", "import catbp_jit"], env)
        cache_dir = tempfile.mkdtemp(prefix="catbp_cold_")
        try:
            env["CATBP_JIT_CACHE_DIR"] = cache_dir
            cold, cold_c, _, misses = run_command(args.bundle, args.mode, env)
            warm, warm_c, hits, _ = run_command(args.bundle, args.mode, env)
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)
        rows.append((imp, cold, cold_c, warm, warm_c))
        print(f"| {r + 1} | {imp:.2f} | {cold:.2f} | {cold_c:.2f} | {misses} | {warm:.2f} | "
              f"{warm_c:.2f} | {hits} |", flush=True)
    med = [statistics.median(col) for col in zip(*rows)]
    print(f"| median | {med[0]:.2f} | {med[1]:.2f} | {med[2]:.2f} | | {med[3]:.2f} | {med[4]:.2f} | |")
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
