"""Prove that `Session.run` allocates nothing per run (perf/README.md, Bars).

Runs every bundle of ../shared/bench through a session, in both modes ("compiled" and
"loop"), and after a warm-up counts, over many runs:

* numpy data-buffer allocations, exactly, with catbp_jit.testing.alloc_counter.NumpyAllocCounter
  (a counting allocator installed with numpy's memory-policy API, NEP 49): must be 0;
* Numba NRT allocations of each run, with catbp_jit.testing.alloc_counter.NrtAllocCounter: must be
  the same small constant (at most MAX_NRT_PER_RUN) in every run, i.e. it does not grow
  with the number of runs nor with the program, and every NRT allocation must be freed
  again within the runs (net 0).

Two calls are checked: `sess.run(factors=..., selectors=...)` (inputs copied in each run)
and `sess.run()` (inputs already bound). A third, `run(rows)`, checks a batched executable
(one factor batched, buckets --buckets) whose runs cycle through row counts that switch
buckets at every run (1, the largest bucket, a count just over each smaller bucket, ...):
choosing a bucket must allocate nothing either.

How to run (from the repository root):

    export CATBP_JIT_CACHE_DIR=/tmp/cjc        # optional: a persistent kernel cache
    .venv/bin/python perf/alloc_check.py [--shared DIR] [--runs 100] [--bundles NAME ...]
                                         [--large-runs 10] [--skip-large]

--shared defaults to $CATBP_SHARED_DIR, else <repo>/../shared. --bundles keeps only the
bundles whose directory name contains one of the given strings. Bundles whose arena
exceeds LARGE_ARENA_BYTES (the grid5_d3 bundles: about 0.6 GB, seconds per run) are run
with --large-runs runs instead of --runs (the table marks them with "*"); --skip-large
skips them.

Columns of the printed table:
    bundle    the bundle directory name
    mode      compiled (one Numba dispatcher runs every step) or loop (a Python loop)
    steps     steps in the schedule (len(exe.schedule.steps))
    call      run(inputs) = sess.run(factors=..., selectors=...), run() = sess.run(),
              run(rows) = batched sess.run(factors=...) with the row count changing each run
    runs      counted runs (after one warm-up run of each call); "*" = reduced count
    numpy     numpy data buffers allocated over all counted runs (must be 0)
    nrt min / nrt max   NRT allocations (NRT_Allocate + MemInfo) per run, min and max
    nrt net   NRT allocations minus NRT frees over all counted runs (must be 0)
    verdict   ok, or what failed

Exit status: 0 when every row is ok, 1 otherwise (2 on a usage error).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # perf/common.py
from catbp_jit.bundle import load_bundle  # noqa: E402
from catbp_jit.compiler import compile  # noqa: E402
from catbp_jit.testing.alloc_counter import NrtAllocCounter, NumpyAllocCounter, enable_nrt_stats  # noqa: E402
from common import default_shared_dir, find_bundles  # noqa: E402

MODES = ("compiled", "loop")
MAX_NRT_PER_RUN = 8  # a small constant: e.g. one MemInfo (2 counts) per array argument
LARGE_ARENA_BYTES = 256 * 1024 * 1024


def count_runs(sess, kwargs, runs: int) -> dict:
    """Run `sess.run(**kwargs)` `runs` times under both counters; return the counts.
    kwargs: one dict, or a list of them used in turn."""
    calls = kwargs if isinstance(kwargs, list) else [kwargs]
    for call in calls:
        sess.run(**call)  # warm-up for this call
    nrt_per_run = []
    nrt_net = 0
    with NumpyAllocCounter() as numpy_count:
        for i in range(runs):
            with NrtAllocCounter() as nrt:
                sess.run(**calls[i % len(calls)])
            nrt_per_run.append(nrt.allocations)
            nrt_net += nrt.allocations - nrt.frees
    return {
        "numpy": numpy_count.allocations,
        "nrt_min": min(nrt_per_run),
        "nrt_max": max(nrt_per_run),
        "nrt_net": nrt_net,
    }


def batched_session(bundle, factors: dict, selectors: dict, mode: str, buckets):
    """A session of the bundle batched over its first factor, and run() arguments whose
    row counts switch buckets at every run."""
    import numpy as np

    fid = min(factors)
    exe = compile(
        bundle.programs,
        bundle.semiring_runtime(),
        factor_specs=bundle.factor_specs(),
        selector_specs=bundle.selector_specs(),
        mode=mode,
        batched_factors={fid},
        buckets=buckets,
    )
    sess = exe.bind()
    counts = [1, buckets[-1]] + [b + 1 for b in buckets[:-1]] + [0]
    calls = [
        {"factors": {**factors, fid: np.repeat(factors[fid][None], n, axis=0)}, "selectors": selectors}
        for n in counts
    ]
    return sess, calls


def self_test() -> None:
    """The counters must see an allocation we make on purpose, or a 0 would prove nothing."""
    import numpy as np
    from numba import njit

    with NumpyAllocCounter() as c:
        np.empty(16)
    if c.allocations != 1:
        raise SystemExit(
            f"alloc_check: the numpy counter saw {c.allocations} allocations of np.empty(16), expected 1"
        )
    make = njit(lambda n: np.empty(n))
    make(4)  # compile outside the count
    with NrtAllocCounter() as nrt:
        make(4)
    if nrt.allocations < 1:
        raise SystemExit("alloc_check: the NRT counter did not see np.empty inside njit code")


def verdict(c: dict) -> str:
    problems = []
    if c["numpy"] != 0:
        problems.append(f"{c['numpy']} numpy allocations")
    if c["nrt_min"] != c["nrt_max"]:
        problems.append("NRT count varies between runs")
    if c["nrt_max"] > MAX_NRT_PER_RUN:
        problems.append(f"NRT per run > {MAX_NRT_PER_RUN}")
    if c["nrt_net"] != 0:
        problems.append("NRT allocations not freed")
    return "ok" if not problems else "FAIL: " + "; ".join(problems)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shared",
        type=Path,
        default=default_shared_dir(),
        help="the shared directory holding bench/ (default: %(default)s)",
    )
    parser.add_argument("--runs", type=int, default=100, help="counted runs per call (default 100)")
    parser.add_argument(
        "--large-runs",
        type=int,
        default=10,
        help=f"counted runs for bundles whose arena exceeds {LARGE_ARENA_BYTES >> 20} MB (default 10)",
    )
    parser.add_argument(
        "--skip-large",
        action="store_true",
        help=f"skip bundles whose arena exceeds {LARGE_ARENA_BYTES >> 20} MB",
    )
    parser.add_argument(
        "--buckets",
        type=lambda x: tuple(int(b) for b in x.split(",") if b),
        default=(1, 8, 64),
        metavar="B,B,...",
        help="buckets of the batched check (default 1,8,64; '' skips it)",
    )
    parser.add_argument(
        "--bundles", nargs="+", metavar="NAME", help="only bundles whose name contains one of these strings"
    )
    args = parser.parse_args(argv)
    if args.runs < 1 or args.large_runs < 1:
        parser.error("--runs and --large-runs must be at least 1")

    bundles = [d for _, d in find_bundles(args.shared, "bench", args.bundles)]
    if not bundles:
        parser.error(f"no bundles found under {args.shared / 'bench'}")
    enable_nrt_stats()
    self_test()

    header = ("bundle", "mode", "steps", "call", "runs", "numpy", "nrt min", "nrt max", "nrt net", "verdict")
    rows = []
    notes = []
    per_mode_nrt = {mode: set() for mode in MODES}
    failed = False
    for path in bundles:
        bundle = load_bundle(path)
        factors = {fid: arr for fid, (arr, _) in bundle.factors.items()}
        selectors = {sid: arr for sid, (arr, _) in bundle.selectors.items()}
        for mode in MODES:
            print(f"... {path.name} ({mode})", file=sys.stderr, flush=True)
            exe = compile(
                bundle.programs,
                bundle.semiring_runtime(),
                factor_specs=bundle.factor_specs(),
                selector_specs=bundle.selector_specs(),
                mode=mode,
            )
            large = exe.memory.total_bytes > LARGE_ARENA_BYTES
            if large and args.skip_large:
                notes.append(
                    f"skipped {path.name} ({mode}): arena "
                    f"{exe.memory.total_bytes / 2**20:.0f} MB > {LARGE_ARENA_BYTES >> 20} MB"
                )
                continue
            runs = min(args.runs, args.large_runs) if large else args.runs
            runs_text = f"{runs}*" if runs != args.runs else str(runs)
            sess = exe.bind()
            sess.run(factors=factors, selectors=selectors)  # warm-up (and binds every input)
            calls = (("run(inputs)", {"factors": factors, "selectors": selectors}), ("run()", {}))
            for call, kwargs in calls:
                counts = count_runs(sess, kwargs, runs)
                v = verdict(counts)
                failed = failed or v != "ok"
                per_mode_nrt[mode].add(counts["nrt_max"])
                rows.append(
                    (
                        path.name,
                        mode,
                        str(len(exe.schedule.steps)),
                        call,
                        runs_text,
                        str(counts["numpy"]),
                        str(counts["nrt_min"]),
                        str(counts["nrt_max"]),
                        str(counts["nrt_net"]),
                        v,
                    )
                )
            del sess, exe  # give the arena back before the next compile
            if large or not args.buckets:
                continue
            counts = count_runs(*batched_session(bundle, factors, selectors, mode, args.buckets), runs)
            v = verdict(counts)
            failed = failed or v != "ok"
            rows.append(
                (
                    path.name,
                    mode,
                    "-",
                    f"run(rows) {args.buckets}",
                    runs_text,
                    str(counts["numpy"]),
                    str(counts["nrt_min"]),
                    str(counts["nrt_max"]),
                    str(counts["nrt_net"]),
                    v,
                )
            )

    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]

    def line(cells):
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    print(line(header))
    print(line(["-" * w for w in widths]))
    for r in rows:
        print(line(r))
    print()
    if any(r[4].endswith("*") for r in rows):
        print(
            f"* reduced run count (--large-runs {args.large_runs}): the arena exceeds "
            f"{LARGE_ARENA_BYTES >> 20} MB and one run takes seconds"
        )
    for n in notes:
        print(n)
    for mode in MODES:
        if per_mode_nrt[mode]:
            print(f"NRT allocations per run, {mode} mode, over all bundles: {sorted(per_mode_nrt[mode])}")
    print("result:", "FAIL" if failed else "ok (no numpy allocation; constant NRT count per run)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
