"""The saved-executable file: what `Executable.save` writes and `load` reads back.

A JSON document holding the programs, the specs of their inputs, the semiring, the target,
the mode, and the identities of the kernels the plan needed, so that `load` plans the
programs again and checks, before compiling anything, that this catbp_jit needs the same
kernels. Plain data in and out: reading and checking the document is here; planning and
building what it describes is compiler.load's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .codegen.loader import Kernel, identity_digest
from .errors import CatbpError, one_line
from .ir.adapt import adapt_slot_key, adapt_spec
from .ir.ops import Program
from .ir.schema import TensorSpec
from .plan.options import PlanOptions
from .plan.static import StaticInputs
from .semiring import VMSemiringRuntime

SAVE_FORMAT = "catbp-jit-executable"


class SavedExecutableError(CatbpError, ValueError):
    """A file that `load` cannot read as a saved executable."""


@dataclass(frozen=True)
class Saved:
    """A saved executable as read: what to plan again, and what to check the plan against."""

    where: str  # the path, quoted, for messages
    programs: list[Program]
    sr: VMSemiringRuntime
    factor_specs: dict[int, TensorSpec]
    selector_specs: dict[int, TensorSpec]
    slot_specs: dict[tuple, TensorSpec]
    target: str
    mode: str
    exact: bool
    split_reductions: bool
    split_min_terms: int
    split_outputs_below: int
    lane_sums: bool
    static: StaticInputs
    batched: dict[str, Any]  # a batched executable's ids and buckets, else empty
    kernel_identities: list[str] | None  # None in files saved before they were recorded


def saved_document(
    programs: list[Program],
    sr: VMSemiringRuntime,
    mode: str,
    target: str,
    fspecs: dict[int, TensorSpec],
    sspecs: dict[int, TensorSpec],
    lspecs: dict[tuple, TensorSpec],
    kernels: list[Kernel],
    options: PlanOptions = PlanOptions(),
) -> dict:
    """What `save` writes (a batched executable adds its batched ids and buckets)."""
    from .bundle import program_to_json, slot_key_to_json, spec_to_json

    return {
        "format": SAVE_FORMAT,
        "version": 1,
        "semiring": sr.name,
        "dtype": sr.dtype.name,
        "mode": mode,
        "target": target,
        "factor_specs": {str(k): spec_to_json(v) for k, v in fspecs.items()},
        "selector_specs": {str(k): spec_to_json(v) for k, v in sspecs.items()},
        "slot_specs": [[slot_key_to_json(k), spec_to_json(v)] for k, v in lspecs.items()],
        "programs": [program_to_json(p) for p in programs],
        "kernels": [k.key for k in kernels],
        "kernel_identities": sorted({identity_digest(k.identity) for k in kernels}),
        # part of the plan: a reassociating executable loads as one, split likewise
        "exact": options.exact,
        "split_reductions": options.split_reductions,
        "split_min_terms": options.split_min_terms,
        "split_outputs_below": options.split_outputs_below,
        # (a front end model's plan sums in order where compile()'s sums in lanes)
        "lane_sums": options.lane_sums,
    }


def write_saved(path: str | os.PathLike, doc: dict) -> None:
    from .atomic import replacing

    with replacing(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f)


def read_saved(path: str | os.PathLike, targets: Sequence[str], modes: Sequence[str]) -> Saved:
    """The saved executable at `path`, every field checked (targets, modes: those this
    catbp_jit has). A file that is not one (binary, truncated, another JSON document, a
    field of the wrong kind) raises SavedExecutableError naming the file and the field; a
    missing file FileNotFoundError."""
    from .bundle import program_from_json
    from .semiring import make_semiring

    where = repr(os.fspath(path))
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    # ValueError: not UTF-8, not JSON, or a number of over 4,300 digits; RecursionError:
    # arrays nested thousands deep
    except (ValueError, RecursionError) as e:
        raise SavedExecutableError(f"{where} is not a saved catbp_jit executable (not JSON: {e})") from None
    if not isinstance(doc, dict) or doc.get("format") != SAVE_FORMAT or doc.get("version") != 1:
        raise SavedExecutableError(f"{where} is not a saved catbp_jit executable (version 1)")

    def field(key: str, read: Callable[[Any], Any]) -> Any:
        if key not in doc:
            raise SavedExecutableError(f"{where}: no {key!r}")
        try:
            return read(doc[key])
        except (ValueError, TypeError, KeyError, AttributeError, IndexError) as e:
            raise SavedExecutableError(f"{where}: {key!r}: {one_line(str(e), 300)}") from None

    def one_of(choices):
        def read(x):
            if x not in choices:
                raise ValueError(f"{x!r} is not one of {', '.join(choices)}")
            return x

        return read

    def specs(x):
        return {int(k): adapt_spec(v) for k, v in _items(x).items()}

    def numeric_dtype(x):
        dtype = np.dtype(_items(x, str))
        if dtype.kind not in "biuf":
            raise ValueError(f"{x!r} is not a numeric dtype")
        return dtype

    def ids(x):
        return [strict_int(i) for i in _items(x, list)]

    batched = {}
    if "buckets" in doc:  # a batched executable
        batched = dict(
            batched_factors=field("batched_factors", ids),
            batched_selectors=field("batched_selectors", ids),
            buckets=field("buckets", ids),
        )
    dtype = field("dtype", numeric_dtype)

    def strings(x):
        return [_items(k, str) for k in _items(x, list)]

    saved = field("kernel_identities", strings) if "kernel_identities" in doc else None
    programs = field("programs", lambda x: [program_from_json(p) for p in _items(x, list)])
    sr = field("semiring", lambda x: make_semiring(x, dtype))
    fspecs, sspecs = field("factor_specs", specs), field("selector_specs", specs)
    lspecs = field("slot_specs", lambda x: {adapt_slot_key(k): adapt_spec(v) for k, v in _items(x, list)})
    target, mode = field("target", one_of(targets)), field("mode", one_of(modes))
    exact = field("exact", _as_bool) if "exact" in doc else True  # (older files: exact)
    split = field("split_reductions", _as_bool) if "split_reductions" in doc else False
    min_terms = PlanOptions.split_min_terms
    if "split_min_terms" in doc:  # checked as PlanOptions checks it
        min_terms = field(
            "split_min_terms", lambda x: PlanOptions(split_min_terms=strict_int(x)).split_min_terms
        )
    outputs_below = PlanOptions.split_outputs_below  # (older files: the only bar there was)
    if "split_outputs_below" in doc:
        outputs_below = field(
            "split_outputs_below",
            lambda x: PlanOptions(split_outputs_below=strict_int(x)).split_outputs_below,
        )
    lanes = field("lane_sums", _as_bool) if "lane_sums" in doc else False  # (older files: in order)
    static = StaticInputs(
        frozenset(field("static_factors", ids) if "static_factors" in doc else ()),
        frozenset(field("static_selectors", ids) if "static_selectors" in doc else ()),
    )
    return Saved(
        where,
        programs,
        sr,
        fspecs,
        sspecs,
        lspecs,
        target,
        mode,
        exact,
        split,
        min_terms,
        outputs_below,
        lanes,
        static,
        batched,
        saved,
    )


def check_saved_kernels(where: str, saved: list[str], planned: set) -> None:
    """The plan made again from the saved programs must need exactly the kernels that were
    saved, checked before any is compiled: anything else means this catbp_jit plans or
    renders differently from the one that saved the file (or the file was edited), so
    what runs would not be the profile that was saved and compiled ahead of time."""
    if planned != set(saved):
        missing, extra = sorted(set(saved) - planned), sorted(planned - set(saved))
        raise SavedExecutableError(
            f"{where}: its kernels are not the ones this catbp_jit plans for it "
            f"({len(missing)} saved but not planned now, {len(extra)} planned now but not "
            f"saved): it was saved by another version of catbp_jit or edited; compile it "
            f"again from its programs"
        )


def _as_bool(x: Any) -> bool:
    if not isinstance(x, bool):
        raise TypeError(f"expected true or false, got {type(x).__name__}")
    return x


def strict_int(x: Any) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"expected an integer, got {type(x).__name__}")
    return x


def _items(x: Any, kind: type = dict) -> Any:
    if not isinstance(x, kind):
        names: dict[type, str] = {dict: "an object", list: "an array", str: "a string"}
        raise TypeError(f"expected {names[kind]}, got {type(x).__name__}")
    return x
