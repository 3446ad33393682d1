"""Grid programs of the bench family that shared/ does not hold, written as bundles.

An n x m grid of d-state variables, a random table on every variable and every edge
(uniform in [0.1, 1.1), seeded), its programs emitted by catbp_jit's front end: the
junction tree of the greedy (min-fill) elimination order, upward, downward and finalize
passes, as the bench bundles' are. An n x n grid's cliques hold about n + 1 variables, so
12x12:3 has beliefs of 3^13 = 1.6 M elements. The bundles hold no expected slots: bench.py
compares the JIT with the reference interpreter run in the same process.

    python perf/grid_family.py --out /tmp/grids 12x12:3 9x9:3 16x16:2
    python perf/bench.py --dirs /tmp/grids --quick
    python perf/roofline.py --bundles /tmp/grids --quick
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np

import common  # noqa: F401  (puts the checkout on sys.path)
from catbp_jit.bundle import Bundle, save_bundle
from catbp_jit.frontend.build import build_model
from catbp_jit.frontend.graph import factor_graph
from catbp_jit.ir.ops import OpCode


def grid_graph(rows: int, cols: int, states: int, seed: int):
    rng = np.random.default_rng(seed)
    name = lambda i, j: f"v{i}_{j}"  # noqa: E731
    factors = []
    for i in range(rows):
        for j in range(cols):
            factors.append(((name(i, j),), rng.random(states) + 0.1))
            if i + 1 < rows:
                factors.append(((name(i, j), name(i + 1, j)), rng.random((states, states)) + 0.1))
            if j + 1 < cols:
                factors.append(((name(i, j), name(i, j + 1)), rng.random((states, states)) + 0.1))
    domains = {name(i, j): states for i in range(rows) for j in range(cols)}
    return factor_graph(domains, factors, name=f"grid{rows}x{cols}_d{states}")


def grid_bundle(rows: int, cols: int, states: int, semiring: str, seed: int) -> Bundle:
    graph = grid_graph(rows, cols, states, seed)
    built = build_model(graph, semiring, target="reference", plan_time=0, plan_kind="junction", exact=True)
    if any(ins.op == OpCode.LOAD_SELECTOR for p in built.programs for ins in p.instructions):
        raise SystemExit(f"{graph.name}: the programs load selectors (a grid without evidence has none)")
    dtype = np.dtype(built.sr.dtype)
    model = f"grid{rows}x{cols}_d{states}"
    return Bundle(
        name=f"{model}__{semiring.lower()}_{dtype.name}",
        model=model,
        semiring=semiring.upper(),
        dtype=dtype,
        normalized_messages=False,
        factors={fid: (np.asarray(built.values[fid]), spec) for fid, spec in built.factor_specs.items()},
        selectors={},
        programs=list(built.programs),
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("grids", nargs="+", metavar="NxM:D", help="grid sizes and states, e.g. 12x12:3")
    parser.add_argument("--out", type=Path, required=True, help="the directory the bundles go to")
    parser.add_argument("--semirings", nargs="+", default=["prob"], choices=["prob", "logprob"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for text in args.grids:
        m = re.fullmatch(r"(\d+)x(\d+):(\d+)", text)
        if not m:
            parser.error(f"{text!r}: expected NxM:D, e.g. 12x12:3")
        rows, cols, states = map(int, m.groups())
        for semiring in args.semirings:
            bundle = grid_bundle(rows, cols, states, semiring, args.seed)
            path = save_bundle(bundle, args.out / bundle.name)
            largest = max(int(np.prod(spec.shape)) for p in bundle.programs for spec in _specs(p))
            print(
                f"{path}: {sum(len(p.instructions) for p in bundle.programs)} instructions, "
                f"largest table {largest:,} elements"
            )
    return 0


def _specs(program):
    for ins in program.instructions:
        spec = ins.args.get("out_spec") if ins.op == OpCode.CONTRACT else None
        if spec is not None:
            yield spec


if __name__ == "__main__":
    sys.exit(main())
