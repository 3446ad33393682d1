"""`catbp-jit solve` and `catbp-jit plan`: exact inference on a model file.

MODEL is a `.uai` or `.bif` file (optionally `.gz`), or the name of a bnlearn network
fetched by `python -m catbp_jit.frontend.bnlearn` (asia, alarm, ...).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Dict

import numpy as np

from ..errors import CatbpError
from .graph import FactorGraph, FactorGraphError
from .model import SEMIRINGS, CompiledModel

SUFFIXES = (".uai", ".uai.gz", ".bif", ".bif.gz")


class CommandError(Exception):
    """A usage or input error: printed on one line, exit status 2."""


def read_model(spec: str) -> FactorGraph:
    path = Path(spec)
    name = path.name.lower()
    if path.exists():
        if name.endswith((".uai", ".uai.gz")):
            from .uai import read_uai
            return read_uai(path)
        if name.endswith((".bif", ".bif.gz")):
            from .bif import read_bif
            return read_bif(path)
        raise CommandError(f"{spec}: unknown model format (expected one of {', '.join(SUFFIXES)})")
    from . import bnlearn
    if spec in bnlearn.NETWORKS:
        return bnlearn.load_network(spec)
    raise CommandError(f"{spec}: no such file, and not a bnlearn network name "
                       f"({', '.join(bnlearn.NETWORKS[:6])}, ...)")


def read_evidence(args: argparse.Namespace, graph: FactorGraph) -> Dict[str, object]:
    evidence: Dict[str, object] = {}
    if args.evidence:
        path = Path(args.evidence)
        if not path.exists():
            raise CommandError(f"{path}: no such evidence file")
        if path.suffix == ".json":
            try:
                evidence.update(json.loads(path.read_text()))
            except ValueError as e:
                raise CommandError(f"{path}: not valid JSON ({e})") from None
        else:
            from .uai import read_evidence as read_evid
            evidence.update(read_evid(path, graph))
    for item in args.observe or ():
        var, sep, value = item.partition("=")
        if not sep:
            raise CommandError(f"--observe {item!r}: expected VAR=STATE")
        evidence[var] = int(value) if value.isdigit() and value not in graph.states.get(var, ()) else value
    unknown = [v for v in evidence if v not in graph.variables]
    if unknown:
        raise CommandError(f"{graph.name}: evidence on unknown variable(s) {', '.join(map(repr, unknown))}")
    return evidence


def _progress(quiet: bool):
    start = time.perf_counter()

    def say(msg: str) -> None:
        if not quiet:
            print(f"[{time.perf_counter() - start:7.2f}s] {msg}", file=sys.stderr, flush=True)
    return say


def _state_labels(graph: FactorGraph, v: str):
    return graph.states.get(v) or tuple(str(i) for i in range(graph.variables[v]))


def cmd_solve(args: argparse.Namespace) -> int:
    graph = read_model(args.model)
    evidence = read_evidence(args, graph)
    model = CompiledModel(graph, args.semiring, evidence_vars=tuple(evidence), absorb_evidence=True,
                          target=args.target, progress=_progress(args.quiet))
    t0 = time.perf_counter()
    sol = model.solve(evidence)
    run_s = time.perf_counter() - t0

    if args.format == "uai":
        from .uai import format_mar
        print(format_mar(graph, sol.marginals), end="")
        return 0
    if args.format == "json":
        doc = {"model": graph.name, "semiring": sol.semiring, "evidence": evidence,
               "Z": sol.Z, "log_Z": sol.log_Z if math.isfinite(sol.log_Z) else None,
               "marginals": {v: m.tolist() for v, m in sol.marginals.items()},
               "states": {v: list(_state_labels(graph, v)) for v in graph.variables},
               "plan": model.stats, "times": {**model.times, "run_s": run_s}}
        print(json.dumps(doc, indent=1))
        return 0
    st = model.stats
    print(f"model:     {graph.name} ({len(graph.variables)} variables, {len(graph.factors)} factors)")
    print(f"semiring:  {sol.semiring}")
    if evidence:
        print(f"evidence:  {', '.join(f'{v}={x}' for v, x in evidence.items())}")
    print(f"plan:      {st['cliques']} cliques, largest {st['max_clique_states']:,} states "
          f"({st['max_clique_variables']} variables), {st['total_states']:,} states in all")
    print(f"log Z:     {sol.log_Z!r}")
    print(f"Z:         {sol.Z!r}")
    print(f"time:      plan {model.times['plan_s']:.3f} s, compile {model.times['compile_s']:.3f} s, "
          f"run {run_s * 1e3:.3f} ms ({args.target})")
    print("marginals:")
    width = max(len(v) for v in graph.variables)
    for v, m in sol.marginals.items():
        labels = _state_labels(graph, v)
        cells = "  ".join(f"{s}={_fmt(x)}" for s, x in zip(labels, np.asarray(m).tolist()))
        print(f"  {v:<{width}}  {cells}")
    return 0


def _fmt(x) -> str:
    return str(x) if isinstance(x, bool) else f"{x:.6g}"


def cmd_plan(args: argparse.Namespace) -> int:
    graph = read_model(args.model)
    evidence = read_evidence(args, graph)
    model = CompiledModel(graph, "prob", evidence_vars=tuple(evidence), absorb_evidence=True,
                          target="reference")
    st = model.stats
    print(f"model:              {graph.name}")
    print(f"variables:          {len(graph.variables)}" +
          (f" ({len(evidence)} observed, cut into the factors: {st['variables']} planned)"
           if evidence else ""))
    print(f"factors:            {len(graph.factors)}")
    print(f"cliques:            {st['cliques']}")
    print(f"max clique:         {st['max_clique_states']:,} states, {st['max_clique_variables']} variables")
    print(f"total states:       {st['total_states']:,} (beliefs), {st['separator_states']:,} (separators)")
    print("instructions:       " + ", ".join(f"{p.name} {len(p)}" for p in model.programs))
    print(f"plan time:          {model.times['plan_s']:.3f} s")
    if not args.no_listing:
        print()
        print("\n\n".join(str(p) for p in model.programs))
    return 0


def add_commands(sub) -> None:
    """Register `solve` and `plan` on the top-level `catbp-jit` parser."""
    def common(p):
        p.add_argument("model", metavar="MODEL",
                       help="a .uai or .bif file (.gz too), or a fetched bnlearn network name")
        p.add_argument("--evidence", metavar="FILE",
                       help="observed values: a UAI .evid file, or JSON {variable: state}")
        p.add_argument("--observe", metavar="VAR=STATE", action="append",
                       help="one observed value (state name or index); may be repeated")

    p = sub.add_parser("solve", help="exact log Z and marginals of a model")
    common(p)
    p.add_argument("--semiring", choices=[s.lower() for s in SEMIRINGS], default="prob",
                   help="prob (default), logprob, sat (satisfiable?) or count (number of models)")
    p.add_argument("--format", choices=("text", "uai", "json"), default="text",
                   help="text (default), uai (the UAI MAR format) or json")
    p.add_argument("--target", choices=("cpu", "reference"), default="cpu",
                   help="the JIT on the CPU (default) or the reference interpreter")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=_guarded(cmd_solve))

    p = sub.add_parser("plan", help="junction tree statistics and the program listing")
    common(p)
    p.add_argument("--no-listing", action="store_true", help="statistics only")
    p.set_defaults(func=_guarded(cmd_plan))


def _guarded(cmd):
    def run(args: argparse.Namespace) -> int:
        try:
            return cmd(args)
        except (CommandError, FactorGraphError, CatbpError, OSError) as e:
            from ..cli import CliError
            raise CliError(str(e)) from None
    return run
