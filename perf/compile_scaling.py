"""Compile time against program length: MARKOV chains of 10^3, 10^4, 10^5 binary variables.

    python perf/compile_scaling.py [--sizes 1000,10000,100000] [--tiers compiled,auto]

Each chain (`2 i-1 i` pairwise factors, UAI format, as in issue 24) is solved in a child
process, `compile_model` then `solve`, and the stages are read off the progress lines'
times:

    read        reading the .uai file
    front end   the plan of the model (elimination order, trees) and its programs
    plan        compile()'s planning up to lowering: adapt, validate, graph, fusion, memory
    schedule    lowering the segments to kernel rows (plan/schedule.py)
    kernels     loading (or compiling) the kernels, binding
    answer      the first solve; `total` is the whole, from reading the file

Tier "compiled" (CATBP_JIT_TIER=compiled) waits for the kernels, from a cache that the
first, small chain has filled. Tier "auto" starts with an empty kernel cache: the first
answer may come from the numpy tier while workers compile; `ready` is when the kernels
were (exe.wait()).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def write_chain(n: int, path: Path, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    lines = ["MARKOV", str(n), " ".join(["2"] * n), str(n - 1)]
    lines += [f"2 {i - 1} {i}" for i in range(1, n)]
    for _ in range(1, n):
        lines += ["4", " ".join(f"{x:.6f}" for x in rng.uniform(0.1, 1.0, 4))]
    path.write_text("\n".join(lines) + "\n")


def child(path: str, tier: str) -> dict:
    """Solve the chain once in this process; the time of each stage."""
    from catbp_jit.frontend.model import CompiledModel
    from catbp_jit.frontend.uai import read_uai

    t0 = time.perf_counter()
    marks = []  # (seconds since t0, progress line)

    def record(line):
        return marks.append((time.perf_counter() - t0, line))

    graph = read_uai(path)
    t_read = time.perf_counter() - t0
    model = CompiledModel(graph, "prob", absorb_evidence=True, progress=record)
    t_model = time.perf_counter() - t0
    log_z = model.solve().log_Z
    t_answer = time.perf_counter() - t0

    def first(test, default):
        return next((t for t, line in marks if test(line)), default)

    t_front = first(lambda line: line.startswith("compiling "), t_model)
    t_lower = first(lambda line: line.startswith("planning: lowering"), t_front)
    t_kernels = next((t for t, line in marks if t > t_lower and not line.startswith("planning")), t_model)
    out = {
        "read": t_read,
        "front end": t_front - t_read,
        "plan": t_lower - t_front,
        "schedule": t_kernels - t_lower,
        "kernels": t_model - t_kernels,
        "answer": t_answer - t_model,
        "total": t_answer,
        "log_Z": log_z,
        "tier": model.executable.tier,
    }
    if tier == "auto":
        model.executable.wait()
        out["ready"] = time.perf_counter() - t0
    return out


def run_child(n: int, path: Path, tier: str, cache_dir: str, timeout: float) -> dict:
    # a cache of its own, signed with a key of its own (not the user's)
    env = dict(
        os.environ,
        CATBP_JIT_TIER=tier,
        CATBP_JIT_CACHE_DIR=cache_dir,
        CATBP_JIT_KEY_FILE=os.path.join(os.path.dirname(cache_dir), "cache.key"),
    )
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--child", str(path), "--tier", tier],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout:.0f} s"}
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])


COLUMNS = ("read", "front end", "plan", "schedule", "kernels", "answer", "total", "ready")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--tiers", default="compiled,auto")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per child")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--tier", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.tier)))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        warm = os.path.join(tmp, "warm")
        print(f"{'n':>7} {'tier':>8} " + " ".join(f"{c:>9}" for c in COLUMNS) + "  (seconds)")
        for tier in args.tiers.split(","):
            if tier == "compiled":  # fill the cache first: a compile then loads its kernels
                write_chain(20, Path(tmp) / "warmup.uai")
                run_child(20, Path(tmp) / "warmup.uai", "compiled", warm, args.timeout)
            for n in sizes:
                path = Path(tmp) / f"chain{n}.uai"
                if not path.exists():
                    write_chain(n, path)
                cache = warm if tier == "compiled" else os.path.join(tmp, f"cold{n}")
                r = run_child(n, path, tier, cache, args.timeout)
                if "error" in r:
                    print(f"{n:>7} {tier:>8} {r['error']}", flush=True)
                    continue
                cells = " ".join(f"{r[c]:9.2f}" if c in r else f"{'':>9}" for c in COLUMNS)
                print(f"{n:>7} {tier:>8} {cells}  answered by {r['tier']}", flush=True)


if __name__ == "__main__":
    main()
