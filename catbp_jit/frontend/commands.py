"""`catbp-jit solve` and `catbp-jit plan`: exact inference on a model file.

MODEL is a `.uai` or `.bif` file (optionally `.gz`), or the name of a bnlearn network
fetched by `python -m catbp_jit.frontend.bnlearn` (asia, alarm, ...).
"""

from __future__ import annotations

import argparse
import contextlib
import decimal
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..cli_errors import CliError, check_kernel_cache
from ..errors import CatbpError, name_list, shown
from ..interop.pyagrum import PYAGRUM_SUFFIXES, read_pyagrum_file
from ..memory import format_bytes
from ..progress import close as close_progress
from ..progress import command_lines
from ..semiring import SEMIRING_NAMES
from ..target import MODEL_NAMES, get_for_model
from .graph import FactorGraph, FactorGraphError
from .model import CompiledModel, Solution, map_query
from .model_source import DEFAULT_BUCKETS
from .search import DEFAULT_PLAN_TIME, MIN_TRIALS, OVERRUN

# our own readers; then the formats read through pyAgrum when it is installed
SUFFIXES = (".uai", ".uai.gz", ".bif", ".bif.gz", *PYAGRUM_SUFFIXES)


# Exit statuses of solve and plan (catbp-jit's own: 2 is every input error).
EXIT_OK, EXIT_NO_ANSWER = 0, 1
EXIT_STATUS_HELP = (
    "exit status: 0 answered; 1 no answer exists (Z = 0: the evidence is "
    "impossible, so there are no marginals); 2 bad input (a message on stderr)"
)


class CommandError(Exception):
    """A usage or input error: printed on one line, exit status 2."""


def read_model(spec: str) -> FactorGraph:
    path = Path(spec)
    name = path.name.lower()
    if path.is_dir():
        raise CommandError(f"{spec}: is a directory, not a model file")
    if path.exists():
        if name.endswith((".uai", ".uai.gz")):
            from .uai import read_uai

            return read_uai(path)
        if name.endswith((".bif", ".bif.gz")):
            from .bif import read_bif

            return read_bif(path)
        if name.endswith(PYAGRUM_SUFFIXES):
            try:
                return read_pyagrum_file(path)
            except ImportError as e:  # pyAgrum is not installed: say how to get it
                raise CommandError(f"{spec}: {e}") from None
        raise CommandError(f"{spec}: unknown model format (expected one of {', '.join(SUFFIXES)})")
    from . import bnlearn

    if spec in bnlearn.NETWORKS:
        return bnlearn.load_network(spec)
    raise CommandError(
        f"{spec}: no such file, and not a bnlearn network name ({', '.join(bnlearn.NETWORKS[:6])}, ...)"
    )


def read_evidence(args: argparse.Namespace, graph: FactorGraph) -> dict[str, object]:
    """{variable: state} from --evidence and every --observe. A variable given twice must
    name the same state both times (as index or name): the last one does not silently win."""
    evidence: dict[str, object] = {}
    if args.evidence:
        path = Path(args.evidence)
        if not path.exists():
            raise CommandError(f"{path}: no such evidence file")
        if path.suffix == ".json":
            evidence.update(_json_evidence(path, graph))
        else:
            from .uai import read_evidence as read_evid

            evidence.update(read_evid(path, graph))
    for item in args.observe or ():
        var, sep, value = item.partition("=")
        if not sep:
            raise CommandError(f"--observe {item!r}: expected VAR=STATE")
        state = (
            int(value)
            if value.isascii() and value.isdigit() and value not in graph.states.get(var, ())
            else value
        )
        if var in evidence and _state_key(graph, var, evidence[var]) != _state_key(graph, var, state):
            raise CommandError(f"--observe {item!r}: {var} is already observed as {evidence[var]!r}")
        evidence.setdefault(var, state)
    unknown = [v for v in evidence if v not in graph.variables]
    if unknown:
        raise CommandError(f"{graph.name}: evidence on unknown variable(s) {name_list(unknown, repr)}")
    return evidence


def _json_evidence(path: Path, graph: FactorGraph) -> dict[str, object]:
    """A JSON object {variable: state index or name}, each variable once."""

    def pairs(items):
        out: dict[str, object] = {}
        for var, state in items:
            if var in out and _state_key(graph, var, out[var]) != _state_key(graph, var, state):
                raise CommandError(
                    f"{path}: {shown(var)} is observed twice, as {shown(out[var])} and {shown(state)}"
                )
            out.setdefault(var, state)
        return out

    try:
        # utf-8-sig: a file saved by Notepad or Excel starts with a byte-order mark
        doc = json.loads(path.read_bytes().decode("utf-8-sig"), object_pairs_hook=pairs)
    except UnicodeDecodeError:
        raise CommandError(f"{path}: not a UTF-8 text file (JSON evidence)") from None
    except (ValueError, RecursionError) as e:  # JSONDecodeError; arrays nested thousands deep
        raise CommandError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise CommandError(
            f"{path}: JSON evidence must be an object {{variable: state}}, got "
            f"{type(doc).__name__} {json.dumps(doc)[:40]}"
        )
    return doc


def _state_key(graph: FactorGraph, var: str, state: object) -> object:
    """The state index that `state` names, so that 'yes' and 0 compare equal."""
    names = graph.states.get(var, ())
    return names.index(state) if isinstance(state, str) and state in names else state


def _state_labels(graph: FactorGraph, v: str) -> tuple[str, ...]:
    return graph.states.get(v) or tuple(str(i) for i in range(graph.variables[v]))


def cmd_solve(args: argparse.Namespace) -> int:
    if args.dask_timeout is not None and not args.dask:  # it would be ignored
        raise CommandError("--dask-timeout goes with --dask ADDRESS")
    if args.dask_timeout is not None and not args.dask_timeout > 0:
        raise CommandError(f"--dask-timeout must be more than 0 seconds, got {args.dask_timeout:g}")
    if args.dask or args.workers:
        return solve_table_on_dask(args)
    if args.output and not args.evidence_table:  # it would be ignored: the answer is printed
        raise CommandError(
            "-o/--output applies to --evidence-table only (one model's answer "
            "goes to standard output; redirect it to save it)"
        )
    graph = read_model(args.model)
    if args.evidence_table:
        return solve_table(args, graph)
    args.format = args.format or "text"
    evidence = read_evidence(args, graph)
    if get_for_model(args.target).compiled:
        check_kernel_cache()
    if args.samples is not None or args.task in ("MPE", "MAP"):
        return solve_task(args, graph, evidence)
    if args.query:
        raise CommandError("--query applies to --task MAP only")
    # progress lines on stderr once compiling has taken a while (progress.py)
    progress = command_lines(args.quiet)
    try:
        model = CompiledModel(
            graph,
            args.semiring,
            evidence_vars=tuple(evidence),
            absorb_evidence=True,
            target=args.target,
            plan_time=args.plan_time,
            progress=progress,
        )
        t0 = time.perf_counter()
        sol = model.solve(evidence)
        run_s = time.perf_counter() - t0
    finally:
        close_progress(progress)
    why_not = _no_answer(sol, evidence)
    status = EXIT_OK if why_not is None else EXIT_NO_ANSWER

    marginals = args.task == "MAR"
    if args.format == "uai":
        from .uai import format_mar, format_pr

        if not marginals:
            print(format_pr(sol.log_Z), end="")
            return status
        if why_not is not None:  # no MAR exists; stdout stays a valid (empty) answer
            print(f"catbp-jit: {graph.name}: Z is 0: {why_not}", file=sys.stderr)
            return status
        print(format_mar(graph, sol.marginals), end="")
        return status
    if args.format == "json":
        doc = {
            "model": graph.name,
            "semiring": sol.semiring,
            "evidence": evidence,
            "answered": why_not is None,
            "reason": why_not and f"Z is 0: {why_not}",
            "Z": _json_z(sol.Z),
            "log_Z": sol.log_Z,
            "marginals": {v: (None if why_not else m.tolist()) for v, m in sol.marginals.items()}
            if marginals
            else None,
            "states": {v: list(_state_labels(graph, v)) for v in graph.variables},
            "plan": model.stats,
            "times": {**model.times, "run_s": run_s},
        }
        # NaN and inf are not JSON: they become null (and the reason says why)
        print(json.dumps(_finite_or_null(doc), indent=1, allow_nan=False))
        return status
    st = model.stats
    print(f"model:     {graph.name} ({len(graph.variables)} variables, {len(graph.factors)} factors)")
    print(f"semiring:  {sol.semiring}")
    if evidence:
        print(f"evidence:  {', '.join(f'{v}={x}' for v, x in evidence.items())}")
    if model.contraction is not None:
        print(
            f"plan:      contraction tree, {st['contractions']} contractions, largest loop "
            f"{st['max_loop_states']:,} states, {st['stored_states']:,} states kept"
        )
    else:
        print(
            f"plan:      {st['cliques']} cliques, largest {st['max_clique_states']:,} states "
            f"({st['max_clique_variables']} variables), {st['total_states']:,} states in all"
        )
    print(f"log Z:     {sol.log_Z!r}")
    print(f"Z:         {_text_z(sol.Z)}" + (f" ({why_not})" if why_not else ""))
    print(
        f"time:      plan {model.times['plan_s']:.3f} s, compile {model.times['compile_s']:.3f} s, "
        f"run {run_s * 1e3:.3f} ms ({args.target})"
    )
    if not marginals:
        return status
    if why_not:
        print("marginals: undefined")
        return status
    if not graph.variables:
        print("marginals: none (the model has no variables)")
        return status
    print("marginals:")
    width = max(len(v) for v in graph.variables)
    for v, m in sol.marginals.items():
        labels = _state_labels(graph, v)
        cells = "  ".join(f"{s}={_fmt(x)}" for s, x in zip(labels, np.asarray(m).tolist()))
        print(f"  {v:<{width}}  {cells}")
    return status


def solve_task(args: argparse.Namespace, graph: FactorGraph, evidence: dict[str, object]) -> int:
    """--task MPE or MAP (an assignment), or --samples N (a CSV of posterior samples)."""
    if args.task == "MAP" and not args.query:
        raise CommandError("--task MAP needs --query (variable names, comma-separated, or a UAI .query file)")
    if args.query and args.task != "MAP":
        raise CommandError("--query applies to --task MAP only")
    if args.samples is not None and (args.task in ("MPE", "MAP") or args.format != "text"):
        raise CommandError("--samples writes a CSV of samples: it takes no --task MPE/MAP and no --format")
    progress = command_lines(args.quiet)
    try:
        if args.task == "MAP":
            query = _query(args.query, graph)
            t0 = time.perf_counter()
            answer = map_query(graph, query, evidence, target=args.target)
            run_s = time.perf_counter() - t0
            assignment, log_value = answer.assignment, answer.log_value
        else:
            # MPE and samples run junction-tree programs (their beliefs are read)
            semiring = "logprob" if args.samples is not None else "maxlog"
            model = CompiledModel(
                graph,
                semiring,
                evidence_vars=tuple(evidence),
                absorb_evidence=True,
                target=args.target,
                # (samples go down a junction tree; one MPE, down either kind)
                plan_kind="junction" if args.samples is not None else "auto",
                passes="upward",
                plan_time=args.plan_time,
                progress=progress,
            )
            t0 = time.perf_counter()
            if args.samples is not None:
                samples = model.sample(args.samples, evidence, seed=args.seed)
                _write_samples(graph, samples)
                return EXIT_OK
            best = model.mpe(evidence)
            run_s = time.perf_counter() - t0
            query = tuple(graph.variables)
            assignment, log_value = best.assignment, best.log_value
    finally:
        close_progress(progress)
    if assignment is None:
        print(
            f"catbp-jit: {graph.name}: the evidence is impossible (probability 0): no {args.task}",
            file=sys.stderr,
        )
        return EXIT_NO_ANSWER
    if args.format == "uai":
        from .uai import format_mmap, format_mpe

        print(
            format_mpe(graph, assignment) if args.task == "MPE" else format_mmap(graph, assignment, query),
            end="",
        )
        return EXIT_OK
    labels = {v: _state_labels(graph, v)[assignment[v]] for v in query}
    if args.format == "json":
        doc = {
            "model": graph.name,
            "task": args.task,
            "evidence": evidence,
            "log_value": log_value,
            "assignment": {v: assignment[v] for v in query},
            "states": labels,
            "time_s": run_s,
        }
        print(json.dumps(_finite_or_null(doc), indent=1, allow_nan=False))
        return EXIT_OK
    print(f"model:     {graph.name} ({len(graph.variables)} variables, {len(graph.factors)} factors)")
    print(f"task:      {args.task}" + (f" over {len(query)} query variables" if args.task == "MAP" else ""))
    if evidence:
        print(f"evidence:  {', '.join(f'{v}={x}' for v, x in evidence.items())}")
    print(f"log value: {log_value!r}")
    print(f"time:      {run_s * 1e3:.3f} ms ({args.target})")
    print("assignment:")
    width = max(len(v) for v in query)
    for v in query:
        print(f"  {v:<{width}}  {labels[v]}")
    return EXIT_OK


def _query(text: str, graph: FactorGraph) -> tuple[str, ...]:
    """--query: a UAI .query file, or variable names separated by commas."""
    path = Path(text)
    if path.suffix == ".query" or path.is_file():
        from .uai import read_query

        return read_query(path, graph)
    names = tuple(v.strip() for v in text.split(",") if v.strip())
    unknown = [v for v in names if v not in graph.variables]
    if unknown:
        raise CommandError(f"--query: {graph.name} has no variable(s) {name_list(unknown, repr)}")
    return names


def _write_samples(graph: FactorGraph, samples: np.ndarray) -> None:
    """Samples as CSV on stdout: a header of the variables, a row of states per sample."""
    import csv

    writer = csv.writer(sys.stdout)
    writer.writerow(list(graph.variables))
    labels = [np.array(_state_labels(graph, v), dtype=object) for v in graph.variables]
    columns = [lab[samples[:, j]] for j, lab in enumerate(labels)]
    writer.writerows(zip(*columns))


def solve_table(args: argparse.Namespace, graph: FactorGraph) -> int:
    """--evidence-table: every row of the table solved in batches, one posterior row each."""
    from .table import (
        PosteriorWriter,
        count_rows,
        mpe_header,
        mpe_rows,
        posterior_rows,
        read_chunks,
        table_columns,
    )

    if args.evidence or args.observe:
        raise CommandError(
            "--evidence-table cannot be combined with --evidence or --observe "
            "(put those columns in the table)"
        )
    if args.format is not None:
        raise CommandError(
            "--evidence-table writes a table (CSV, or Parquet with -o FILE.parquet); --format does not apply"
        )
    path = Path(args.evidence_table)
    if not path.is_file():
        raise CommandError(f"{path}: no such evidence table")
    columns = table_columns(path)
    unknown = [c for c in columns if c not in graph.variables]
    if unknown or len(set(columns)) != len(columns):
        raise CommandError(
            f"{path}: the header must name distinct variables of {graph.name}; "
            f"unknown or repeated: {name_list(unknown, repr) or 'repeated'}"
        )
    if args.task in ("MAP", "PR") or args.samples is not None or args.query:
        raise CommandError("--evidence-table answers --task MAR (posteriors) or MPE (assignments) per row")
    mpe = args.task == "MPE"
    if get_for_model(args.target).compiled:
        check_kernel_cache()
    progress = command_lines(args.quiet)
    try:
        model = CompiledModel(
            graph,
            "maxlog" if mpe else args.semiring,
            evidence_vars=columns,
            target=args.target,
            buckets=DEFAULT_BUCKETS,
            plan_time=args.plan_time,
            progress=progress,
            **({"plan_kind": "junction", "passes": "upward"} if mpe else {}),
        )
    finally:
        close_progress(progress)  # the rows have their own progress bar
    from tqdm import tqdm

    from ..atomic import replacing

    out = Path(args.output) if args.output else None
    rows = impossible = 0
    # a file is written beside `out` and renamed over it at the end: a bad row halfway
    # leaves the old file as it was
    with (
        replacing(out) if out else contextlib.nullcontext() as tmp,
        tqdm(
            total=count_rows(path),
            unit="rows",
            desc=f"solving {path.name}",
            file=sys.stderr,
            disable=args.quiet,
            dynamic_ncols=True,
        ) as bar,
        PosteriorWriter(
            graph,
            tmp,
            sys.stdout,
            parquet=out is not None and out.suffix == ".parquet",
            header=mpe_header(graph) if mpe else None,
        ) as writer,
    ):
        for chunk in read_chunks(path, graph, columns):
            if mpe:
                best = model.mpe_batch(chunk)
                writer.write(mpe_rows(best, rows))
                log_values = best.log_values
            else:
                res = model.solve_batch(chunk)
                writer.write(posterior_rows(graph, res, rows))
                log_values = res.log_Z
            rows += len(chunk)
            impossible += int(np.count_nonzero(log_values == -math.inf))
            bar.update(len(chunk))
    if not args.quiet:
        print(
            f"catbp-jit: {rows} rows solved"
            + (f", {impossible} with impossible evidence (empty answers)" if impossible else "")
            + (f", written to {out}" if out else ""),
            file=sys.stderr,
        )
    return EXIT_OK


def solve_table_on_dask(args: argparse.Namespace) -> int:
    """--evidence-table T.parquet with --dask ADDRESS or --workers N: catbp_jit.dask
    solves the partitions; -o names the directory of Parquet parts, one per partition."""
    if args.dask and args.workers:
        raise CommandError(
            "--dask and --workers exclude each other (a scheduler, or a local cluster of N workers)"
        )
    table = Path(args.evidence_table or "")
    if not args.evidence_table or not (table.suffix == ".parquet" or table.is_dir()):
        raise CommandError(
            "--dask and --workers solve a Parquet evidence table: give "
            "--evidence-table FILE.parquet (or a directory of Parquet files)"
        )
    if not table.exists():
        raise CommandError(f"{table}: no such evidence table")
    scales_out = args.target in MODEL_NAMES and get_for_model(args.target).scales_out
    if args.evidence or args.observe or args.format is not None or not scales_out:
        raise CommandError(
            "--dask and --workers take no --evidence, --observe, --format or "
            "--target (the workers run the CPU kernels)"
        )
    if not args.output or Path(args.output).is_file():
        raise CommandError(
            "--dask and --workers write a directory of Parquet parts: give "
            "-o DIRECTORY (not an existing file)"
        )
    check_kernel_cache()
    from ..dask import CONNECT_TIMEOUT_S, DaskMissingError

    try:
        from ..dask import solve_parquet

        rows = solve_parquet(
            args.model,
            str(table),
            args.output,
            scheduler=args.dask,
            workers=args.workers,
            semiring=args.semiring,
            plan_time=args.plan_time,
            progress=not args.quiet,
            connect_timeout=CONNECT_TIMEOUT_S if args.dask_timeout is None else args.dask_timeout,
        )
    except DaskMissingError as e:  # the dask extra is not installed
        raise CommandError(str(e)) from None
    if not args.quiet:
        print(f"catbp-jit: {rows} rows solved, written to {args.output}", file=sys.stderr)
    return EXIT_OK


def _non_negative(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return n


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number of workers >= 1, got {text!r}")
    return value


def _no_answer(sol: Solution, evidence: dict[str, object]) -> str | None:
    """None when Z > 0; else why Z is 0, and so there are no marginals (they are 0/0)."""
    if sol.log_Z > -math.inf:
        return None
    # exact: a PROB Z of 0 is certified by SAT before it is returned (model.py)
    why = "the evidence is impossible" if evidence else "every assignment has weight 0"
    return f"{why}: marginals are undefined"


def _text_z(z: object) -> str:
    """Z as Python would print it; a Decimal (Z beyond float64) as its digits."""
    return str(z) if isinstance(z, decimal.Decimal) else repr(z)


def _json_z(z: object) -> object:
    """A Decimal Z (beyond float64) as a string of its digits: a JSON number that large
    would be read back as inf by most parsers; log_Z carries the same value as a number."""
    return str(z) if isinstance(z, decimal.Decimal) else z


def _finite_or_null(x: object) -> object:
    """`x` with every NaN or infinite float replaced by None, for strict JSON."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite_or_null(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite_or_null(v) for v in x]
    return x


def _fmt(x: Any) -> str:
    return str(x) if isinstance(x, bool) else f"{x:.6g}"


def cmd_plan(args: argparse.Namespace) -> int:
    graph = read_model(args.model)
    evidence = read_evidence(args, graph)
    progress = command_lines(args.quiet)
    try:
        model = CompiledModel(
            graph,
            "prob",
            evidence_vars=tuple(evidence),
            absorb_evidence=True,
            target="reference",
            plan_time=args.plan_time,
            progress=progress,
        )
    finally:
        close_progress(progress)
    st, choice = model.stats, model.plan_choice
    print(f"model:              {graph.name}")
    print(
        f"variables:          {len(graph.variables)}"
        + (
            f" ({len(evidence)} observed, cut into the factors: {st['variables']} planned)"
            if evidence
            else ""
        )
    )
    print(f"factors:            {len(graph.factors)}")
    print(f"cliques:            {st['cliques']}")
    print(f"max clique:         {st['max_clique_states']:,} states, {st['max_clique_variables']} variables")
    print(f"total states:       {st['total_states']:,} (beliefs), {st['separator_states']:,} (separators)")
    other = "junction" if model.plan_kind == "contraction" else "contraction"
    print(
        f"programs:           {st['programs']} (estimated {st['estimated_flops']:.3g} flops; "
        f"the {other} tree's: {st[other + '_flops']:.3g})"
    )
    if model.contraction is not None:
        print(
            f"contractions:       {st['contractions']}, largest loop {st['max_loop_states']:,} "
            f"states, largest kept tensor {st['max_stored_states']:,}, "
            f"{st['stored_states']:,} states kept"
        )
    print("instructions:       " + ", ".join(f"{p.name} {len(p)}" for p in model.programs))
    kept = "tensors and adjoints" if model.contraction is not None else "beliefs and messages"
    print(
        f"estimated cost:     {st['estimated_flops']:.3g} flops (upward and downward), "
        f"peak memory {format_bytes(st['peak_bytes'])} ({kept}, float64)"
    )
    greedy = choice.greedy_cost
    print(
        f"planner:            {choice.planner}"
        + (f", search {choice.search_s:.2f} s" if choice.search_s else "")
        + (
            f" (greedy: {greedy.flops:.3g} flops, largest clique {greedy.largest_states:,} states)"
            if greedy is not None and choice.planner != "greedy"
            else ""
        )
    )
    print(f"plan time:          {model.times['plan_s']:.3f} s")
    if not args.no_listing:
        print()
        print("\n\n".join(str(p) for p in model.programs))
    return 0


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}")
    return value


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `solve` and `plan` on the top-level `catbp-jit` parser."""

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "model",
            metavar="MODEL",
            help="a .uai or .bif file (.gz too), a file pyAgrum reads (.net, .dsl, .xdsl, .bifxml, .o3prm, "
            ".jgum, .bgum), or a fetched bnlearn network name",
        )
        p.add_argument(
            "--evidence", metavar="FILE", help="observed values: a UAI .evid file, or JSON {variable: state}"
        )
        p.add_argument(
            "--observe",
            metavar="VAR=STATE",
            action="append",
            help="one observed value (state name or index); may be repeated",
        )
        p.add_argument("--quiet", "-q", action="store_true", help="no progress lines on stderr")
        p.add_argument(
            "--plan-time",
            metavar="S",
            type=_seconds,
            default=DEFAULT_PLAN_TIME,
            help=f"seconds to search for a faster plan (default {DEFAULT_PLAN_TIME:g}; "
            f"0: greedy only; at least {MIN_TRIALS} trials run, within {OVERRUN:g}x this; "
            "a searched plan is cached by the model's structure)",
        )

    p = sub.add_parser(
        "solve",
        help="exact log Z and marginals, MPE, marginal MAP or samples of a model",
        epilog=EXIT_STATUS_HELP,
    )
    common(p)
    p.add_argument(
        "--task",
        type=str.upper,
        choices=("PR", "MAR", "MPE", "MAP"),
        default="MAR",
        help="MAR (default): log Z and every marginal; PR: log Z only; MPE: the most probable "
        "assignment of every variable; MAP: of the --query variables, the others summed out",
    )
    p.add_argument(
        "--query",
        metavar="VARS",
        help="with --task MAP: the query variables, comma-separated names or a UAI .query file",
    )
    p.add_argument(
        "--samples",
        metavar="N",
        type=_non_negative,
        help="write N exact samples of the posterior as CSV (a column per variable, state names)",
    )
    p.add_argument("--seed", metavar="S", type=int, default=None, help="with --samples: the random seed")
    p.add_argument(
        "--semiring",
        choices=[s.lower() for s in SEMIRING_NAMES],
        default="prob",
        help="prob (default), logprob, sat (satisfiable?) or count (number of models)",
    )
    # --format defaults to None so that --evidence-table (which writes a table) can refuse it
    p.add_argument(
        "--format",
        choices=("text", "uai", "json"),
        default=None,
        help="text (default), uai (the UAI MAR, PR, MPE or MMAP format, as --task says) or json",
    )
    p.add_argument(
        "--evidence-table",
        metavar="FILE",
        help="a CSV (or .parquet) table of cases: a header naming evidence "
        "variables, a row per case (state names or indices; empty: "
        "unobserved); writes one row of posteriors per case",
    )
    p.add_argument(
        "--output",
        "-o",
        metavar="FILE",
        help="with --evidence-table: write the posteriors here (.csv, or .parquet "
        "with pyarrow) instead of standard output",
    )
    p.add_argument(
        "--target",
        choices=("cpu", "cuda", "reference"),
        default="cpu",
        help="the JIT on the CPU (default) or an NVIDIA GPU (needs numba-cuda: "
        "pip install -e '.[cuda]'), or the reference interpreter",
    )
    p.add_argument(
        "--dask",
        metavar="ADDRESS",
        help="with a Parquet --evidence-table: solve its partitions on the Dask "
        "scheduler at ADDRESS (MODEL may be a profile from `catbp-jit aot`); "
        "-o DIR gets one Parquet part per partition (docs/scaling.md)",
    )
    p.add_argument(
        "--dask-timeout",
        metavar="SECONDS",
        type=_seconds,
        help="how long --dask keeps trying to reach its scheduler (default 10)",
    )
    p.add_argument(
        "--workers", metavar="N", type=_positive, help="as --dask, on a local cluster of N worker processes"
    )
    p.set_defaults(func=guarded(cmd_solve))

    p = sub.add_parser("plan", help="junction tree statistics and the program listing")
    common(p)
    p.add_argument("--no-listing", action="store_true", help="statistics only")
    p.set_defaults(func=guarded(cmd_plan))


def guarded(cmd: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """`cmd` with the front end's input errors turned into CliError (one line, exit 2)."""

    def run(args: argparse.Namespace) -> int:
        try:
            return cmd(args)
        except BrokenPipeError:  # output piped into `head`: main() stops quietly
            raise
        except (CommandError, FactorGraphError, CatbpError, OSError) as e:
            raise CliError(str(e)) from None

    return run
