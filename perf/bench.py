"""Benchmark the JIT against the reference interpreter, bundle by bundle (perf/README.md, Bars).

For every bundle of ../shared/bench and ../shared/corpus this measures, in one process:
the reference interpreter's time, the JIT's time in each mode (compiled and loop, exact;
compiled reassociating, compile(..., exact=False)), their ratio, the JIT's
arena bytes against the reference's peak live bytes, and the number of distinct kernels.
It prints the table as Markdown and writes it to <out>/bench.md and <out>/bench.csv,
followed by a "bars" section checking the bars of perf/README.md.

How to run (from the repository root; a full run takes several minutes, most of it the
reference on grid5_d3, about 13 s per run):

    export CATBP_JIT_CACHE_DIR=/tmp/cjc        # optional: a persistent kernel cache
    .venv/bin/python perf/bench.py [--shared DIR] [--only bench|corpus] [--bundles NAME ...]
                                   [--out perf/out] [--ref-runs N] [--quick]

--shared defaults to $CATBP_SHARED_DIR, else <repo>/../shared. --bundles keeps the bundles
whose name contains one of the given strings. --ref-runs N caps the reference's runs at N
(by default it runs at least 3 times, more for fast bundles, within REF_BUDGET_S seconds).
--quick: short time budgets, one reference run for slow bundles (for trying things out).

How things are measured:
* reference: `catbp_jit.reference.run_programs` over the bundle's linked programs, the
  inputs given by the bundle's providers; median of N runs, N adaptive (at least 3, more
  for fast bundles, about REF_BUDGET_S seconds in all, capped by --ref-runs).
* JIT, for each mode: compile (timed; the time depends on the state of the kernel cache,
  reported as is with the cache's hit/miss count), bind, one warm-up run, then the median
  of many runs of `sess.run(factors=..., selectors=...)` (inputs copied in every run) and
  of `sess.run()` (inputs already bound: the steady state of many evaluations).
* check: every slot the reference produced must match the JIT's slot after the last run
  (catbp_jit.cli.compare_slot with the bundle's dtype); otherwise the row says FAIL.
* same bits: how many of those slots are the reference's bit for bit (both run live on
  this machine). SAT, COUNT and MAXLOG always are; a PROB or LOGPROB sum may differ in its
  last bits where numpy sums its terms in runs (docs/ir.md), as on grid5_d3.
* ref peak: the reference's peak live bytes, from a walk of the programs' IR, not from a
  measurement. Registers and slots hold values by reference. At every instruction
  boundary the live bytes are the total size of the distinct values held by any register
  or slot; the peak is the maximum over all boundaries of all programs. Rules for what is
  a distinct value:
    - UNIT, CONTRACT: a new value;
    - LOAD_FACTOR / LOAD_SELECTOR: the caller's input array itself when its dtype already
      is the semiring's (numpy's astype(copy=False) returns it), one value per input
      however often it is loaded; otherwise a new value (a cast copy) at every load;
    - LOAD_SLOT: the value stored in the slot (shared); STORE_SLOT: the slot now holds the
      register's value (shared);
    - ELIMINATE: a new value when it drops an axis; when it drops none, the same value
      (the reference returns a transposed view of the same buffer: astype(copy=False) with
      the same dtype does not copy);
    - NORMALIZE: a new value in its register (semirings that normalize); nothing otherwise;
    - FREE drops registers; each program starts with no registers (a fresh VM), slots
      carry over.
  numpy temporaries inside one instruction (e.g. logsumexp's) are not counted, so the
  reference's true peak is higher than this.

Columns:
    bundle       bundle directory name (in bench/ or corpus/)
    mode         compiled (one Numba dispatcher runs all steps) or loop (Python loop);
                 "compiled reassoc": compiled, exact=False (contraction paths and GEMM),
                 timed in the same run against the same reference measurement
    steps        steps in the schedule (len(exe.schedule.steps))
    kernels      distinct kernels (len(exe.kernels))
    reference    median reference time per run of the linked programs (runs in brackets)
    compile      compile time of compile(...) for this mode, with kernel-cache misses
    run(inputs)  median time of sess.run(factors=..., selectors=...)
    run()        median time of sess.run() with inputs already bound
    run() 1 thread   the same with numba.set_num_threads(1) (its results must be the
                 same bits as with every thread, else the row says FAIL)
    threads gain run() 1 thread / run(): what the parallel kernels gain on this machine's
                 threads (the header's "numba threads")
    x inputs     reference / run(inputs)
    x bound      reference / run()
    arena        exe.memory.total_bytes: every arena of the session (inputs, slots, ...)
    ref peak     the reference's peak live bytes (see above)
    arena/peak   arena / ref peak (below 1: the JIT holds less than the reference)
    check        ok, FAIL (a slot differs from the reference's), or ERROR (an exception)
    same bits    slots bit for bit the reference's / slots the reference produced

The CSV has the same rows, times in seconds and sizes in bytes, unformatted.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # perf/common.py
import numba  # noqa: E402
import numpy as np  # noqa: E402

from catbp_jit.bundle import load_bundle  # noqa: E402
from catbp_jit.cli import compare_slot  # noqa: E402
from catbp_jit.compiler import compile  # noqa: E402
from catbp_jit.ir.ops import OpCode  # noqa: E402
from catbp_jit.ir.validate import validate_programs  # noqa: E402
from catbp_jit.reference import run_programs  # noqa: E402
from common import (  # noqa: E402
    GROUPS,
    REPO,
    bundles_in,
    cpu_model,
    cpus_usable,
    default_shared_dir,
    find_bundles,
    fmt_bytes,
    fmt_ratio,
    fmt_time,
    load_average,
    threading_layer,
    threads_environment,
    time_runs,
    write_report,
)

MODES = ("compiled", "loop")
# (dispatch mode, exact) per row of a bundle: both dispatch modes exact, then the
# reassociating mode compiled
RUNS = (("compiled", True), ("loop", True), ("compiled", False))
REF_BUDGET_S = 2.5  # reference: total time per bundle when runs are fast
REF_MIN_RUNS = 3
REF_MAX_RUNS = 200
JIT_BUDGET_S = 1.0  # JIT: total time per bundle, mode and call
JIT_MIN_RUNS = 3
JIT_MAX_RUNS = 5000
QUICK_BUDGET_S = 0.2

# The bars of perf/README.md: (model, minimum ratio reference/JIT in compiled mode, kind).
SPEED_BARS = (
    ("chain200_d2", 100.0, "overhead-bound"),
    ("grid4x8_d2", 100.0, "overhead-bound"),
    ("grid5_d3", 20.0, "compute-bound"),
)
# issue 13's aim for the reassociating mode (compiled, exact=False)
REASSOC_BARS = (("grid5_d3", 50.0, "compute-bound"),)

COLUMNS = (
    "bundle",
    "mode",
    "steps",
    "kernels",
    "reference",
    "compile",
    "run(inputs)",
    "run()",
    "run() 1 thread",
    "threads gain",
    "x inputs",
    "x bound",
    "arena",
    "ref peak",
    "arena/peak",
    "check",
    "same bits",
)
CSV_COLUMNS = (
    "group",
    "bundle",
    "semiring",
    "dtype",
    "mode",
    "exact",
    "steps",
    "kernels",
    "ref_s",
    "ref_runs",
    "compile_s",
    "cache_misses",
    "run_inputs_s",
    "run_inputs_runs",
    "run_bound_s",
    "run_bound_runs",
    "threads",
    "run_one_thread_s",
    "run_one_thread_runs",
    "threads_gain",
    "ratio_inputs",
    "ratio_bound",
    "arena_bytes",
    "ref_peak_bytes",
    "arena_over_peak",
    "check",
    "same_bits_slots",
    "ref_slots",
    "detail",
)


# ---------------------------------------------------------------------------------------
# The reference


def bench_reference(bundle, budget_s: float, ref_runs):
    """(median seconds, runs, slots) of the reference over the bundle's linked programs."""
    sr = bundle.semiring_runtime()

    def run():
        return run_programs(bundle.programs, sr, bundle.factor_provider, bundle.selector_provider)

    max_runs = REF_MAX_RUNS if ref_runs is None else ref_runs
    min_runs = min(REF_MIN_RUNS, max_runs)
    return time_runs(run, min_runs, max_runs, budget_s)


def reference_peak_bytes(bundle) -> int:
    """The reference's peak live bytes, from a walk of the IR (rules in the docstring)."""
    sr = bundle.semiring_runtime()
    itemsize = sr.dtype.itemsize
    checked = validate_programs(
        bundle.programs,
        factor_specs=bundle.factor_specs(),
        selector_specs=bundle.selector_specs(),
        itemsize=itemsize,
    )

    value_bytes = {}  # value id -> its size in bytes
    value_ndim = {}  # value id -> its number of axes
    input_value = {}  # ("factor", id) or ("selector", id) -> the value id of that input

    def new_value(spec) -> int:
        vid = len(value_bytes)
        value_bytes[vid] = int(np.prod(spec.shape, dtype=np.int64)) * itemsize
        value_ndim[vid] = len(spec.shape)
        return vid

    def load(kind: str, ident: int, spec) -> int:
        arr = (bundle.factors if kind == "factor" else bundle.selectors)[ident][0]
        if arr.dtype != sr.dtype:
            return new_value(spec)  # astype copies: a new array at every load
        if (kind, ident) not in input_value:
            input_value[(kind, ident)] = new_value(spec)
        return input_value[(kind, ident)]

    slots = {}  # slot key -> value id
    peak = 0
    for program, specs in zip(checked.programs, checked.value_specs):
        regs = {}  # register -> value id; a fresh VM per program
        for ins, spec in zip(program.instructions, specs):
            op, args = ins.op, ins.args
            if op in (OpCode.UNIT, OpCode.CONTRACT):
                regs[ins.dst] = new_value(spec)
            elif op == OpCode.LOAD_FACTOR:
                regs[ins.dst] = load("factor", args["factor_id"], spec)
            elif op == OpCode.LOAD_SELECTOR:
                regs[ins.dst] = load("selector", args["selector_id"], spec)
            elif op == OpCode.LOAD_SLOT:
                regs[ins.dst] = slots[args["slot"]]
            elif op == OpCode.STORE_SLOT:
                slots[args["slot"]] = regs[args["src"]]
            elif op == OpCode.ELIMINATE:
                src = regs[args["src"]]
                if len(spec.shape) == value_ndim[src]:
                    regs[ins.dst] = src  # drops nothing: a view of the same buffer
                else:
                    regs[ins.dst] = new_value(spec)
            elif op == OpCode.NORMALIZE:
                if sr.supports_normalize():
                    regs[args["src"]] = new_value(spec)
            elif op == OpCode.FREE:
                for rid in args.get("srcs", ()):
                    regs.pop(rid, None)
            live = set(regs.values()) | set(slots.values())
            peak = max(peak, sum(value_bytes[v] for v in live))
    return peak


# ---------------------------------------------------------------------------------------
# The JIT


def bench_jit(bundle, mode: str, budget_s: float, ref_slots, exact: bool = True) -> dict:
    """Compile, bind, warm up and time one mode; compare its slots with the reference's."""
    factors = {fid: arr for fid, (arr, _) in bundle.factors.items()}
    selectors = {sid: arr for sid, (arr, _) in bundle.selectors.items()}

    t0 = time.perf_counter()
    exe = compile(
        bundle.programs,
        bundle.semiring_runtime(),
        factor_specs=bundle.factor_specs(),
        selector_specs=bundle.selector_specs(),
        mode=mode,
        exact=exact,
    )
    compile_s = time.perf_counter() - t0
    sess = exe.bind()
    sess.run(factors=factors, selectors=selectors)  # warm-up

    def run_inputs():
        return sess.run(factors=factors, selectors=selectors)

    inputs_s, inputs_runs, _ = time_runs(run_inputs, JIT_MIN_RUNS, JIT_MAX_RUNS, budget_s)
    bound_s, bound_runs, slots = time_runs(sess.run, JIT_MIN_RUNS, JIT_MAX_RUNS, budget_s)
    slots = {key: (np.array(a), spec) for key, (a, spec) in slots.items()}  # (the next runs reuse the views)

    # the same runs on one thread: what the parallel kernels gain (and the same bits)
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        sess.run()  # warm-up
        one_s, one_runs, one_slots = time_runs(sess.run, JIT_MIN_RUNS, JIT_MAX_RUNS, budget_s)
    finally:
        numba.set_num_threads(threads)

    problems = []
    for key, (got, _) in one_slots.items():
        if not bits_equal(got, slots[key][0]):
            problems.append(f"{key!r}: one thread gives other bits than {threads}")
    for key, (want, _) in ref_slots.items():
        if key not in slots:
            problems.append(f"{key!r}: missing")
            continue
        reason = compare_slot(slots[key][0], want, bundle.dtype)
        if reason is not None:
            problems.append(f"{key!r}: {reason}")
    same_bits = sum(key in slots and bits_equal(slots[key][0], want) for key, (want, _) in ref_slots.items())

    return {
        "steps": len(exe.schedule.steps),
        "kernels": len(exe.kernels),
        "compile_s": compile_s,
        "cache_misses": exe.cache_stats.get("misses", 0),
        "run_inputs_s": inputs_s,
        "run_inputs_runs": inputs_runs,
        "run_bound_s": bound_s,
        "run_bound_runs": bound_runs,
        "threads": threads,
        "run_one_thread_s": one_s,
        "run_one_thread_runs": one_runs,
        "threads_gain": one_s / bound_s,
        "arena_bytes": exe.memory.total_bytes,
        "check": "ok" if not problems else "FAIL",
        "same_bits_slots": same_bits,
        "ref_slots": len(ref_slots),
        "detail": "; ".join(problems[:3]) + (f"; ... {len(problems) - 3} more" if len(problems) > 3 else ""),
    }


def bits_equal(got, want) -> bool:
    """The same dtype, shape and bytes."""
    got, want = np.asarray(got), np.asarray(want)
    return got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()


# ---------------------------------------------------------------------------------------
# Formatting


def markdown_row(row: dict) -> list:
    return [
        row["bundle"],
        mode_name(row),
        str(row.get("steps", "-")),
        str(row.get("kernels", "-")),
        f"{fmt_time(row['ref_s'])} ({row['ref_runs']})",
        (
            f"{row['compile_s']:.2f} s ({row['cache_misses']} miss)"
            if row.get("compile_s") is not None
            else "-"
        ),
        fmt_time(row.get("run_inputs_s")),
        fmt_time(row.get("run_bound_s")),
        fmt_time(row.get("run_one_thread_s")),
        fmt_ratio(row.get("threads_gain")),
        fmt_ratio(row.get("ratio_inputs")),
        fmt_ratio(row.get("ratio_bound")),
        fmt_bytes(row.get("arena_bytes")),
        fmt_bytes(row["ref_peak_bytes"]),
        f"{row['arena_over_peak']:.2f}" if row.get("arena_over_peak") is not None else "-",
        row["check"],
        f"{row['same_bits_slots']}/{row['ref_slots']}" if row.get("ref_slots") is not None else "-",
    ]


def mode_name(row: dict) -> str:
    return row["mode"] + ("" if row.get("exact", True) else " reassoc")


def markdown_table(rows) -> list:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(markdown_row(row)) + " |")
    return lines


def bars_section(rows) -> list:
    """PASS/MISS for each bar of perf/README.md that the measured bundles cover."""
    lines = []
    for bars, exact in ((SPEED_BARS, True), (REASSOC_BARS, False)):
        for model, bar, kind in bars:
            for row in rows:
                if row["group"] != "bench" or row["mode"] != "compiled" or row["exact"] != exact:
                    continue
                if row["bundle"].split("__")[0] != model or row.get("ratio_inputs") is None:
                    continue
                # judged on run(inputs), the drop-in use; run() shown for comparison
                verdict = "PASS" if row["ratio_inputs"] >= bar else "MISS"
                lines.append(
                    f"- {verdict} {row['bundle']} ({kind}, bar >= {bar:.0f}x, "
                    f"{mode_name(row)}): {row['ratio_inputs']:.1f}x with inputs, "
                    f"{row['ratio_bound']:.1f}x bound"
                )
    seen = set()
    for row in rows:
        if row["group"] != "bench" or row.get("arena_bytes") is None or row["bundle"] in seen:
            continue
        seen.add(row["bundle"])
        verdict = "PASS" if row["arena_bytes"] < row["ref_peak_bytes"] else "MISS"
        lines.append(
            f"- {verdict} {row['bundle']} (arena below the reference's peak): "
            f"{fmt_bytes(row['arena_bytes'])} vs {fmt_bytes(row['ref_peak_bytes'])}, "
            f"ratio {row['arena_over_peak']:.2f}"
        )
    return lines


def header_lines(args, load_at_start: str) -> list:
    usable, threads_env = cpus_usable(), threads_environment()
    return [
        "# catbp_jit benchmark",
        "",
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"- machine: {platform.machine()}, {cpu_model()}, "
        f"{os.cpu_count()} CPUs ({usable} usable); load average {load_at_start} at "
        f"start, {load_average()} at end (other processes skew the timings)",
        f"- python {platform.python_version()}, numpy {np.__version__}, "
        f"numba {numba.__version__}, numba threads {numba.get_num_threads()}, "
        f"threading layer {threading_layer()}" + (f" ({threads_env})" if threads_env else ""),
        f"- kernel cache: {os.environ.get('CATBP_JIT_CACHE_DIR') or '(default)'}"
        f" ({os.environ.get('CATBP_JIT_CACHE') or 'default policy'})",
        f"- reference runs: at least {min(REF_MIN_RUNS, args.ref_runs or REF_MIN_RUNS)}, "
        f"within {args.ref_budget:.1f} s, at most {args.ref_runs or REF_MAX_RUNS}; "
        f"JIT: at least {JIT_MIN_RUNS} runs within {args.jit_budget:.1f} s per mode and call"
        + ("; --quick" if args.quick else ""),
        "- times are medians; x = reference time / JIT time",
    ]


# ---------------------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shared",
        type=Path,
        default=default_shared_dir(),
        help="the shared directory holding bench/ and corpus/ (default: %(default)s)",
    )
    parser.add_argument("--only", choices=GROUPS, help="only the bench or only the corpus bundles")
    parser.add_argument(
        "--bundles", nargs="+", metavar="NAME", help="only bundles whose name contains one of these strings"
    )
    parser.add_argument(
        "--dirs",
        nargs="+",
        metavar="DIR",
        help="your own bundles instead of the shared ones: bundle directories, or directories "
        "of them (--bundles filters them too)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO / "perf" / "out",
        help="where bench.md and bench.csv go (default: %(default)s)",
    )
    parser.add_argument(
        "--ref-runs",
        type=int,
        metavar="N",
        help=f"at most N reference runs per bundle (default: adaptive, at least {REF_MIN_RUNS})",
    )
    parser.add_argument(
        "--quick", action="store_true", help="short budgets and a single reference run for slow bundles"
    )
    args = parser.parse_args(argv)
    if args.ref_runs is not None and args.ref_runs < 1:
        parser.error("--ref-runs must be at least 1")
    args.ref_budget = QUICK_BUDGET_S if args.quick else REF_BUDGET_S
    args.jit_budget = QUICK_BUDGET_S if args.quick else JIT_BUDGET_S
    if args.quick and args.ref_runs is None:
        args.ref_runs = 1

    if args.dirs:
        bundles = bundles_in(args.dirs, args.bundles)
        if not bundles:
            parser.error(f"no bundles found in {' '.join(args.dirs)}")
    else:
        bundles = find_bundles(args.shared, args.only, args.bundles)
        if not bundles:
            parser.error(f"no bundles found under {args.shared}")
    load_at_start = load_average()

    rows = []
    for group, path in bundles:
        bundle = load_bundle(path)
        print(f"... {group}/{path.name}: reference", file=sys.stderr, flush=True)
        ref_s, ref_runs, ref_slots = bench_reference(bundle, args.ref_budget, args.ref_runs)
        peak = reference_peak_bytes(bundle)
        for mode, exact in RUNS:
            row = {
                "group": group,
                "bundle": path.name,
                "semiring": bundle.semiring,
                "dtype": bundle.dtype.name,
                "mode": mode,
                "exact": exact,
                "ref_s": ref_s,
                "ref_runs": ref_runs,
                "ref_peak_bytes": peak,
            }
            print(f"... {group}/{path.name}: {mode_name(row)}", file=sys.stderr, flush=True)
            try:
                row.update(bench_jit(bundle, mode, args.jit_budget, ref_slots, exact))
            except Exception as e:  # one broken bundle must not stop the table
                row.update(check="ERROR", detail=f"{type(e).__name__}: {e}"[:300])
            else:
                row["ratio_inputs"] = ref_s / row["run_inputs_s"]
                row["ratio_bound"] = ref_s / row["run_bound_s"]
                row["arena_over_peak"] = row["arena_bytes"] / peak if peak else None
            rows.append(row)
            gc.collect()  # drop the session's arena before the next one

    lines = header_lines(args, load_at_start) + ["", "## Results", ""] + markdown_table(rows)
    problems = [r for r in rows if r["check"] != "ok"]
    if problems:
        lines += ["", "Problems:", ""]
        lines += [f"- {r['bundle']} ({mode_name(r)}): {r['check']}: {r['detail']}" for r in problems]
    bars = bars_section(rows) or ["- (no bench bundle measured)"]
    lines += ["", "## Bars (perf/README.md, Bars)", ""] + bars
    text = "\n".join(lines) + "\n"

    write_report(args.out, "bench", text, rows, CSV_COLUMNS)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
