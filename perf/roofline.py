"""Roofline of each segment: how close every kernel launch comes to this machine's bounds.

For every bundle (default: those of ../shared/bench, found as perf/bench.py finds them;
`--bundles DIR ...`: your own, bundle directories or directories of them) the
programs are compiled (kernels from the disk cache) and, for each step of the schedule, one
kernel launch computing one segment, this measures:

* bytes: the step's compulsory traffic: its output written once plus each distinct leaf
  read once (sizes from the memory plan). Re-reads of a leaf broadcast over other axes, the
  second pass of a NORMALIZE over the output, and the offset tables are not counted: what
  a kernel with perfect cache reuse would still have to move.
* ops: Step.work = output elements x reduced elements x leaves (plan/schedule.py): a term
  of k leaves is k - 1 products and one sum, k operations.
* time: what the step costs inside a run: the dispatcher walking that step alone, as a
  compiled run walks it (its chunks shared with the pool's threads), less the time of an
  empty walk (the dispatcher's call from Python, the same for every step), in schedule
  order (so its leaves hold the values a run gives them), repeated, best of several
  batches. A step's output never shares memory with its leaves, so a repeated walk
  computes the same thing again. A repack step (plan/repack.py: copies of small leaves in
  the step's workspace) has no row: it is walked and timed with the step after it, whose
  leaves it copies. Per mode, `run` is the whole schedule run as a run runs it (its tracks
  side by side where it has them, plan/tracks.py) without binding inputs, the median of
  0.3 s of single runs (20 at least); in turn, the
  step times add up to it (they are measured with their data in cache, the run's steps
  find some of it evicted by the steps between), in tracks it may take less.
* bound: max(bytes / bandwidth, ops / arithmetic peak), with both peaks measured by a
  calibration at the start of the run (below); which of the two it is; and the ratio
  time / bound (1 = at the roofline).

Calibration, once per run, a few seconds, with all the threads Numba uses:
* bandwidth: a parallel triad a[i] = b[i] + s * c[i] over arrays far larger than the
  last-level cache, bytes = 3 x 8 per element (two reads, one write: STREAM's count),
  best of a few runs.
* multiply-add: independent x = x * a + b over a block of float64 that stays in registers
  (2 operations each): the kernels' element operation for PROB and COUNT, and for LOGPROB
  products (additions).
* exp: a LOGPROB reduction's ⊕ is a logsumexp whose every term costs an exp, next to which
  the term's additions are cheap: for those steps the arithmetic bound is terms / the rate
  of a loop doing acc += exp(x + a). Lenient to the kernel, which makes two passes (the
  maximum, then the exps); but exp(-inf) returns at once, so steps whose terms are mostly
  -inf (evidence selectors' zeros) can come in under this bound.
Each arithmetic peak is the larger of all threads at once and one thread's rate times
the threads: on a machine other processes share, all threads at once measure those too.

Each mode of MODES is compiled and measured on its own: the exact mode (the default) and
the reassociating mode (exact=False), whose schedule is another list of steps (contraction
paths split segments, GEMM steps call BLAS). Every row names its mode; a bundle meets the
bar when, in at least one mode, every step over 1 ms is within 2x of its bound (3x until
2026-11-27).

Writes <out>/roofline.md (a table per bundle and the summary), <out>/roofline.csv (one
row per step) and <out>/roofline.png (the steps as points under the roofline; needs
matplotlib).

    export CATBP_JIT_CACHE_DIR=/tmp/cjc
    .venv/bin/python perf/roofline.py [--only NAME ...] [--group bench|corpus]
                                      [--shared DIR] [--out perf/out] [--quick]

--only keeps the bundles whose name contains one of the strings; --quick: a tiny
calibration and short timing budgets (for trying things out and for the test).
"""

from __future__ import annotations

import argparse
import gc
import math
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # perf/common.py
import numba  # noqa: E402
import numpy as np  # noqa: E402
from numba import njit, prange  # noqa: E402

from catbp_jit.bundle import load_bundle  # noqa: E402
from catbp_jit.compiler import compile  # noqa: E402
from catbp_jit.errors import CatbpError  # noqa: E402
from common import (  # noqa: E402
    GROUPS,
    REPO,
    bundles_in,
    cpu_model,
    default_shared_dir,
    find_bundles,
    fmt_bytes,
    fmt_time,
    load_average,
    threading_layer,
    write_report,
)

# mode name -> compile() keywords selecting it. The modes' step lists differ (grid5_d3:
# 304 steps exact, 530 reassociating), so each mode has rows of its own.
MODES = {"exact": {}, "reassoc": {"exact": False}}
SLOW_S = 1e-3  # the bar: every segment slower than this ...
WITHIN = 2.0  # ... within this factor of its bound (in at least one mode)


@dataclass(frozen=True)
class Budget:
    """How long calibration and timing may take."""

    triad_elements: int = 2**23  # x 8 bytes x 3 arrays: 200 MB, far beyond the caches
    arith_seconds: float = 0.3  # per arithmetic calibration and thread count
    calibration_runs: int = 5
    step_seconds: float = 0.01  # per batch of calls of one step
    step_batches: int = 3
    # a whole run's single calls, timed this long: the machine has slow stretches of tens
    # of milliseconds (another tenant, a thread moved), and 0.03 s of grid4x8_d2's runs
    # (~400) fell in one in about one process in six (a median of 91-116 us where 0.3 s
    # of runs in the same process gave 72-76)
    run_seconds: float = 0.3


QUICK = Budget(
    triad_elements=2**18,
    arith_seconds=0.02,
    calibration_runs=2,
    step_seconds=0.001,
    step_batches=2,
    run_seconds=0.01,
)


# ---------------------------------------------------------------------------------------
# Calibration


@njit(parallel=True, cache=False)
def _triad(a, b, c, s):
    for i in prange(a.size):
        a[i] = b[i] + s * c[i]


LANES = 64  # independent chains per thread: enough to hide the latency of mul and add


@njit(parallel=True, cache=False)
def _multiply_adds(chunks, reps):
    out = np.empty(chunks)
    for c in prange(chunks):
        x = np.empty(LANES)
        for j in range(LANES):
            x[j] = 1.0 + (c * LANES + j) * 1e-9
        for _ in range(reps):
            for j in range(LANES):
                x[j] = x[j] * 0.9999999 + 1e-7  # stays near 1: no overflow, no denormals
        out[c] = x.sum()
    return out


@njit(parallel=True, cache=False)
def _exps(chunks, reps):
    out = np.empty(chunks)
    for c in prange(chunks):
        x = np.empty(LANES)
        acc = np.zeros(LANES)
        for j in range(LANES):
            x[j] = -1.0 - (c * LANES + j) * 1e-9
        for r in range(reps):
            for j in range(LANES):
                acc[j] += math.exp(x[j] + r * 1e-12)  # a logsumexp's term: one exp, one add
        out[c] = acc.sum()
    return out


def best_of(fn, runs: int) -> float:
    best = math.inf
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def loop_rate(loop, chunks: int, budget: Budget) -> float:
    """Lane updates per second of a calibration loop run as `chunks` parallel chunks."""
    loop(chunks, 1)  # compile
    reps = 64
    while True:  # grow until one run takes about the budget's share
        t = best_of(partial(loop, chunks, reps), 1)
        if t >= budget.arith_seconds / budget.calibration_runs or reps >= 2**30:
            break
        reps *= 2
    return chunks * reps * LANES / best_of(lambda: loop(chunks, reps), budget.calibration_runs)


def arithmetic_rate(loop, budget: Budget) -> float:
    """The larger of: all threads at once, and one thread's rate times the threads. Cores
    do not share arithmetic units, but on a machine other processes also use, all threads
    at once measure those processes too."""
    threads = numba.get_num_threads()
    together = loop_rate(loop, threads * 4, budget)
    numba.set_num_threads(1)
    try:
        alone = loop_rate(loop, 1, budget) * threads
    finally:
        numba.set_num_threads(threads)
    return max(together, alone)


def calibrate(budget: Budget) -> dict:
    """Peak bandwidth (bytes/s), multiply-adds (operations/s, 2 per multiply-add) and
    exps (logsumexp terms/s) of this machine."""
    n = budget.triad_elements
    b = np.random.default_rng(0).random(n)
    c = b[::-1].copy()
    a = np.empty(n)
    _triad(a, b, c, 0.5)  # compile, and touch every page
    t = best_of(lambda: _triad(a, b, c, 0.5), budget.calibration_runs)
    return {
        "bandwidth": 3 * 8 * n / t,
        "multiply-add": 2 * arithmetic_rate(_multiply_adds, budget),
        "exp": arithmetic_rate(_exps, budget),
    }


def arithmetic_kind(step) -> str:
    """The calibration whose element operation bounds the step's arithmetic: a LOGPROB
    reduction's terms each cost an exp, next to which its k - 1 additions are cheap."""
    if step.pattern.semiring == "LOGPROB" and step.pattern.reduce:
        return "exp"
    return "multiply-add"


def terms(step) -> int:
    """Output elements x reduced elements: the terms of the step's sums."""
    return step.work // max(1, len(step.segment.leaves))


# ---------------------------------------------------------------------------------------
# Steps


def traffic_bytes(exe, step) -> int:
    """Compulsory traffic: the output written once, each distinct leaf read once."""
    regions = exe.memory.regions
    values = {step.segment.out} | set(step.segment.leaves)
    return sum(regions[v].size for v in values) * exe.memory.itemsize


def time_step(call, budget: Budget) -> float:
    """Seconds per call, best of budget.step_batches batches of enough calls to fill
    budget.step_seconds each."""
    t0 = time.perf_counter()
    call()
    first = time.perf_counter() - t0
    reps = max(1, int(budget.step_seconds / max(first, 1e-9)))

    def batch():
        for _ in range(reps):
            call()

    return best_of(batch, budget.step_batches) / reps


def time_run(call, budget: Budget, at_least: int = 20) -> float:
    """Seconds per call, the median of single calls (at least `at_least` of them, and as
    many as budget.run_seconds allows): a run is long enough to time alone, and a
    median leaves out the runs a pool thread's wake-up or another process slowed (the
    best of --quick's batches of ~10 runs still counted such a run: grid4x8_d2 LOGPROB
    exact once 7.98 ms against 0.46)."""
    call()
    times: list[float] = []
    end = time.perf_counter() + budget.run_seconds
    while len(times) < at_least or time.perf_counter() < end:
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def measure_steps(exe, bundle, budget: Budget) -> tuple[list, float, float]:
    """Seconds per step of exe's schedule where a run spends them: each step walked alone
    by the dispatcher (Session.steps_call: a step of several chunks shares them with the
    pool, as in a run), less the time of an empty walk (the dispatcher's call from
    Python), each after every step before it ran once; a repack step is walked with the
    step after it. Also the empty walk's time, and the whole schedule's run without
    binding inputs (Session.run_call: its tracks side by side where it has them)."""
    exe.wait()  # the kernels, not the numpy tier
    sess = exe.bind()
    sess.run(
        factors={f: a for f, (a, _) in bundle.factors.items()},
        selectors={s: a for s, (a, _) in bundle.selectors.items()},
    )  # inputs, constants
    empty = time_step(sess.steps_call(0, 0), budget)
    whole = time_run(sess.run_call(), budget)
    times, first = [], None
    for i, step in enumerate(exe.schedule.steps):
        if step.pattern.template == "repack":  # walked with the step it copies for
            sess.steps_call(i, i + 1)()
            first = i
            continue
        start = i if first is None else first
        # (at least a nanosecond: the two walks' noise can exceed a tiny step's time)
        times.append(max(time_step(sess.steps_call(start, i + 1), budget) - empty, 1e-9))
        first = None
    return times, empty, whole


def origin(exe, step) -> str:
    """The program instructions a step computes, e.g. 'upward[3] upward[4]'."""
    graph = exe.graph
    places = sorted(
        {
            f"{prog}[{idx}]"
            for n in step.segment.nodes
            if n in graph.nodes
            for prog, idx in graph.nodes[n].origin
        }
    )
    return " ".join(places[:3]) + (" ..." if len(places) > 3 else "")


def roofline_rows(group: str, path: Path, peaks: dict, budget: Budget) -> tuple[list, dict]:
    """One row per step of the bundle's schedule in each mode, in MODES order; and per
    mode the time of an empty walk and of the whole schedule's (measure_steps)."""
    bundle = load_bundle(path)
    rows, walks = [], {}
    for mode, keywords in MODES.items():
        exe = compile(
            bundle.programs,
            bundle.semiring_runtime(),
            factor_specs=bundle.factor_specs(),
            selector_specs=bundle.selector_specs(),
            mode="loop",
            **keywords,
        )
        mine = [
            step_row(group, path.name, mode, exe, i, step, peaks)
            for i, step in enumerate(exe.schedule.steps)
            if step.pattern.template != "repack"
        ]
        times, empty, whole = measure_steps(exe, bundle, budget)
        for row, seconds in zip(mine, times):
            row["time_s"] = seconds
            row["ratio"] = seconds / row["bound_s"]
        rows += mine
        walks[mode] = {"empty_s": empty, "run_s": whole}
        del exe
        gc.collect()  # drop the session's arena before the next one
    return rows, walks


def step_row(group: str, name: str, mode: str, exe, i: int, step, peaks: dict) -> dict:
    nbytes = traffic_bytes(exe, step)
    kind = arithmetic_kind(step)
    memory_s = nbytes / peaks["bandwidth"]
    arith_s = (step.work if kind == "multiply-add" else terms(step)) / peaks[kind]
    return {
        "group": group,
        "bundle": name,
        "mode": mode,
        "step": i,
        "kernel": step.pattern.name,
        "origin": origin(exe, step),
        "out_elements": exe.memory.regions[step.segment.out].size,
        "leaves": len(step.segment.leaves),
        "bytes": nbytes,
        "ops": step.work,
        "terms": terms(step),
        "intensity": step.work / nbytes,
        "arith_kind": kind,
        "memory_bound_s": memory_s,
        "arith_bound_s": arith_s,
        "bound_s": max(memory_s, arith_s),
        "bound": "bandwidth" if memory_s >= arith_s else "arithmetic",
    }


# ---------------------------------------------------------------------------------------
# Summary, tables, plot


def mode_summary(rows: list, run_s: float | None = None) -> dict:
    """One mode of one bundle: total time, sum of bounds, and the slow steps' standing;
    run_s: the whole schedule's walk, if measured."""
    slow = [r for r in rows if r["time_s"] > SLOW_S]
    return {
        "steps": len(rows),
        "run_s": run_s,
        "bound_s": sum(r["bound_s"] for r in rows),
        "time_s": sum(r["time_s"] for r in rows),
        "slow": len(slow),
        "within": sum(r["ratio"] <= WITHIN for r in slow),
        "meets_bar": all(r["ratio"] <= WITHIN for r in slow),
    }


def summary(name: str, rows: list, walks: dict | None = None) -> dict:
    """Per bundle: each mode's summary, and the issue's bar: in at least one mode, every
    step over SLOW_S within WITHIN of its bound. (A mode's steps are its own segments:
    the modes split programs differently, so steps cannot be matched across modes.)
    walks: per mode, roofline_rows' walk times."""
    walks = walks or {}
    modes = {
        m: mode_summary([r for r in rows if r["mode"] == m], walks.get(m, {}).get("run_s"))
        for m in dict.fromkeys(r["mode"] for r in rows)
    }
    return {
        "bundle": name,
        "modes": modes,
        "slow_any": sum(s["slow"] for s in modes.values()),
        "meets_bar": any(s["meets_bar"] for s in modes.values()),
    }


def csv_columns() -> list:
    return [
        "group",
        "bundle",
        "mode",
        "step",
        "kernel",
        "origin",
        "out_elements",
        "leaves",
        "bytes",
        "ops",
        "terms",
        "intensity",
        "arith_kind",
        "memory_bound_s",
        "arith_bound_s",
        "bound_s",
        "bound",
        "time_s",
        "ratio",
    ]


def fmt_seconds(s: float) -> str:
    return f"{s * 1e9:.0f} ns" if s < 1e-6 else fmt_time(s)


def fmt_count(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}"


def step_table(rows: list) -> list:
    """The steps of one bundle in one mode."""
    head = ["step", "kernel", "bytes", "ops", "ops/byte", "bound", "bound by", "time", "x bound", "computes"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        flag = " **" if r["time_s"] > SLOW_S and r["ratio"] > WITHIN else ""
        cells = [
            str(r["step"]),
            r["kernel"],
            fmt_bytes(r["bytes"]),
            fmt_count(r["ops"]),
            f"{r['intensity']:.2f}",
            fmt_seconds(r["bound_s"]),
            r["bound"],
            fmt_seconds(r["time_s"]),
            f"{r['ratio']:.1f}{flag}",
            r["origin"],
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def summary_table(sums: list) -> list:
    """A line per bundle and mode; the bar (any mode meeting it) on each bundle's first."""
    head = [
        "bundle",
        "mode",
        "steps",
        "sum of bounds",
        "time",
        "x bound",
        "run",
        "run x bound",
        "steps > 1 ms",
        f"within {WITHIN:.0f}x",
        "bar",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for s in sums:
        bar = "-" if not s["slow_any"] else ("PASS" if s["meets_bar"] else "MISS")
        for i, (m, ms) in enumerate(s["modes"].items()):
            cells = [
                s["bundle"] if i == 0 else "",
                m,
                str(ms["steps"]),
                fmt_seconds(ms["bound_s"]),
                fmt_seconds(ms["time_s"]),
                f"{ms['time_s'] / ms['bound_s']:.1f}",
                "-" if ms["run_s"] is None else fmt_seconds(ms["run_s"]),
                "-" if ms["run_s"] is None else f"{ms['run_s'] / ms['bound_s']:.1f}",
                str(ms["slow"]),
                str(ms["within"]),
                bar if i == 0 else "",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def plot(rows: list, peaks: dict, path: Path) -> bool:
    """The steps as points (work per compulsory byte, achieved work per second) under the
    roofline min(peak, intensity x bandwidth), log-log: one panel per arithmetic kind,
    work counted in operations (multiply-add) or in terms (exp); a marker per mode.
    False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no plot)", file=sys.stderr)
        return False
    markers = dict(zip(MODES, "o^sv"))
    kinds = [k for k in ("multiply-add", "exp") if any(r["arith_kind"] == k for r in rows)]
    fig, axes = plt.subplots(1, len(kinds), figsize=(7 * len(kinds), 5), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        unit = "ops" if kind == "multiply-add" else "terms"
        mine = [r for r in rows if r["arith_kind"] == kind]
        x = np.array([r[unit] / r["bytes"] for r in mine])
        line = np.geomspace(min(x.min(), 1e-2) / 2, max(x.max(), 10.0) * 2, 200)
        ax.plot(
            line,
            np.minimum(peaks[kind], line * peaks["bandwidth"]),
            "k-",
            linewidth=1,
            label=f"roofline: {peaks['bandwidth'] / 1e9:.1f} GB/s, {peaks[kind] / 1e9:.2f} G{unit}/s",
        )
        for name, mode in dict.fromkeys((r["bundle"], r["mode"]) for r in mine):
            theirs = [r for r in mine if r["bundle"] == name and r["mode"] == mode]
            ax.scatter(
                [r[unit] / r["bytes"] for r in theirs],
                [r[unit] / r["time_s"] for r in theirs],
                s=[10 + 30 * (r["time_s"] > SLOW_S) for r in theirs],
                marker=markers.get(mode, "o"),
                alpha=0.6,
                label=f"{name} ({mode})",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"{unit} per compulsory byte")
        ax.set_ylabel(f"achieved {unit}/s")
        ax.set_title(f"{kind} steps (large points: over 1 ms)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def peaks_line(peaks: dict) -> str:
    return (
        f"bandwidth {peaks['bandwidth'] / 1e9:.2f} GB/s (triad), multiply-add "
        f"{peaks['multiply-add'] / 1e9:.2f} Gop/s, exp {peaks['exp'] / 1e9:.3f} Gterms/s"
    )


def header_lines(peaks: dict, empty_s: float, quick: bool) -> list:
    return [
        "# catbp_jit roofline",
        "",
        f"- machine: {cpu_model()}, numba threads {numba.get_num_threads()}, threading layer "
        f"{threading_layer()}; load average {load_average()} (other processes skew the times)",
        f"- calibration{' (--quick)' if quick else ''}: {peaks_line(peaks)}",
        "- time: each step walked alone by the dispatcher, as a run walks it (a repack step "
        "with the step after it), less an empty walk's time (a call of the dispatcher from "
        f"Python, about {fmt_seconds(empty_s)}); run: the whole schedule run as a run runs it "
        "(tracks side by side, where it has them), without binding inputs: the median of "
        f"single runs ({(QUICK if quick else Budget()).run_seconds:g} s of them, 20 at least)",
        "- bytes: output + distinct leaves, once; ops: output x reduced elements x leaves; "
        "bound: max(bytes / bandwidth, ops / multiply-add peak, or for LOGPROB reductions "
        "terms / exp peak); x bound: time / bound",
        f"- ** marks a step over {fmt_time(SLOW_S)} more than {WITHIN:.0f}x from its bound; "
        f"bar: in at least one mode, every step over {fmt_time(SLOW_S)} within {WITHIN:.0f}x",
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
    parser.add_argument(
        "--group", choices=GROUPS, default="bench", help="which bundles (default: %(default)s)"
    )
    parser.add_argument(
        "--only", nargs="+", metavar="NAME", help="only bundles whose name contains one of these strings"
    )
    parser.add_argument(
        "--bundles",
        nargs="+",
        type=Path,
        metavar="DIR",
        help="your own bundles instead of the shared ones: bundle directories, or directories "
        "of them (--only filters them too)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO / "perf" / "out",
        help="where roofline.md, .csv and .png go (default: %(default)s)",
    )
    parser.add_argument("--quick", action="store_true", help="a tiny calibration and short timing budgets")
    args = parser.parse_args(argv)
    if args.bundles:
        bundles = bundles_in(args.bundles, args.only)
        where = f"no bundles found in {' '.join(map(str, args.bundles))}"
    else:
        bundles = find_bundles(args.shared, args.group, args.only)
        where = f"no {args.group} bundles found under {args.shared}"
    if not bundles:
        parser.error(where + (f" matching {' '.join(args.only)}" if args.only else ""))
    budget = QUICK if args.quick else Budget()

    print("... calibrating", file=sys.stderr, flush=True)
    peaks = calibrate(budget)
    print(peaks_line(peaks), flush=True)

    all_rows, sums, sections, problems, empties = [], [], [], [], []
    for group, path in bundles:
        print(f"... {group}/{path.name}", file=sys.stderr, flush=True)
        try:
            rows, walks = roofline_rows(group, path, peaks, budget)
        except (CatbpError, MemoryError) as e:  # one broken bundle must not stop the table
            problems.append(f"- {path.name}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
            continue
        all_rows += rows
        sums.append(summary(path.name, rows, walks))
        empties += [w["empty_s"] for w in walks.values()]
        for mode in MODES:
            sections += ["", f"## {path.name}, {mode} mode", ""] + step_table(
                [r for r in rows if r["mode"] == mode]
            )

    lines = (
        header_lines(peaks, float(np.median(empties)) if empties else math.nan, args.quick)
        + ["", "## Summary", ""]
        + summary_table(sums)
        + (["", "Problems:", ""] + problems if problems else [])
        + sections
    )
    text = "\n".join(lines) + "\n"
    write_report(args.out, "roofline", text, all_rows, csv_columns(), echo=False)
    print(text, end="")
    written = [args.out / "roofline.md", args.out / "roofline.csv"]
    if all_rows and plot(all_rows, peaks, args.out / "roofline.png"):
        written.append(args.out / "roofline.png")
    print(f"(written to {', '.join(map(str, written))})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
