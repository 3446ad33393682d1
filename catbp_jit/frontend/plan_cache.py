"""Searched plans on disk, so that a search is paid once per model structure.

A plan is filed under the sha256 of what the order depends on: variable sizes, factor
scopes, evidence variables, whether they are absorbed, and the limits (PlanKey). Files live
in the kernel cache directory's `plans/` (CATBP_JIT_CACHE_DIR; none with
CATBP_JIT_CACHE=off), written whole or not at all (temp file, then rename). A file is
data, never trusted: it is used only if it parses, names the same key, and its order is a
permutation of the variables. Any order gives right answers (only speed and size depend on
it) and the finished plan is checked against the limits again, so a wrong but valid order
cannot give a wrong answer. A damaged file is replanned with a warning and rewritten.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import dataclass
from typing import Any

from .. import environment
from ..atomic import atomic_write
from ..cache import default_cache_dir
from .plan import PlanLimits

FORMAT = 5  # bump when the file layout or what an order means changes (2: scored by
# the cheaper of its junction and contraction trees), or when the search improves so much
# that plans filed before should be searched again (3: trees ranked by flops plus kept
# states, and a refused greedy order finished without the limits competes: search.py; 4:
# seeded trials, so that a structure gets the same plan from every search; 5: at least
# search.MIN_TRIALS trials, past the budget if need be)


class PlanCacheWarning(UserWarning):
    """A cached plan file was unreadable or inconsistent: it was ignored and replanned."""


@dataclass(frozen=True)
class PlanKey:
    sizes: tuple[int, ...]
    scopes: tuple[tuple[int, ...], ...]
    evidence: tuple[int, ...]  # evidence variables kept as indicators (indices)
    absorbed: tuple[str, ...]  # evidence variables cut out of the graph (names)
    limits: PlanLimits
    kinds: tuple[str, ...] = ("junction", "contraction")  # the programs the plan may emit

    def digest(self) -> str:
        doc = [
            FORMAT,
            list(self.sizes),
            [list(s) for s in self.scopes],
            list(self.evidence),
            list(self.absorbed),
            self.limits.max_clique_states,
            self.limits.max_total_states,
            list(self.kinds),
        ]
        return hashlib.sha256(json.dumps(doc, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class CachedPlan:
    order: tuple[int, ...]
    planner: str  # who found it: "greedy" or "cotengra"
    plan_time: float  # the budget it was searched with
    # the searched contraction tree (search.Searched.path) when it won, else None
    path: tuple[tuple[int, int], ...] | None = None


def plan_dir() -> str | None:
    """Where plans are kept, or None when the kernel cache is off."""
    if environment.cache_policy() == "off":
        return None
    return os.path.join(default_cache_dir(), "plans")


def load(key: PlanKey, directory: str | None = None) -> CachedPlan | None:
    """The plan filed under `key`, or None (missing; damaged: PlanCacheWarning)."""
    directory = directory or plan_dir()
    if directory is None:
        return None
    digest = key.digest()
    path = os.path.join(directory, f"{digest}.json")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except (FileNotFoundError, NotADirectoryError):  # (a file where the directory is)
        return None
    except OSError as e:
        warnings.warn(
            f"{path}: cannot read the cached plan ({e}); planning anew", PlanCacheWarning, stacklevel=2
        )
        return None
    why = None
    try:
        doc = json.loads(data.decode("utf-8"))
        why = _problem(doc, digest, len(key.sizes), sum(1 for s in key.scopes if s))
    except (UnicodeDecodeError, ValueError) as e:
        why = f"not valid JSON: {e}"
    if why:
        warnings.warn(
            f"{path}: damaged plan cache file ({why}); planning anew", PlanCacheWarning, stacklevel=2
        )
        return None
    path = doc.get("path")
    return CachedPlan(
        tuple(doc["order"]),
        doc["planner"],
        float(doc["plan_time"]),
        None if path is None else tuple(tuple(p) for p in path),
    )


def _problem(doc: Any, digest: str, n: int, tensors: int) -> str | None:
    """Why `doc` is not a plan for this key (n variables, `tensors` factors with a
    non-empty scope), or None."""
    if not isinstance(doc, dict):
        return "not an object"
    if doc.get("format") != FORMAT or doc.get("key") != digest:
        return "written for another format or model"
    order = doc.get("order")
    if (
        not isinstance(order, list)
        or not all(type(v) is int for v in order)
        or sorted(order) != list(range(n))
    ):
        return f"the order is not a permutation of the {n} variables"
    if doc.get("planner") not in ("greedy", "cotengra"):
        return "unknown planner"
    plan_time: Any = doc.get("plan_time")  # any JSON value: its type is checked here
    if type(plan_time) not in (int, float) or not plan_time >= 0:
        return "bad plan_time"
    path = doc.get("path")
    if path is not None and not _is_ssa_path(path, tensors):
        return f"the path is not a contraction of the {tensors} tensors"
    return None


def _is_ssa_path(path: Any, tensors: int) -> bool:
    """Does `path` contract each of `tensors` inputs and each pair made, once at most?"""
    if not isinstance(path, list) or len(path) >= max(tensors, 1):
        return False
    used = set()
    for k, pair in enumerate(path):
        made = tensors + k  # the ids so far
        if not (
            isinstance(pair, list)
            and len(pair) == 2
            and all(type(i) is int and 0 <= i < made and i not in used for i in pair)
            and pair[0] != pair[1]
        ):
            return False
        used.update(pair)
    return True


def store(key: PlanKey, plan: CachedPlan, directory: str | None = None) -> None:
    """File `plan` under `key`; an unwritable directory only costs the next search."""
    directory = directory or plan_dir()
    if directory is None:
        return
    digest = key.digest()
    doc = {
        "format": FORMAT,
        "key": digest,
        "planner": plan.planner,
        "plan_time": plan.plan_time,
        "order": list(plan.order),
        "path": None if plan.path is None else [list(p) for p in plan.path],
    }
    try:
        os.makedirs(directory, 0o700, exist_ok=True)
        atomic_write(os.path.join(directory, f"{digest}.json"), json.dumps(doc).encode())
    except OSError as e:
        warnings.warn(f"{directory}: cannot keep the searched plan ({e})", PlanCacheWarning, stacklevel=2)
