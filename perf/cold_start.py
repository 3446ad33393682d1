"""Cold start of README command 1's example (examples/grid3_d2__prob_float64), in tiers.

Each round runs in new processes, with CATBP_JIT_CACHE_DIR a new empty directory:
  import      `python -c "import catbp_jit"`: the interpreter, numpy and Numba loading;
  cold        compile() with tier "auto" and a first run: the numpy tier's answer, while
              the kernels compile in worker processes; then its per-run time, the time
              until the kernels are in place (exe.wait()) and the compiled per-run time;
  warm        the same in a new process on the now warm cache (no numpy tier: every
              kernel loads from disk).
Times are seconds after `import catbp_jit` returned (the import itself is its own column).
They vary with the machine's load: the header records the load average, and only rounds
of one run of this script compare.

    .venv/bin/python perf/cold_start.py [--rounds 3] [--workers N] [--mode compiled|loop]
                                        [--bundle DIR]

--workers sets CATBP_JIT_COMPILE_WORKERS (default: the environment's, else one per CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "grid3_d2__prob_float64"

# One measured start, in a new process: prints one JSON line.
CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import catbp_jit as cj
from catbp_jit.bundle import load_bundle
t_import = time.perf_counter()
b = load_bundle(sys.argv[1])
exe = cj.compile(b.programs, b.semiring_runtime(), factor_specs=b.factor_specs(),
                 selector_specs=b.selector_specs(), mode=sys.argv[2], tier="auto")
sess = exe.bind()
f = {i: a for i, (a, _) in b.factors.items()}
s = {i: a for i, (a, _) in b.selectors.items()}
z = float(sess.run(factors=f, selectors=s)[("Z",)][0])
first = time.perf_counter() - t_import
tier = exe.tier

def per_run(n=20):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        sess.run()
        times.append(time.perf_counter() - t)
    return sorted(times)[n // 2]

numpy_run = per_run() if tier == "numpy" else None
exe.wait()
compiled = time.perf_counter() - t_import
compiled_run = per_run()
assert float(sess.run()[("Z",)][0]) == z  # the same bits in both tiers
print(json.dumps({"import": t_import - t0, "first": first, "tier": tier, "numpy_run": numpy_run,
                  "compiled": compiled, "compiled_run": compiled_run,
                  "kernels": len(exe.kernels), "cache": exe.stats()["cache"]}))
"""


def child(bundle: str, mode: str, env: dict) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, bundle, mode], env=env, capture_output=True, text=True, cwd=REPO
    )
    if proc.returncode != 0:
        sys.exit(f"cold_start: the measured process failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ms(x) -> str:
    return "-" if x is None else f"{x * 1e3:.3f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--mode", choices=("compiled", "loop"), default="compiled")
    ap.add_argument("--bundle", default=str(EXAMPLE))
    args = ap.parse_args(argv)

    env = dict(os.environ)
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + rest)
    env.pop("CATBP_JIT_CACHE", None)  # the default policy: compile on a miss
    env.pop("CATBP_JIT_TIER", None)
    if args.workers is not None:
        env["CATBP_JIT_COMPILE_WORKERS"] = str(args.workers)
    workers = env.get("CATBP_JIT_COMPILE_WORKERS", "default (one per CPU)")
    print(f"# cold start: {Path(args.bundle).name}, mode {args.mode}")
    print(
        f"python {platform.python_version()}, {os.cpu_count()} CPUs, load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, compile workers {workers}"
    )
    print()
    print(
        "| round | import s | first answer s (tier) | numpy run ms | compiled s | compiled run ms "
        "| units compiled | warm: first answer s (tier) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for r in range(args.rounds):
        cache_dir = tempfile.mkdtemp(prefix="catbp_cold_")
        try:
            env["CATBP_JIT_CACHE_DIR"] = cache_dir
            cold = child(args.bundle, args.mode, env)
            time.sleep(1.0)  # the workers' interpreters shut down
            warm = child(args.bundle, args.mode, env)
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)
        rows.append((cold["import"], cold["first"], cold["compiled"], warm["first"]))
        units = cold["cache"].get("compiled_in_background", cold["cache"].get("misses", 0))
        print(
            f"| {r + 1} | {cold['import']:.2f} | {cold['first']:.2f} ({cold['tier']}) | "
            f"{ms(cold['numpy_run'])} | {cold['compiled']:.2f} | {ms(cold['compiled_run'])} | "
            f"{units} | {warm['first']:.2f} ({warm['tier']}) |",
            flush=True,
        )
    med = [statistics.median(col) for col in zip(*rows)]
    print(f"| median | {med[0]:.2f} | {med[1]:.2f} | | {med[2]:.2f} | | | {med[3]:.2f} |")
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
