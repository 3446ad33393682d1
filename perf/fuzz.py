"""Differential fuzzing: random linked programs, the JIT against the reference, many at once.

The programs come from the generator the tests use (tests/random_programs.py), seeded, so
a seed is a reproducer. Each case runs through the reference interpreter and through
every target available: the JIT in loop mode (every case), in compiled mode and through
the drop-in API (every --every-th case: each compiles a dispatcher). Slots are compared as
the tests compare them (assert_same_slots in tests/jit_helpers.py: same keys, specs,
dtypes; integers and bools exactly; floats within the design tolerances, NaN and inf in
the same places).

    python perf/fuzz.py --count 10000 --seed 0 [--semiring prob|logprob|sat|count] [--every 50]

Each mismatch prints its seed, the command that reruns it alone, and the program listing;
the exit code is the number of mismatches (capped at 100). Meant for runs of 10^4+ cases
outside CI: kernels come from the disk cache after the first few dozen cases.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the generator and the comparison the tests use

from jit_helpers import assert_same_slots, compile_case, run_dropin, run_reference, session_results  # noqa: E402
from random_programs import SEMIRINGS, case_from_seed  # noqa: E402

DTYPES = {name: [d for s, d in SEMIRINGS if s == name] for name, _ in SEMIRINGS}


def targets(every: int, index: int):
    """The (name, runner) pairs a case goes through: runner(case) -> list of slot dicts."""

    def executable(mode):
        def run(case):
            sess = compile_case(case, mode).bind()
            return [session_results(sess, case.inputs[w]) for w in range(len(case.inputs))]

        return run

    def dropin(case):
        return [run_dropin(case, w, "loop") for w in range(len(case.inputs))]

    out = [("cpu loop", executable("loop"))]
    if index % every == 0:
        out += [("cpu compiled", executable("compiled")), ("drop-in", dropin)]
    return out


def check(seed: int, semiring, dtype, every: int, index: int):
    """None if every target agrees with the reference, else (target, message, case)."""
    case = case_from_seed(seed, semiring, dtype)
    refs = [run_reference(case, w) for w in range(len(case.inputs))]
    for name, run in targets(every, index):
        try:
            for w, got in enumerate(run(case)):
                assert_same_slots(refs[w], got, case, f"{name}, inputs {w}")
        except Exception as e:  # a crash is a mismatch too: the reference ran
            msg = str(e) if isinstance(e, AssertionError) else traceback.format_exc(limit=4)
            return name, msg, case
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0, help="first seed; cases use seed, seed+1, ...")
    ap.add_argument(
        "--semiring",
        choices=["prob", "logprob", "sat", "count"],
        help="one semiring (every dtype of it); default: all",
    )
    ap.add_argument(
        "--every", type=int, default=50, help="compiled mode and the drop-in on every N-th case (default 50)"
    )
    args = ap.parse_args(argv)

    kinds = (
        [(args.semiring.upper(), d) for d in DTYPES[args.semiring.upper()]]
        if args.semiring
        else [(None, None)]
    )
    t0 = time.perf_counter()
    mismatches = 0
    last = t0
    for i in range(args.count):
        seed = args.seed + i
        semiring, dtype = kinds[i % len(kinds)]
        bad = check(seed, semiring, dtype, args.every, i)
        if bad is not None:
            mismatches += 1
            name, msg, case = bad
            again = f"python perf/fuzz.py --count 1 --seed {seed} --every 1"
            if semiring:
                again += f" --semiring {semiring.lower()}"
            print(
                f"\nMISMATCH seed {seed} ({case.semiring} {case.dtype.name}) on {name}\n"
                f"  rerun: {again}\n{msg}\n{case.listing()}",
                flush=True,
            )
        now = time.perf_counter()
        if now - last > 10 or i + 1 == args.count:
            last = now
            print(
                f"{i + 1}/{args.count} cases, {mismatches} mismatch(es), {now - t0:.0f} s",
                file=sys.stderr,
                flush=True,
            )
    print(
        f"fuzz: {args.count} cases from seed {args.seed}"
        f"{' (' + args.semiring + ')' if args.semiring else ''}: {mismatches} mismatch(es), "
        f"{time.perf_counter() - t0:.0f} s"
    )
    return min(mismatches, 100)


if __name__ == "__main__":
    sys.exit(main())
