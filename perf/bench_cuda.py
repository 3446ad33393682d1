"""Benchmark the CUDA target against the CPU target, in one process (issue 11).

Four tables, every row timing the same work on target "cpu" (compiled mode) and on
target "cuda", and checking that both give the same answers:

1. Bundles: every bundle of ../shared/corpus and ../shared/bench (`--only`, `--bundles`);
   on the GPU in both modes: "compiled" (the default: one launch of the schedule kernel,
   which walks every step on the device) and "loop" (each step's kernels launched from
   Python).
2. Batched bundles: a few bench bundles (`--batch-bundles`, which may name corpus ones
   too) with their first factor batched, in batches of `--batches` rows (the executor
   alone).
3. Networks: bnlearn networks (`--networks`), `compile_model(..., evidence_vars=E,
   absorb_evidence=True, buckets=...).solve_batch(rows)` in batches of `--batches` rows of
   evidence (as perf/bench_batch.py).
4. UAI 2014: the MAR instances of ../shared/uai2014/problems (`--uai`), `compile_model(
   graph, "prob", evidence_vars=E, absorb_evidence=True).solve(evidence)` with each
   instance's evidence, on a contraction tree or a junction tree (whichever the plan
   chose).

Prints the tables as Markdown and writes them to <out>/bench_cuda.md and <out>/bench_cuda.csv.
Without numba-cuda or a usable GPU, target "cuda" raises CudaUnavailableError: the output
then says "GPU rows skipped: <reason>" once, the CPU columns are still measured, and the
exit status is 0 (1 only when a check fails or a row errs).

How to run (from the repository root; on a GPU machine numba-cuda must be installed,
`pip install -e '.[cuda]'`):

    export CATBP_JIT_CACHE_DIR=/tmp/cjc        # optional: a persistent kernel cache
    .venv/bin/python perf/bench_cuda.py [--shared DIR] [--only bench|corpus]
        [--bundles NAME ...] [--batch-bundles NAME ...] [--networks alarm,water]
        [--batches 1,64,1024,16384] [--observed 3] [--budget S] [--quick]
        [--uai NAME ...] [--batch-mib 512] [--mode default|exact|reassociating]
        [--out perf/out] [--simulate]
    .venv/bin/python perf/bench_cuda.py --simulate --quick    # a smoke run without a GPU

--shared defaults to $CATBP_SHARED_DIR, else <repo>/../shared. --bundles and
--batch-bundles keep the bundles whose name contains one of the given strings, --uai the
instances whose directory name does (an empty --bundles, --batch-bundles or --uai, or
--networks '', skips that table). --uai defaults to every instance, to none with --quick
or under the simulator. --simulate sets NUMBA_ENABLE_CUDASIM=1 before numba is imported,
so the CUDA kernels run in Numba's simulator (Python, one thread at a time): its times
mean nothing, and unless told otherwise it takes tiny settings (a few corpus bundles, one
batched corpus bundle, batches 1 and 4, the network asia, no UAI instance: the smallest
takes minutes there).

How things are measured:
* compile: `catbp_jit.compile(...)` (or `compile_model`) timed as is; the time depends on
  the kernel cache's state (its misses in brackets). A GPU kernel's cache identity holds
  the device, so the first run on a machine compiles every CUDA kernel.
* bundles: bind, one warm-up run, then the median of runs of
  `sess.run(factors=..., selectors=...)` (inputs copied in every run) and of `sess.run()`
  (inputs already bound), each followed by reading every slot: a CUDA session copies a
  slot back when it is read, which waits for the kernels, so the time is the whole
  round trip (launches are asynchronous: timing sess.run() alone would time the launches).
  Runs: as many as fit in --budget seconds (1.0; 0.2 with --quick), at least 3 (1 under
  the simulator), at most 5000. Then the same bundle compiled in mode "loop" on the GPU:
  one warm-up, the median of `sess.run()` + reading every slot, as above.
* batched bundles: rows of the first factor perturbed (PROB: times a uniform in [0.5,
  1.5); LOGPROB: plus its log; others repeated), bound once, then for every batch size n
  one warm-up run and the median time of `sess.run(factors={fid: rows[:n]})`, which
  reads every slot back (one timed run after a warm-up over the budget).
  The buckets are the batch sizes whose plan fits in --batch-mib MiB (the largest
  first dropped until it does): a larger batch runs in chunks of the largest bucket. A
  batch size whose results (n rows of every batched slot, copied once to compare) would
  need more than --batch-mib twice over is skipped, and listed as such.
* networks: K observed variables (--observed, default 3), rows of them by ancestral
  sampling (seeded, as bench_batch.py), the time of `solve_batch(rows[:n])`: Z and every
  posterior of n rows, answers on the host. The model's buckets are the batch sizes,
  those it keeps (CompiledModel.batch_buckets: their beliefs fit in 512 MiB) and those
  that fit in memory.
* UAI instances: load (perf/uai2014.py's load_instance), compile_model (the plan search
  included: the CPU's compile searches, the GPU's finds that plan in the plan cache),
  one first solve (it also runs the segments that depend on no evidence; an instance
  without evidence is compiled without partial evaluation, as perf/bench_uai.py), then
  the median of `model.solve(evidence)` runs within the budget (one after a first solve
  over it). A plan refused (too large for the limits or memory) makes the row "refused".
* mode (--mode): "default" compiles bundles in exact mode and models in each target's
  default (compile_model: reassociating on the CPU, exact on the GPU); "exact" or
  "reassociating" compiles everything so on both targets. A reassociating plan is the
  target's own (GEMM steps on the CPU, split reductions on the GPU), so its answers are
  compared within tolerance, as are those of two targets that ran different modes.
* check: every slot (bundles) or answer (log Z and every posterior, networks and UAI
  instances) of the GPU equals the CPU's: bit for bit for PROB, SAT, COUNT and MAXLOG where both
  ran the same sums (the kernels add in the same order), within catbp_jit.cli.compare_slot's rtol 1e-9 (1e-5
  for float32) for LOGPROB (exp and log differ between libdevice and libm). A bundle's
  per-step GPU slots must equal its one-launch GPU slots bit for bit in every semiring
  (the same kernels in the same order). "FAIL" otherwise, "cpu only" when the GPU rows
  are skipped, "refused" when compile_model refused the plan, "ERROR" when a row raised.

Columns (GPU columns "-" when skipped):
    bundle / name    bundle directory, network or UAI instance
    steps            steps in the CPU schedule (UAI: the CPU model's)
    compile cpu/gpu  compile time per target (kernel-cache misses)
    run(inputs)      median time of run(factors, selectors) + reading every slot
    run()            median time of run() + reading every slot
    gpu/cpu          GPU time / CPU time (below 1: the GPU is faster)
    launches         GPU kernel launches per run in mode compiled (1: the schedule
                     kernel; UAI: launch_count of the model's schedule)
    run() per-step gpu   median time of run() + reading every slot in mode loop
    one launch / per step   run() gpu / run() per-step gpu (below 1: the single launch
                     is faster)
    per-step launches    GPU kernel launches per run in mode loop (one per step, one
                     more per step that normalizes)
    plan kind        the UAI model's programs: contraction (tree) or junction (tree)
    solve cpu/gpu    median time of model.solve(evidence), answers on the host
    batched          the batched factor (bundles) or the observed variables (networks)
    rows             rows per batch (n)
    batch cpu/gpu    median time of one batch of n rows (*: one timed run, longer than
                     the budget)
    row cpu/gpu      batch time / n
    q/s cpu/gpu      rows per second (n / batch time)
    check            ok, FAIL (first differences in the problems list), cpu only,
                     refused, ERROR

The CSV has the same rows with a `part` column (bundle, batched, network, uai), times in
seconds, unformatted, and the times of the UAI models' first solves (cpu_first_s,
gpu_first_s). As for bench.py, the header records the machine, the GPU, the
versions and the load average: timings are only comparable within one run.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # perf/common.py
# (common does not import numba: NUMBA_ENABLE_CUDASIM is still to be decided)
from common import (  # noqa: E402
    HERE,
    cpu_model,
    default_shared_dir,
    find_bundles,
    fmt_ratio,
    fmt_time,
    load_average,
    sample_rows,
    time_runs,
    write_report,
)

# imports numba, which reads NUMBA_ENABLE_CUDASIM (--simulate) once, when first imported

BATCHES = (1, 64, 1024, 16384)
NETWORKS = ("alarm", "hailfinder", "win95pts", "pathfinder", "water")
BATCH_BUNDLES = ("chain200_d2__prob", "grid4x8_d2__prob", "grid6_d2__prob")
OBSERVED = 3
BATCH_MIB = 512

BUDGET_S = 1.0
QUICK_BUDGET_S = 0.2
MIN_RUNS = 3
MAX_RUNS = 5000

# the simulator runs every GPU thread as Python: tiny settings unless told otherwise
SIM_BUNDLES = ("z4_cycle__prob_float64", "grid3_d2__logprob_float64", "chain8__sat_bool")
SIM_BATCH_BUNDLES = ("z4_cycle__count_int64",)
SIM_BATCHES = (1, 4)
SIM_NETWORKS = ("asia",)

EXACT_SEMIRINGS = ("PROB", "SAT", "COUNT", "MAXLOG")  # no exp or log: the same bits on a GPU

BUNDLE_COLUMNS = (
    "bundle",
    "steps",
    "compile cpu",
    "compile gpu",
    "run(inputs) cpu",
    "run(inputs) gpu",
    "gpu/cpu",
    "run() cpu",
    "run() gpu",
    "gpu/cpu",
    "launches",
    "run() per-step gpu",
    "one launch / per step",
    "per-step launches",
    "check",
)
UAI_COLUMNS = (
    "name",
    "plan kind",
    "steps",
    "compile cpu",
    "compile gpu",
    "solve cpu",
    "solve gpu",
    "gpu/cpu",
    "launches",
    "check",
)
BATCH_COLUMNS = (
    "name",
    "batched",
    "buckets",
    "compile cpu",
    "compile gpu",
    "rows",
    "batch cpu",
    "batch gpu",
    "row cpu",
    "row gpu",
    "q/s cpu",
    "q/s gpu",
    "gpu/cpu",
    "check",
)
CSV_COLUMNS = (
    "part",
    "group",
    "name",
    "semiring",
    "dtype",
    "steps",
    "batched",
    "buckets",
    "rows",
    "cpu_compile_s",
    "cpu_cache_misses",
    "gpu_compile_s",
    "gpu_cache_misses",
    "cpu_inputs_s",
    "cpu_inputs_runs",
    "gpu_inputs_s",
    "gpu_inputs_runs",
    "ratio_inputs",
    "cpu_bound_s",
    "cpu_bound_runs",
    "gpu_bound_s",
    "gpu_bound_runs",
    "ratio_bound",
    "gpu_launches",
    "gpu_loop_compile_s",
    "gpu_loop_bound_s",
    "gpu_loop_bound_runs",
    "ratio_launch",
    "gpu_loop_launches",
    "plan_kind",
    "cpu_first_s",
    "gpu_first_s",
    "cpu_solve_s",
    "cpu_solve_runs",
    "gpu_solve_s",
    "gpu_solve_runs",
    "ratio_solve",
    "cpu_batch_s",
    "cpu_batch_runs",
    "gpu_batch_s",
    "gpu_batch_runs",
    "ratio_batch",
    "cpu_row_s",
    "gpu_row_s",
    "cpu_rows_per_s",
    "gpu_rows_per_s",
    "check",
    "detail",
)


# ---------------------------------------------------------------------------------------
# The GPU, or why there is none


def gpu_status():
    """(None, a description of the device) when target "cuda" can run here, else (the
    reason it cannot, None)."""
    from numba import config

    from catbp_jit.codegen.cuda_build import cuda_module
    from catbp_jit.errors import CudaUnavailableError

    try:
        cuda = cuda_module()
    except CudaUnavailableError as e:
        return str(e), None
    if config.ENABLE_CUDASIM:
        return None, "Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1): GPU times mean nothing"
    try:
        dev = cuda.get_current_device()
    except Exception as e:  # a driver that loads but gives no device
        return f"no CUDA device can be used ({e!r})", None
    name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    major, minor = dev.compute_capability
    return None, f"{name} (sm_{major}{minor})"


# ---------------------------------------------------------------------------------------
# Checking


def compare_results(
    cpu: dict, gpu: dict, semiring: str, dtype, exact: bool = False, bits: bool = True
) -> list:
    """Problems (text) where the GPU's arrays differ from the CPU's: bit for bit for the
    exact semirings (every semiring with exact=True), compare_slot's tolerance for LOGPROB
    and wherever the two did not run the same sums (bits=False: plans in reassociating
    mode, which differ by target)."""
    from catbp_jit.cli import compare_slot

    problems = [f"{key!r}: missing on the GPU" for key in cpu if key not in gpu]
    problems += [f"{key!r}: not on the CPU" for key in gpu if key not in cpu]
    for key in cpu.keys() & gpu.keys():
        want, got = np.asarray(cpu[key]), np.asarray(gpu[key])
        if exact or (bits and semiring in EXACT_SEMIRINGS):
            if want.dtype != got.dtype or want.shape != got.shape:
                problems.append(
                    f"{key!r}: {got.dtype}{list(got.shape)} on the GPU, "
                    f"{want.dtype}{list(want.shape)} on the CPU"
                )
            else:
                differ = want != got
                if want.dtype.kind in "fc":  # NaN on both sides is the same answer
                    differ &= ~(np.isnan(want) & np.isnan(got))
                if differ.any():
                    problems.append(f"{key!r}: {int(np.count_nonzero(differ))} of {want.size} entries differ")
        else:
            reason = compare_slot(got, want, dtype)
            if reason is not None:
                problems.append(f"{key!r}: {reason}")
    return sorted(problems)


def say_row(row: dict) -> None:
    """One line on stderr as soon as a row is measured: a run cut short (a device lent for
    minutes) still shows what it got."""
    kind = {"bundle": "bound", "batched": "batch", "network": "batch", "uai": "solve"}[row["part"]]
    cpu, gpu = row.get(f"cpu_{kind}_s"), row.get(f"gpu_{kind}_s")
    rows = f" x{row['rows']}" if "rows" in row else ""
    times = f"cpu {fmt_time(cpu)}, gpu {fmt_time(gpu)}" + (
        f" (gpu/cpu {gpu / cpu:.3g})" if cpu and gpu else ""
    )
    print(
        f"    = {row['name']}{rows}: {times}; {row['check']} {row.get('detail', '')}"[:400],
        file=sys.stderr,
        flush=True,
    )


def verdict(problems: list, row: dict) -> None:
    row["check"] = "FAIL" if problems else "ok"
    row["detail"] = "; ".join(problems[:3]) + (f"; ... {len(problems) - 3} more" if len(problems) > 3 else "")


def snapshot(slots) -> dict:
    """Every slot's array, copied (a session's views change at its next run); reading a
    CUDA session's slot copies it back from the device."""
    return {key: np.array(slots[key][0], copy=True) for key in slots}


def read_all(slots) -> None:
    """Read every slot: a CUDA session copies each back, waiting for the kernels."""
    for key in slots:
        slots[key]


# ---------------------------------------------------------------------------------------
# Part 1: bundles


def exact_of(args):
    """compile()'s and compile_model()'s `exact` for --mode: None (each target's own
    default), True or False."""
    return {"default": None, "exact": True, "reassociating": False}[args.mode]


def compile_bundle(bundle, target: str, mode: str = "compiled", exact=None):
    """(executable, compile seconds) of one bundle."""
    from catbp_jit.compiler import compile

    t0 = time.perf_counter()
    exe = compile(
        bundle.programs,
        bundle.semiring_runtime(),
        factor_specs=bundle.factor_specs(),
        selector_specs=bundle.selector_specs(),
        target=target,
        mode=mode,
        **({} if exact is None else {"exact": exact}),
    )
    return exe, time.perf_counter() - t0


def bench_bundle_target(bundle, target: str, args) -> tuple:
    """(measurements, slots after the last run) of one bundle on one target."""
    factors = {fid: arr for fid, (arr, _) in bundle.factors.items()}
    selectors = {sid: arr for sid, (arr, _) in bundle.selectors.items()}
    exe, compile_s = compile_bundle(bundle, target, exact=exact_of(args))
    sess = exe.bind()
    read_all(sess.run(factors=factors, selectors=selectors))  # warm-up

    def run_inputs():
        read_all(sess.run(factors=factors, selectors=selectors))

    def run_bound():
        read_all(sess.run())

    inputs_s, inputs_runs, _ = time_runs(run_inputs, args.min_runs, MAX_RUNS, args.budget)
    bound_s, bound_runs, _ = time_runs(run_bound, args.min_runs, MAX_RUNS, args.budget)
    t = "cpu" if target == "cpu" else "gpu"
    part = {
        "steps": len(exe.schedule.steps),
        f"{t}_compile_s": compile_s,
        f"{t}_cache_misses": exe.cache_stats.get("misses", 0),
        f"{t}_inputs_s": inputs_s,
        f"{t}_inputs_runs": inputs_runs,
        f"{t}_bound_s": bound_s,
        f"{t}_bound_runs": bound_runs,
    }
    if target == "cuda":
        part["gpu_launches"] = sess.launches_per_run
    return part, snapshot(sess.slots)


def bench_bundle_per_step(bundle, args) -> tuple:
    """(measurements, slots after the last run) of one bundle on the GPU in mode "loop":
    every step's kernels launched from Python, run() timed as bench_bundle_target does."""
    factors = {fid: arr for fid, (arr, _) in bundle.factors.items()}
    selectors = {sid: arr for sid, (arr, _) in bundle.selectors.items()}
    exe, compile_s = compile_bundle(bundle, "cuda", mode="loop", exact=exact_of(args))
    sess = exe.bind()
    read_all(sess.run(factors=factors, selectors=selectors))  # binds the inputs; warm-up

    def run_bound():
        read_all(sess.run())

    bound_s, bound_runs, _ = time_runs(run_bound, args.min_runs, MAX_RUNS, args.budget)
    return (
        {
            "gpu_loop_compile_s": compile_s,
            "gpu_loop_bound_s": bound_s,
            "gpu_loop_bound_runs": bound_runs,
            "gpu_loop_launches": sess.launches_per_run,
        },
        snapshot(sess.slots),
    )


def bench_bundles(bundles, args, gpu: bool) -> list:
    from catbp_jit.bundle import load_bundle

    rows = []
    for group, path in bundles:
        bundle = load_bundle(path)
        row = {
            "part": "bundle",
            "group": group,
            "name": path.name,
            "semiring": bundle.semiring,
            "dtype": bundle.dtype.name,
            "check": "cpu only",
            "detail": "",
        }
        rows.append(row)
        try:
            print(f"... {group}/{path.name}: cpu", file=sys.stderr, flush=True)
            cpu_part, cpu_slots = bench_bundle_target(bundle, "cpu", args)
            row.update(cpu_part)
            if gpu:
                print(f"... {group}/{path.name}: cuda", file=sys.stderr, flush=True)
                gpu_part, gpu_slots = bench_bundle_target(bundle, "cuda", args)
                row.update(gpu_part)
                row["ratio_inputs"] = row["gpu_inputs_s"] / row["cpu_inputs_s"]
                row["ratio_bound"] = row["gpu_bound_s"] / row["cpu_bound_s"]
                # (a bundle compiles in exact mode unless told: the same sums on both)
                same = exact_of(args) is not False
                problems = compare_results(cpu_slots, gpu_slots, bundle.semiring, bundle.dtype, bits=same)
                print(f"... {group}/{path.name}: cuda, per step", file=sys.stderr, flush=True)
                loop_part, loop_slots = bench_bundle_per_step(bundle, args)
                row.update(loop_part)
                row["ratio_launch"] = row["gpu_bound_s"] / row["gpu_loop_bound_s"]
                # the same kernels in the same order: the same bits, whatever the semiring
                problems += [
                    f"per step vs one launch: {p}"
                    for p in compare_results(gpu_slots, loop_slots, bundle.semiring, bundle.dtype, exact=True)
                ]
                verdict(problems, row)
        except Exception as e:  # one broken bundle must not stop the table
            row.update(check="ERROR", detail=f"{type(e).__name__}: {e}"[:300])
        say_row(row)
        gc.collect()  # drop the sessions' arenas before the next bundle
    return rows


# ---------------------------------------------------------------------------------------
# Batches: the timing and the rows, shared by batched bundles and networks


def time_batches(run, keep, batches, args) -> dict:
    """n -> (median seconds of run(n), runs, keep(the answers of its warm-up run)): one
    warm-up run of each n first (a new bucket refills its constants and touches its arena
    for the first time), kept to compare. After a warm-up over the budget, one timed run
    (water, 16384 rows: minutes per run on 2 cores)."""

    out = {}
    for n in batches:
        t0 = time.perf_counter()
        answers = keep(run(n))
        min_runs = 1 if time.perf_counter() - t0 > args.budget else args.min_runs
        out[n] = time_runs(partial(run, n), min_runs, MAX_RUNS, args.budget)[:2] + (answers,)
    return out


def batch_rows(base: dict, batches, cpu: dict, gpu, semiring: str, dtype, bits: bool = True) -> list:
    """One row per batch size from the CPU's and (when measured) the GPU's time_batches;
    bits: whether both ran the same sums (see compare_results)."""
    rows = []
    for n in batches:
        row = dict(base, rows=n, check="cpu only", detail="")
        row["cpu_batch_s"], row["cpu_batch_runs"], cpu_answers = cpu[n]
        row["cpu_row_s"], row["cpu_rows_per_s"] = row["cpu_batch_s"] / n, n / row["cpu_batch_s"]
        if gpu is not None:
            row["gpu_batch_s"], row["gpu_batch_runs"], gpu_answers = gpu[n]
            row["gpu_row_s"], row["gpu_rows_per_s"] = row["gpu_batch_s"] / n, n / row["gpu_batch_s"]
            row["ratio_batch"] = row["gpu_batch_s"] / row["cpu_batch_s"]
            verdict(compare_results(cpu_answers, gpu_answers, semiring, dtype, bits=bits), row)
        rows.append(row)
        say_row(row)
    return rows


def fitting(compile_with, batches, what: str):
    """(compiled, its buckets): compile_with(buckets), the largest bucket dropped while
    the plan is refused as too large (a larger batch then runs in chunks)."""
    from catbp_jit.errors import CatbpError

    buckets = sorted(batches)
    while True:
        try:
            return compile_with(tuple(buckets)), tuple(buckets)
        except (CatbpError, MemoryError) as e:
            if len(buckets) == 1:
                raise
            print(
                f"  {what}: buckets {','.join(map(str, buckets))} refused "
                f"({str(e).splitlines()[0][:90]}); without {buckets[-1]}",
                file=sys.stderr,
            )
            buckets.pop()


def error_row(base: dict, e: Exception) -> dict:
    return dict(base, check="ERROR", detail=f"{type(e).__name__}: {e}"[:300])


# ---------------------------------------------------------------------------------------
# Part 2: batched bundles


def perturbed_rows(base: np.ndarray, n: int, semiring: str, rng) -> np.ndarray:
    """n rows of a factor near its value, valid for the semiring."""
    if semiring == "PROB":
        rows = base[None] * rng.uniform(0.5, 1.5, size=(n,) + base.shape)
    elif semiring in ("LOGPROB", "MAXLOG"):
        rows = base[None] + np.log(rng.uniform(0.5, 1.5, size=(n,) + base.shape))
    else:
        rows = np.repeat(base[None], n, axis=0)
    return np.ascontiguousarray(rows, dtype=base.dtype)


def bench_batched_bundle(bundle, group: str, name: str, args, gpu: bool) -> list:
    from catbp_jit.compiler import compile

    dtype = bundle.dtype
    factors = {f: np.ascontiguousarray(a, dtype=dtype) for f, (a, _) in bundle.factors.items()}
    selectors = {s: np.ascontiguousarray(a, dtype=dtype) for s, (a, _) in bundle.selectors.items()}
    fid = min(factors)
    table = perturbed_rows(factors[fid], max(args.batches), bundle.semiring, np.random.default_rng(0))
    base = {
        "part": "batched",
        "group": group,
        "name": name,
        "semiring": bundle.semiring,
        "dtype": dtype.name,
        "batched": f"factor {fid}",
    }

    def session(target: str, buckets):
        def compile_with(bs):
            return compile(
                bundle.programs,
                bundle.semiring_runtime(),
                factor_specs=bundle.factor_specs(),
                selector_specs=bundle.selector_specs(),
                target=target,
                batched_factors={fid},
                buckets=bs,
                max_total_bytes=args.batch_bytes,
            )

        t0 = time.perf_counter()
        exe, buckets = fitting(compile_with, buckets, f"{name} ({target})")
        compile_s = time.perf_counter() - t0
        sess = exe.bind()
        sess.run(factors={**factors, fid: table[:1]}, selectors=selectors)  # binds the rest
        return sess, compile_s, buckets

    def timed(sess, batches):
        def run(n):  # (a batched CUDA session reads every slot back)
            return sess.run(factors={fid: table[:n]})

        return time_batches(run, snapshot, batches, args)

    print(f"... {group}/{name} batched: cpu", file=sys.stderr, flush=True)
    sess, cpu_compile_s, buckets = session("cpu", args.batches)
    # a batch past the largest bucket gets result arrays of its own, and every batch's
    # results are copied to compare: n rows of every batched slot, twice
    row_bytes = dtype.itemsize * sum(int(np.prod(sess.slot_specs[k].shape)) for k in sess.batched_slots)
    batches = [n for n in args.batches if 2 * n * row_bytes <= args.batch_bytes]
    base.update(buckets=",".join(map(str, buckets)), cpu_compile_s=cpu_compile_s)
    cpu = timed(sess, batches)
    result = None
    if gpu:
        print(f"... {group}/{name} batched: cuda", file=sys.stderr, flush=True)
        sess = None  # (the CPU session's arena goes first)
        sess, base["gpu_compile_s"], _ = session("cuda", buckets)  # the CPU's buckets
        result = timed(sess, batches)
    skipped = [
        dict(
            base,
            rows=n,
            check="skipped",
            detail=f"{n} rows of results, copied, need {2 * n * row_bytes / 2**20:.0f} "
            f"MiB, over --batch-mib {args.batch_mib}",
        )
        for n in args.batches
        if n not in batches
    ]
    return batch_rows(base, batches, cpu, result, bundle.semiring, dtype) + skipped


def bench_batched_bundles(bundles, args, gpu: bool) -> list:
    from catbp_jit.bundle import load_bundle

    rows = []
    for group, path in bundles:
        try:
            rows += bench_batched_bundle(load_bundle(path), group, path.name, args, gpu)
        except Exception as e:
            rows.append(error_row({"part": "batched", "group": group, "name": path.name}, e))
        gc.collect()
    return rows


# ---------------------------------------------------------------------------------------
# Part 3: networks


def answers_of(solution) -> dict:
    """A Solution or BatchSolution as arrays to compare: log Z and every posterior."""
    out = {("log_Z",): solution.log_Z}
    out.update({("marg", v): m for v, m in solution.marginals.items()})
    return out


def bench_network(name: str, args, gpu: bool) -> list:
    from catbp_jit.frontend import compile_model
    from catbp_jit.frontend.bnlearn import load_network

    graph = load_network(name)
    sample = sample_rows(graph, max(args.batches), seed=1)
    rng = np.random.default_rng(2)  # the evidence variables, drawn as bench_batch.py does
    k = min(args.observed, len(graph.names))
    ev = [graph.names[i] for i in sorted(rng.choice(len(graph.names), size=k, replace=False))]
    table = np.stack([sample[v] for v in ev], axis=1)
    base = {
        "part": "network",
        "name": name,
        "semiring": "PROB",
        "dtype": "float64",
        "batched": f"{k} observed",
    }

    def measure(target: str, buckets=None):
        def compile_with(bs):
            return compile_model(
                graph,
                "prob",
                evidence_vars=ev,
                absorb_evidence=True,
                buckets=bs,
                target=target,
                exact=exact_of(args),
            )

        t0 = time.perf_counter()
        model, _ = fitting(compile_with, buckets or args.batches, f"{name} ({target})")
        compile_s = time.perf_counter() - t0

        def run(n):
            return model.solve_batch(table[:n])

        modes.append(model.exact)
        return time_batches(run, answers_of, args.batches, args), compile_s, model.batch_buckets()

    modes: list = []  # each target's model's `exact`
    print(f"... network {name}: cpu", file=sys.stderr, flush=True)
    cpu, cpu_compile_s, buckets = measure("cpu")
    base.update(buckets=",".join(map(str, buckets)), cpu_compile_s=cpu_compile_s)
    result = None
    if gpu:
        print(f"... network {name}: cuda", file=sys.stderr, flush=True)
        result, base["gpu_compile_s"], _ = measure("cuda", buckets)  # the CPU's buckets
    base["mode"] = "/".join("exact" if e else "reassociating" for e in modes)
    return batch_rows(base, args.batches, cpu, result, "PROB", np.dtype(np.float64), bits=all(modes))


def bench_networks(names, args, gpu: bool) -> list:
    rows = []
    for name in names:
        try:
            rows += bench_network(name, args, gpu)
        except Exception as e:
            rows.append(error_row({"part": "network", "name": name}, e))
        gc.collect()
    return rows


# ---------------------------------------------------------------------------------------
# Part 4: UAI 2014 instances (MAR)


def find_uai_instances(shared: Path, names) -> list:
    """<shared>/uai2014/problems/NAME/NAME.uai of every instance whose directory name
    contains one of `names` (every instance when names is None)."""
    root = shared / "uai2014" / "problems"
    if not root.is_dir():
        return []
    found = []
    for d in sorted(root.iterdir()):
        path = d / f"{d.name}.uai"
        if path.is_file() and (names is None or any(n in d.name for n in names)):
            found.append(path)
    return found


def bench_uai_target(graph, evidence: dict, target: str, args):
    """(the model, its measurements, its answers) of one instance on one target; the
    model None (and the measurements a "refused" row's) when compile_model refuses it."""
    from catbp_jit.errors import CatbpError
    from catbp_jit.frontend import compile_model
    from catbp_jit.frontend.graph import FactorGraphError

    t = "cpu" if target == "cpu" else "gpu"
    t0 = time.perf_counter()
    try:
        model = compile_model(
            graph,
            "prob",
            evidence_vars=list(evidence),
            absorb_evidence=True,
            # without evidence every segment would be static and a solve would recompute
            # nothing (as perf/bench_uai.py)
            partial_evaluation=bool(evidence),
            target=target,
            exact=exact_of(args),
        )
    except (FactorGraphError, CatbpError, MemoryError) as e:
        return None, {"check": "refused", "detail": f"{target}: {str(e).splitlines()[0]}"[:300]}, None
    compile_s = time.perf_counter() - t0
    # the first solve also runs the segments that depend on no evidence
    t0 = time.perf_counter()
    model.solve(evidence)
    first_s = time.perf_counter() - t0
    min_runs = 1 if first_s > args.budget else args.min_runs
    solve_s, runs, solution = time_runs(partial(model.solve, evidence), min_runs, MAX_RUNS, args.budget)
    part = {
        f"{t}_compile_s": compile_s,
        f"{t}_cache_misses": model.executable.cache_stats.get("misses", 0),
        f"{t}_first_s": first_s,
        f"{t}_solve_s": solve_s,
        f"{t}_solve_runs": runs,
        f"{t}_mode": "exact" if model.exact else "reassociating",
    }
    # copied: the answers outlive the model
    return model, part, {key: np.array(a, copy=True) for key, a in answers_of(solution).items()}


def plan_of(model) -> tuple:
    """What decides the programs: the same plan gives the same kernels in the same order."""
    return model.plan_kind, model.plan_choice.order, model.plan_choice.path


def bench_uai_instance(path: Path, args, gpu: bool) -> dict:
    from uai2014 import load_instance  # (imports catbp_jit, hence numba)

    row = {"part": "uai", "name": path.stem, "semiring": "PROB", "dtype": "float64"}
    row.update(check="cpu only", detail="")
    graph, evidence, _ = load_instance(path)  # (the competition's MAR: uai2014.py checks it)
    print(f"... uai {path.stem}: cpu", file=sys.stderr, flush=True)
    model, part, cpu_answers = bench_uai_target(graph, evidence, "cpu", args)
    row.update(part)
    if model is None:
        return row
    row.update(plan_kind=model.plan_kind, steps=len(model.executable.schedule.steps))
    cpu_plan = plan_of(model)
    model = None  # (the CPU's arena goes first)
    gc.collect()
    if not gpu:
        return row
    from catbp_jit.codegen.cuda_run import launch_count

    print(f"... uai {path.stem}: cuda", file=sys.stderr, flush=True)
    # the GPU's compile finds the CPU's searched plan in the plan cache
    model, part, gpu_answers = bench_uai_target(graph, evidence, "cuda", args)
    row.update(part)
    if model is None:
        return row
    row["ratio_solve"] = row["gpu_solve_s"] / row["cpu_solve_s"]
    row["gpu_launches"] = launch_count(model.executable.schedule, model.executable.dispatcher is not None)
    # bits where both ran the same plan in exact mode; else within compare_slot's tolerance
    bits = plan_of(model) == cpu_plan and row["cpu_mode"] == row["gpu_mode"] == "exact"
    verdict(compare_results(cpu_answers, gpu_answers, "PROB", np.dtype(np.float64), bits=bits), row)
    return row


def bench_uai(paths, args, gpu: bool) -> list:
    rows = []
    for path in paths:
        try:
            rows.append(bench_uai_instance(path, args, gpu))
            say_row(rows[-1])
        except Exception as e:  # one broken instance must not stop the table
            rows.append(error_row({"part": "uai", "name": path.stem}, e))
        gc.collect()
    return rows


# ---------------------------------------------------------------------------------------
# Formatting


def fmt_compile(row: dict, t: str) -> str:
    s = row.get(f"{t}_compile_s")
    if s is None:
        return "-"
    misses = row.get(f"{t}_cache_misses")
    return f"{s:.2f} s" + (f" ({misses} miss)" if misses is not None else "")


def fmt_rate(x) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}/s" if x >= 10 else f"{x:.2g}/s"


def bundle_line(row: dict) -> list:
    return [
        row["name"],
        str(row.get("steps", "-")),
        fmt_compile(row, "cpu"),
        fmt_compile(row, "gpu"),
        fmt_time(row.get("cpu_inputs_s")),
        fmt_time(row.get("gpu_inputs_s")),
        fmt_ratio(row.get("ratio_inputs")),
        fmt_time(row.get("cpu_bound_s")),
        fmt_time(row.get("gpu_bound_s")),
        fmt_ratio(row.get("ratio_bound")),
        str(row.get("gpu_launches", "-")),
        fmt_time(row.get("gpu_loop_bound_s")),
        fmt_ratio(row.get("ratio_launch")),
        str(row.get("gpu_loop_launches", "-")),
        row["check"],
    ]


def uai_line(row: dict) -> list:
    return [
        row["name"],
        row.get("plan_kind", "-")
        + (f" ({row['cpu_mode']}/{row['gpu_mode']})" if "cpu_mode" in row and "gpu_mode" in row else ""),
        str(row.get("steps", "-")),
        fmt_compile(row, "cpu"),
        fmt_compile(row, "gpu"),
        fmt_time(row.get("cpu_solve_s")),
        fmt_time(row.get("gpu_solve_s")),
        fmt_ratio(row.get("ratio_solve")),
        str(row.get("gpu_launches", "-")),
        row["check"],
    ]


def batch_line(row: dict, first: bool) -> list:
    """A batch row; the model's columns only on its first row."""
    model = (
        [
            row["name"],
            row.get("batched", "-"),
            row.get("buckets", "-"),
            fmt_compile(row, "cpu"),
            fmt_compile(row, "gpu"),
        ]
        if first
        else [""] * 5
    )
    batch = [
        fmt_time(row.get(f"{t}_batch_s")) + ("*" if row.get(f"{t}_batch_runs") == 1 else "")
        for t in ("cpu", "gpu")
    ]
    return model + [
        str(row.get("rows", "-")),
        *batch,
        fmt_time(row.get("cpu_row_s")),
        fmt_time(row.get("gpu_row_s")),
        fmt_rate(row.get("cpu_rows_per_s")),
        fmt_rate(row.get("gpu_rows_per_s")),
        fmt_ratio(row.get("ratio_batch")),
        row["check"],
    ]


def table(columns, lines) -> list:
    return ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"] + [
        "| " + " | ".join(line) + " |" for line in lines
    ]


def batch_table(rows) -> list:
    lines, last = [], None
    for row in rows:
        lines.append(batch_line(row, row["name"] != last))
        last = row["name"]
    once = any(row.get(f"{t}_batch_runs") == 1 for row in rows for t in ("cpu", "gpu"))
    return table(BATCH_COLUMNS, lines) + (
        ["", "\\* one timed run (after a warm-up): it took longer than the budget"] if once else []
    )


def header_lines(args, gpu_line: str, load_at_start: str) -> list:
    import numba

    return [
        "# catbp_jit CUDA benchmark: target cuda against target cpu",
        "",
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"- machine: {platform.machine()}, {cpu_model()}, {os.cpu_count()} CPUs; load "
        f"average {load_at_start} at start, {load_average()} at end (other processes skew "
        f"the timings)",
        f"- {gpu_line}",
        f"- python {platform.python_version()}, numpy {np.__version__}, "
        f"numba {numba.__version__}, numba threads {numba.get_num_threads()}",
        f"- kernel cache: {os.environ.get('CATBP_JIT_CACHE_DIR') or '(default)'}",
        f"- times are medians of at least {args.min_runs} run(s) within {args.budget:.2f} s "
        f"per measurement, each run reading every result back; gpu/cpu = GPU time / CPU "
        f"time" + ("; --quick" if args.quick else ""),
        f"- mode: {args.mode}"
        + (" (bundles exact; models each target's default)" if args.mode == "default" else ""),
    ]


# ---------------------------------------------------------------------------------------


def parse_args(argv):
    """(parser, args), the defaults filled in; imports nothing that imports numba."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shared",
        type=Path,
        default=None,
        help="the shared directory holding bench/ and corpus/ "
        "(default: $CATBP_SHARED_DIR, else <repo>/../shared)",
    )
    parser.add_argument(
        "--only", choices=("bench", "corpus"), help="only the bench or only the corpus bundles"
    )
    parser.add_argument(
        "--bundles",
        nargs="*",
        metavar="NAME",
        help="only bundles whose name contains one of these strings (given empty: no bundle table)",
    )
    parser.add_argument(
        "--batch-bundles",
        nargs="*",
        metavar="NAME",
        help=f"bundles to batch, by name as --bundles (default: "
        f"{', '.join(BATCH_BUNDLES)}; given empty: none)",
    )
    parser.add_argument(
        "--networks", help=f"bnlearn networks, comma-separated (default: {','.join(NETWORKS)}; '' for none)"
    )
    parser.add_argument(
        "--batches", help=f"rows per batch, comma-separated (default: {','.join(map(str, BATCHES))})"
    )
    parser.add_argument(
        "--observed",
        type=int,
        default=OBSERVED,
        help="observed variables per network row (default: %(default)s)",
    )
    parser.add_argument(
        "--mode",
        choices=("default", "exact", "reassociating"),
        default="default",
        help="compile mode on both targets: each target's own default (bundles: exact; "
        "compile_model: reassociating on the CPU, exact on the GPU), exact, or reassociating "
        "(answers then compared within tolerance: the targets' plans differ)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        metavar="S",
        help=f"seconds per measurement (default {BUDGET_S}, {QUICK_BUDGET_S} with --quick)",
    )
    parser.add_argument(
        "--uai",
        nargs="*",
        metavar="NAME",
        help="UAI 2014 instances (<shared>/uai2014/problems) whose name contains one of "
        "these strings (default: every instance; none under the simulator or with --quick; "
        "given empty: none)",
    )
    parser.add_argument("--quick", action="store_true", help="short budgets")
    parser.add_argument(
        "--batch-mib",
        type=int,
        default=BATCH_MIB,
        help="largest arena of a batched bundle's buckets, MiB (default: %(default)s)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=HERE / "out",
        help="where bench_cuda.md and bench_cuda.csv go (default: %(default)s)",
    )
    parser.add_argument(
        "--simulate",
        action="store_true",
        help="run the CUDA kernels in Numba's simulator (NUMBA_ENABLE_CUDASIM=1):"
        " a smoke run without a GPU, tiny defaults, times meaningless",
    )
    args = parser.parse_args(argv)
    sim = args.simulate or os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
    if args.bundles is None and sim:
        args.bundles = list(SIM_BUNDLES)
        args.only = args.only or "corpus"
    if args.batch_bundles is None:
        args.batch_bundles = list(SIM_BATCH_BUNDLES if sim else BATCH_BUNDLES)
    networks = ",".join(SIM_NETWORKS if sim else NETWORKS) if args.networks is None else args.networks
    args.networks = [n for n in networks.split(",") if n]
    if args.uai is None and (sim or args.quick):
        args.uai = []  # (None: every instance)
    batches = args.batches or ",".join(map(str, SIM_BATCHES if sim else BATCHES))
    try:
        args.batches = tuple(int(b) for b in batches.split(",") if b)
    except ValueError:
        parser.error(f"--batches: comma-separated row counts, got {batches!r}")
    if not args.batches or min(args.batches) < 1:
        parser.error(f"--batches: positive row counts, got {batches!r}")
    if args.observed < 1:
        parser.error("--observed: at least 1 (the rows of a batch are evidence rows)")
    if args.budget is None:
        args.budget = QUICK_BUDGET_S if args.quick else BUDGET_S
    args.min_runs = 1 if sim else MIN_RUNS
    args.batch_bytes = args.batch_mib << 20
    return parser, args


def main(argv=None) -> int:
    parser, args = parse_args(argv)
    if args.simulate:
        # numba reads it once, when first imported
        if "numba" in sys.modules and not sys.modules["numba"].config.ENABLE_CUDASIM:
            parser.error(
                "--simulate: numba is already imported without the simulator (run the script as a process)"
            )
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

    args.shared = args.shared or default_shared_dir()
    bundles = find_bundles(args.shared, args.only, args.bundles) if args.bundles != [] else []
    batch_bundles = find_bundles(args.shared, None, args.batch_bundles) if args.batch_bundles else []
    if args.bundles != [] and not bundles:
        parser.error(
            f"no bundles found under {args.shared} (--shared DIR; --bundles with no name skips them)"
        )
    if args.batch_bundles and not batch_bundles:
        parser.error(
            f"no bundles to batch under {args.shared} (--shared DIR; --batch-bundles with no name skips them)"
        )
    uai = find_uai_instances(args.shared, args.uai) if args.uai != [] else []
    if args.uai and not uai:
        parser.error(
            f"no UAI instance matching {' '.join(args.uai)} under {args.shared / 'uai2014' / 'problems'}"
        )
    load_at_start = load_average()
    reason, device = gpu_status()
    gpu_line = f"GPU: {device}" if reason is None else f"GPU rows skipped: {reason}"

    bundle_rows = bench_bundles(bundles, args, reason is None)
    batched_rows = bench_batched_bundles(batch_bundles, args, reason is None)
    network_rows = bench_networks(args.networks, args, reason is None)
    uai_rows = bench_uai(uai, args, reason is None)

    lines = header_lines(args, gpu_line, load_at_start)
    if bundle_rows:
        lines += ["", "## Bundles", ""] + table(BUNDLE_COLUMNS, map(bundle_line, bundle_rows))
    if batched_rows:
        lines += ["", "## Batched bundles (the first factor batched)", ""]
        lines += batch_table(batched_rows)
    if network_rows:
        lines += ["", f"## Networks (solve_batch, {args.observed} observed)", ""]
        lines += batch_table(network_rows)
    if uai_rows:
        lines += ["", "## UAI 2014 (contraction trees / junction trees, MAR)", ""]
        lines += table(UAI_COLUMNS, map(uai_line, uai_rows))
    rows = bundle_rows + batched_rows + network_rows + uai_rows
    problems = [r for r in rows if r["check"] in ("FAIL", "ERROR")]
    if problems:
        lines += ["", "Problems:", ""]
        lines += [
            f"- {r['name']}"
            + (f" (rows {r['rows']})" if "rows" in r else "")
            + f": {r['check']}: {r['detail']}"
            for r in problems
        ]
    skipped = [r for r in rows if r["check"] == "skipped"]
    if skipped:
        lines += ["", "Skipped:", ""] + [f"- {r['name']} (rows {r['rows']}): {r['detail']}" for r in skipped]
    refused = [r for r in rows if r["check"] == "refused"]
    if refused:
        lines += ["", "Refused:", ""] + [f"- {r['name']}: {r['detail']}" for r in refused]
    text = "\n".join(lines) + "\n"

    write_report(args.out, "bench_cuda", text, rows, CSV_COLUMNS)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
