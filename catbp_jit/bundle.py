"""catbp-bundle: a factor graph's CatBP programs with their inputs and expected results.

A bundle is a directory holding `bundle.json` (structure, programs, specs) and `arrays.npz`
(every tensor, keyed by the names bundle.json gives). The format is described in
`shared/corpus/FORMAT.md`; this module reads and writes it.
"""

from __future__ import annotations

import json
import lzma
import math
import numbers
import os
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import SimpleNamespace
from typing import Any, BinaryIO, cast

import numpy as np

from .atomic import replacing
from .errors import CatbpError, UnknownInputError, shown
from .ir.adapt import adapt_program, adapt_slot_key, adapt_spec
from .ir.ops import Instruction, Program
from .ir.schema import Axis, TensorSpec
from .semiring import SEMIRING_NAMES, VMSemiringRuntime, make_semiring

FORMAT_NAME = "catbp-bundle"
FORMAT_VERSION = 1
BUNDLE_JSON = "bundle.json"
ARRAYS_NPZ = "arrays.npz"

Tensor = tuple[np.ndarray, TensorSpec]


class BundleError(CatbpError, ValueError):
    """A bundle (or a saved program) that cannot be read: bad JSON, arrays, specs, programs."""


@dataclass(eq=False)  # arrays make field-wise == ambiguous; use bundle_differences()
class Bundle:
    name: str
    model: str
    semiring: str
    dtype: np.dtype
    normalized_messages: bool
    factors: dict[int, Tensor]
    selectors: dict[int, Tensor]
    programs: list[Program]
    expected_slots: dict[tuple, Tensor] | None = None
    expected_Z: float | bool | int | None = None
    Z_bruteforce: float | None = None
    path: Path | None = None

    def semiring_runtime(self) -> VMSemiringRuntime:
        return make_semiring(self.semiring, self.dtype)

    def factor_provider(self, fid: int) -> Tensor:
        try:
            return self.factors[fid]
        except KeyError:
            raise UnknownInputError(f"bundle {self.name!r} has no factor {fid!r}") from None

    def selector_provider(self, sid: int) -> Tensor:
        try:
            return self.selectors[sid]
        except KeyError:
            raise UnknownInputError(f"bundle {self.name!r} has no selector {sid!r}") from None

    def factor_specs(self) -> dict[int, TensorSpec]:
        return {fid: spec for fid, (_, spec) in self.factors.items()}

    def selector_specs(self) -> dict[int, TensorSpec]:
        return {sid: spec for sid, (_, spec) in self.selectors.items()}

    def num_instructions(self) -> int:
        return sum(len(p) for p in self.programs)


# ---------------------------------------------------------------------------------------
# JSON <-> IR


def spec_to_json(spec: TensorSpec | None) -> list | None:
    if spec is None:
        return None
    return [[ax.kind.name, ax.id, ax.size] for ax in spec.axes]


def _to_json_value(v: Any) -> Any:
    """Any canonical instruction argument as plain JSON: specs as axis lists, keys as
    [KIND, id], tuples as lists, enums by name, numpy scalars as Python numbers."""
    if isinstance(v, TensorSpec):
        return spec_to_json(v)
    if isinstance(v, Axis):
        return [v.kind.name, v.id, v.size]
    if isinstance(v, Enum):
        return v.name
    if isinstance(v, (tuple, list)):
        return [_to_json_value(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _to_json_value(x) for k, x in v.items()}
    if isinstance(v, np.generic):
        return v.item()
    return v


def slot_key_to_json(key: tuple) -> list:
    return _to_json_value(tuple(key))


def instruction_to_json(ins: Instruction) -> dict:
    return {
        "op": ins.op.name,
        "dst": ins.dst,
        "args": {k: _to_json_value(v) for k, v in ins.args.items()},
        "spec": spec_to_json(ins.spec),
    }


def program_to_json(program: Program) -> dict:
    return {"name": program.name, "instructions": [instruction_to_json(ins) for ins in program.instructions]}


def program_from_json(obj: Any) -> Program:
    """A Program from its JSON form {"name", "instructions": [{op, dst, args, spec}, ...]}.

    Each instruction goes through adapt_program, so every spelling the CatBP VM accepts is
    canonicalized the same way as for in-memory programs."""
    if not isinstance(obj, dict) or not isinstance(obj.get("instructions"), list):
        raise BundleError(f"a program must be an object with an 'instructions' list, got {obj!r:.80}")
    name = obj.get("name")
    instrs = []
    for i, d in enumerate(obj["instructions"]):
        if not isinstance(d, dict) or "op" not in d:
            raise BundleError(
                f"program {shown(name)}, instruction [{i}]: expected an object with 'op', got {d!r:.80}"
            )
        if not isinstance(d.get("args") or {}, dict):
            raise BundleError(
                f"program {shown(name)}, instruction [{i}]: 'args' must be an object, got {d['args']!r:.80}"
            )
        # adapt_instruction reads attributes, so give the dict attribute access.
        instrs.append(
            SimpleNamespace(op=d["op"], dst=d.get("dst"), args=d.get("args") or {}, spec=d.get("spec"))
        )
    try:
        return adapt_program(instrs, name=name)
    except CatbpError:  # already says which instruction and why
        raise
    except (TypeError, KeyError, AttributeError, IndexError) as e:  # an argument of the wrong kind
        raise BundleError(
            f"program {shown(name)}: an instruction argument of the wrong kind ({type(e).__name__}: {e})"
        ) from None


# ---------------------------------------------------------------------------------------
# Loading


def _bundle_dir(path: str | os.PathLike) -> Path:
    p = Path(path)
    if p.name == BUNDLE_JSON and p.is_file():
        return p.parent
    if not p.exists():
        raise FileNotFoundError(f"bundle directory {str(p)!r} does not exist")
    if not p.is_dir():
        raise BundleError(f"{str(p)!r} is neither a bundle directory nor its {BUNDLE_JSON}")
    return p


def _json_number(x: Any, what: str, where: str) -> float | bool | int | None:
    if x is None or isinstance(x, (bool, numbers.Real)):
        return cast("float | bool | int | None", x)  # a JSON number: an int, a float or a bool
    raise BundleError(f"{where}: {what} must be a number, got {shown(x)}")


def load_bundle(path: str | os.PathLike) -> Bundle:
    """Read a bundle directory (or the path of its bundle.json) fully into memory."""
    d = _bundle_dir(path)
    json_path, npz_path = d / BUNDLE_JSON, d / ARRAYS_NPZ
    if not json_path.is_file():
        raise FileNotFoundError(f"bundle {str(d)!r}: no {BUNDLE_JSON}")
    if not npz_path.is_file():
        raise FileNotFoundError(f"bundle {str(d)!r}: no {ARRAYS_NPZ}")
    try:
        with open(json_path, encoding="utf-8") as f:
            meta = json.load(f)
    # ValueError: not UTF-8, not JSON, or a number of over 4,300 digits; RecursionError:
    # arrays nested thousands deep
    except (ValueError, RecursionError) as e:
        raise BundleError(f"bundle {str(d)!r}: {BUNDLE_JSON} is not valid JSON: {e}") from None
    if not isinstance(meta, dict):
        raise BundleError(f"bundle {str(d)!r}: {BUNDLE_JSON} must hold a JSON object")

    if meta.get("format") != FORMAT_NAME:
        raise BundleError(
            f"bundle {str(d)!r}: format is {shown(meta.get('format'))}, expected {FORMAT_NAME!r}"
        )
    if meta.get("version") != FORMAT_VERSION:
        raise BundleError(
            f"bundle {str(d)!r}: unsupported {FORMAT_NAME} version "
            f"{shown(meta.get('version'))} (this reader knows version {FORMAT_VERSION})"
        )
    for k in ("name", "semiring", "dtype", "factors", "selectors", "programs"):
        if k not in meta:
            raise BundleError(f"bundle {str(d)!r}: {BUNDLE_JSON} has no {k!r}")

    name = meta["name"]
    where = f"bundle {shown(name)}"
    semiring = meta["semiring"]
    if str(semiring).upper() not in SEMIRING_NAMES + ("COUNTING",):
        raise BundleError(f"{where}: unknown semiring {shown(semiring)} (known: {', '.join(SEMIRING_NAMES)})")
    try:
        dtype = np.dtype(meta["dtype"])
    except (TypeError, ValueError):
        raise BundleError(f"{where}: unknown dtype {shown(meta['dtype'])}") from None

    # Read every array now so the bundle does not keep the npz file open.
    try:
        with np.load(npz_path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    # truncated, not a zip; NotImplementedError: an unknown compression method; RuntimeError:
    # an entry marked encrypted; LZMAError: a damaged LZMA entry
    except (
        OSError,
        ValueError,
        EOFError,
        zipfile.BadZipFile,
        zlib.error,
        NotImplementedError,
        RuntimeError,
        lzma.LZMAError,
    ) as e:
        raise BundleError(f"{where}: {ARRAYS_NPZ} cannot be read ({e})") from None

    def tensor(entry: Any, what: str) -> Tensor:
        if not isinstance(entry, dict) or "array" not in entry or "spec" not in entry:
            raise BundleError(f"{where}: {what} must be an object with 'spec' and 'array'")
        try:
            spec = adapt_spec(entry["spec"])
        except (ValueError, TypeError, KeyError) as e:
            raise BundleError(f"{where}: {what}: bad spec: {e}") from None
        if spec is None:
            raise BundleError(f"{where}: {what} has no spec")
        aname = entry["array"]
        if not isinstance(aname, str) or aname not in arrays:
            raise BundleError(f"{where}: {what}: array {shown(aname)} is missing from {ARRAYS_NPZ}")
        arr = arrays[aname]
        if arr.shape != spec.shape:
            raise BundleError(
                f"{where}: {what}: array {aname!r} has shape {arr.shape} but "
                f"its spec {spec} has shape {spec.shape}"
            )
        return arr, spec

    def tensors(table: Any, kind: str) -> dict[int, Tensor]:
        if not isinstance(table, dict):
            raise BundleError(f"{where}: {kind}s must be an object keyed by id")
        out = {}
        for k, entry in table.items():
            try:
                ident = int(k)
            except ValueError:
                raise BundleError(f"{where}: {kind} id {shown(k)} is not an integer") from None
            out[ident] = tensor(entry, f"{kind} {ident}")
        return out

    factors = tensors(meta["factors"], "factor")
    selectors = tensors(meta["selectors"], "selector")

    if not isinstance(meta["programs"], list):
        raise BundleError(f"{where}: programs must be a list")
    programs = []
    for p in meta["programs"]:
        try:
            programs.append(program_from_json(p))
        except ValueError as e:  # includes ProgramValueError from adapt_program
            raise BundleError(f"{where}: {e}") from e

    expected_slots = expected_Z = None
    # Bench bundles have no "expected" but give Z_bruteforce at the top level.
    Z_bruteforce = _json_number(meta.get("Z_bruteforce"), "Z_bruteforce", where)
    expected = meta.get("expected")
    if expected is not None:
        if not isinstance(expected, dict):
            raise BundleError(f"{where}: expected must be an object or null")
        if expected.get("slots") is not None:
            expected_slots = {}
            for i, entry in enumerate(expected["slots"]):
                if not isinstance(entry, dict) or "key" not in entry:
                    raise BundleError(f"{where}: expected slot [{i}] has no key")
                key = adapt_slot_key(entry["key"])
                expected_slots[key] = tensor(entry, f"expected slot {key!r}")
        expected_Z = _json_number(expected.get("Z"), "expected Z", where)
        if expected.get("Z_bruteforce") is not None:
            Z_bruteforce = _json_number(expected["Z_bruteforce"], "Z_bruteforce", where)

    return Bundle(
        name=name,
        model=meta["model"] if "model" in meta else name,
        semiring=semiring,
        dtype=dtype,
        normalized_messages=bool(meta.get("normalized_messages", False)),
        factors=factors,
        selectors=selectors,
        programs=programs,
        expected_slots=expected_slots,
        expected_Z=expected_Z,
        Z_bruteforce=Z_bruteforce,
        path=d,
    )


# ---------------------------------------------------------------------------------------
# Saving


def _plain_number(x: Any) -> Any:
    """Numbers as Python scalars for json (which writes -inf as -Infinity, as the corpus does)."""
    if isinstance(x, (np.generic, np.ndarray)):
        x = np.asarray(x).item()
    return x


def _write_atomically(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write to a temp file beside `path`, then rename over it: readers never see half a file."""
    with replacing(path) as tmp, open(tmp, "wb") as f:
        write(f)


def bundle_to_json(bundle: Bundle) -> tuple[dict, dict[str, np.ndarray]]:
    """The bundle.json object and the arrays to store, keyed by their npz names."""
    arrays: dict[str, np.ndarray] = {}

    def entry(arr: np.ndarray, spec: TensorSpec, aname: str) -> dict:
        arrays[aname] = np.asarray(arr)
        return {"spec": spec_to_json(spec), "array": aname}

    meta = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "name": bundle.name,
        "model": bundle.model,
        "semiring": bundle.semiring,
        "dtype": np.dtype(bundle.dtype).name,
        "normalized_messages": bool(bundle.normalized_messages),
        "factors": {str(fid): entry(a, s, f"factor/{fid}") for fid, (a, s) in bundle.factors.items()},
        "selectors": {str(sid): entry(a, s, f"selector/{sid}") for sid, (a, s) in bundle.selectors.items()},
        "programs": [program_to_json(p) for p in bundle.programs],
    }
    if bundle.expected_slots is None and bundle.expected_Z is None:
        # Bench bundles ship no expected results, only the exact Z, at the top level.
        if bundle.Z_bruteforce is not None:
            meta["Z_bruteforce"] = _plain_number(bundle.Z_bruteforce)
    else:
        expected: dict[str, Any] = {}
        if bundle.expected_slots is not None:
            expected["slots"] = [
                dict(key=slot_key_to_json(key), **entry(a, s, f"slot/{n}"))
                for n, (key, (a, s)) in enumerate(bundle.expected_slots.items())
            ]
        if bundle.expected_Z is not None:
            expected["Z"] = _plain_number(bundle.expected_Z)
        if bundle.Z_bruteforce is not None:
            expected["Z_bruteforce"] = _plain_number(bundle.Z_bruteforce)
        meta["expected"] = expected
    return meta, arrays


def save_bundle(bundle: Bundle, path: str | os.PathLike) -> Path:
    """Write `bundle` as a bundle directory at `path` (created if needed); returns the path."""
    d = Path(path)
    d.mkdir(parents=True, exist_ok=True)
    meta, arrays = bundle_to_json(bundle)
    text = json.dumps(meta, indent=1)  # the corpus's layout, byte for byte
    # Arrays first: a bundle.json that exists always refers to arrays already written.
    # (the ignore: mypy matches **arrays to savez_compressed's allow_pickle: bool as well)
    _write_atomically(d / ARRAYS_NPZ, lambda f: np.savez_compressed(f, **arrays))  # type: ignore[arg-type]
    _write_atomically(d / BUNDLE_JSON, lambda f: f.write(text.encode("utf-8")))
    return d


# ---------------------------------------------------------------------------------------
# Comparison


def _same_array(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    equal_nan = a.dtype.kind in "fc"
    return bool(np.array_equal(a, b, equal_nan=equal_nan))


def _same_number(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def bundle_differences(a: Bundle, b: Bundle) -> list[str]:
    """What differs between two bundles (empty when equal); `path` is not compared."""
    diffs = []
    for f in ("name", "model", "semiring", "dtype", "normalized_messages"):
        if getattr(a, f) != getattr(b, f):
            diffs.append(f"{f}: {getattr(a, f)!r} != {getattr(b, f)!r}")
    if a.programs != b.programs:
        diffs.append("programs differ")

    def tables(what: str, ta: dict | None, tb: dict | None) -> None:
        if ta is None or tb is None:
            if ta is not tb:
                diffs.append(f"{what}: one bundle has none")
            return
        if list(ta) != list(tb):
            diffs.append(f"{what}: keys differ")
            return
        for k in ta:
            (xa, sa), (xb, sb) = ta[k], tb[k]
            if sa != sb:
                diffs.append(f"{what} {k!r}: spec {sa} != {sb}")
            if not _same_array(xa, xb):
                diffs.append(f"{what} {k!r}: arrays differ")

    tables("factor", a.factors, b.factors)
    tables("selector", a.selectors, b.selectors)
    tables("expected slot", a.expected_slots, b.expected_slots)
    for f in ("expected_Z", "Z_bruteforce"):
        if not _same_number(getattr(a, f), getattr(b, f)):
            diffs.append(f"{f}: {getattr(a, f)!r} != {getattr(b, f)!r}")
    return diffs
