"""bench_uai.py --task MPE: the most probable assignment of each UAI instance, timed against
the same instance's MAR solve in the same child process, and checked against pytoulbar2
(an independent exact solver) when it is installed.

Ours: `compile_model(graph, "maxlog", passes="upward")` (the upward pass of the cheaper
tree, junction or contraction) with the evidence absorbed,
then `model.mpe(evidence)` (the MAXLOG programs and the pass down the tree) timed as
bench_uai times `solve`. MAR: `compile_model(graph, "prob")` with the defaults and
`solve(evidence)`, as bench_uai's MAR rows. The aim (issue text): MPE in no more than the
MAR time on every instance MAR solves. toulbar2 at 10^-9 cost resolution, 60 s limit: its
assignment's log value from our tables, and its time; `agree` when the two log values are
within 1e-6 relative (toulbar2 rounds costs) and ours is not below its; when toulbar2
ran out of time (`(limit)`), its best is a lower bound, and ours must not be below it.
"""

from __future__ import annotations

import math
import time
from functools import partial
from pathlib import Path

TOULBAR2_LIMIT_S = 60
AGREE_REL = 1e-6


def child_mpe(
    path: Path, max_bytes: int, repeat: int, budget_s: float, plan_time: float | None, emit, timed
) -> None:
    """What a bench_uai child prints for one instance (emit: a JSON line of fields)."""
    import numpy as np

    from catbp_jit.errors import CatbpError
    from catbp_jit.frontend import compile_model
    from catbp_jit.frontend.graph import FactorGraphError
    from catbp_jit.frontend.tasks import log_values
    from uai2014 import load_instance

    graph, evidence, _ = load_instance(path)
    emit(vars=len(graph.variables), factors=len(graph.factors), evidence=len(evidence))
    options = dict(
        evidence_vars=list(evidence),
        absorb_evidence=True,
        max_clique_bytes=max_bytes,
        max_total_bytes=max_bytes,
        plan_time=plan_time,
        partial_evaluation=bool(evidence),
    )
    for task, semiring, extra in (
        ("mar", "prob", {}),
        ("mpe", "maxlog", {"passes": "upward"}),
    ):
        try:
            model = compile_model(graph, semiring, **options, **extra)
            emit(**{f"{task}_compile_s": model.times["plan_s"] + model.times["compile_s"]})
            call = partial(model.solve if task == "mar" else model.mpe, evidence)
            t0 = time.perf_counter()
            call()
            emit(**{f"{task}_first_s": time.perf_counter() - t0})
            best, median, runs, answer = timed(call, repeat, budget_s)
        except (FactorGraphError, CatbpError, MemoryError) as e:
            emit(**{f"{task}_error": str(e).splitlines()[0][:160]})
            continue
        emit(**{f"{task}_best_s": best, f"{task}_median_s": median, f"{task}_runs": runs})
        if task == "mpe":
            emit(mpe_log_value=answer.log_value)
    try:
        import pytoulbar2
    except ImportError:
        return
    cfn = pytoulbar2.CFN(resolution=9)
    cfn.Read(str(path))
    names = list(graph.variables)
    for v, s in evidence.items():
        cfn.Assign(names.index(v), s)
    t0 = time.perf_counter()
    solution = cfn.Solve(timeLimit=TOULBAR2_LIMIT_S)
    spent = time.perf_counter() - t0
    if solution:
        value = float(log_values(graph, np.array([solution[0]], dtype=np.int64))[0])
        emit(toulbar2_s=spent, toulbar2_log_value=value, toulbar2_timed_out=spent >= TOULBAR2_LIMIT_S)


def finish_row(row: dict) -> dict:
    if row.get("mpe_best_s") and row.get("mar_best_s"):
        row["mpe_over_mar"] = row["mpe_best_s"] / row["mar_best_s"]
    ours, theirs = row.get("mpe_log_value"), row.get("toulbar2_log_value")
    if ours is not None and theirs is not None:
        scale = max(1.0, abs(ours)) if math.isfinite(ours) else 1.0
        if not (math.isfinite(ours) and math.isfinite(theirs)):
            row["agree"] = ours == theirs
        elif row.get("toulbar2_timed_out"):  # its best so far is only a lower bound
            row["agree"] = ours >= theirs - AGREE_REL * scale
        else:
            row["agree"] = abs(ours - theirs) <= AGREE_REL * scale and ours >= theirs - 1e-9 * scale
    return row


HEADER = (
    "| instance | vars | ev | MAR best | MPE compile | MPE first | MPE best | MPE median | MPE / MAR "
    "| MPE log value | toulbar2 log value | toulbar2 | agree |"
)
RULE = "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|"


def table_row(r: dict, fmt_s) -> str:
    if "mpe_best_s" not in r:
        why = r.get("mpe_error") or r.get("status") or "no answer"
        where = f"| {r['name']} | {r.get('vars', '-')} | {r.get('evidence', '-')}"
        return f"{where} | {fmt_s(r.get('mar_best_s'))} | {why} ||||||||"
    ratio = r.get("mpe_over_mar")
    tb2 = r.get("toulbar2_log_value")
    tb2_s = fmt_s(r.get("toulbar2_s")) + (" (limit)" if r.get("toulbar2_timed_out") else "")
    return (
        f"| {r['name']} | {r['vars']} | {r['evidence']} | {fmt_s(r.get('mar_best_s'))} "
        f"| {fmt_s(r.get('mpe_compile_s'))} | {fmt_s(r.get('mpe_first_s'))} | {fmt_s(r['mpe_best_s'])} "
        f"| {fmt_s(r['mpe_median_s'])} | {'-' if ratio is None else f'{ratio:.3g}'} "
        f"| {r['mpe_log_value']:.9f} | {'-' if tb2 is None else f'{tb2:.9f}'} "
        f"| {tb2_s if tb2 is not None else '-'} | {r.get('agree', '-')} |"
    )


def summary(rows) -> list:
    lines = []
    ratios = [(r["mpe_over_mar"], r["name"]) for r in rows if r.get("mpe_over_mar")]
    if ratios:
        over = [f"{n} {x:.3g}" for x, n in ratios if x > 1]
        geo = math.exp(sum(math.log(x) for x, _ in ratios) / len(ratios))
        lines.append(
            f"- MPE time / MAR time: geometric mean {geo:.3g} over {len(ratios)} instances; "
            f"above 1 (aim: none): {', '.join(over) or 'none'}"
        )
    disagree = [r["name"] for r in rows if r.get("agree") is False]
    checked = sum(1 for r in rows if "agree" in r)
    if checked:
        lines.append(f"- toulbar2 checked {checked} instances; disagree: {', '.join(disagree) or 'none'}")
    return lines


CSV_FIELDS = [
    "name",
    "vars",
    "factors",
    "evidence",
    "status",
    "mar_compile_s",
    "mar_first_s",
    "mar_best_s",
    "mar_median_s",
    "mar_runs",
    "mar_error",
    "mpe_compile_s",
    "mpe_first_s",
    "mpe_best_s",
    "mpe_median_s",
    "mpe_runs",
    "mpe_error",
    "mpe_log_value",
    "mpe_over_mar",
    "toulbar2_s",
    "toulbar2_log_value",
    "toulbar2_timed_out",
    "agree",
]
