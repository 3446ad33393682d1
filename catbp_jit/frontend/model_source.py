"""A model as another process gets it: the file's bytes, their hash and how to compile it.

Scaling out (catbp_jit.dask) sends a `ModelSource` to worker processes, which may not
see the client's files: it carries the model file's content, so a worker parses the same
bytes the client read. Each process keeps the models it compiled in `LOADED`, keyed by
the content's sha256 and the compile options, so a worker compiles (or, with a warm
kernel cache, loads) a model once however many partitions it runs, and a model file
edited between two runs is never answered from the old one.

A saved profile of a model (`catbp-jit aot MODEL -o P.profile.json`) names its model
file, that file's sha256 and the options it was compiled ahead with (`profile_entry`);
`model_source(P.profile.json)` reads them back, so workers compile exactly what `aot`
put in the cache and run under CATBP_JIT_CACHE=strict.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..interop.pyagrum import PYAGRUM_SUFFIXES
from ..target import CPU, MODEL_NAMES, get_for_model
from .graph import FactorGraph, FactorGraphError

if TYPE_CHECKING:
    from .model import CompiledModel

# our own readers, then the formats pyAgrum reads (interop/pyagrum.py), as read_model takes them
MODEL_SUFFIXES = (".uai", ".uai.gz", ".bif", ".bif.gz", *PYAGRUM_SUFFIXES)
PROFILE_KEY = "model"  # the entry of a saved profile that names its model
DEFAULT_BUCKETS = (1, 64, 1024)  # as `catbp-jit solve --evidence-table` and `aot` use
MAX_LOADED = 8  # compiled models a process keeps (solve_many may pass through many)


@dataclass(frozen=True)
class ModelSource:
    """A model file's content and the options to compile it with."""

    label: str  # the file as the user named it, for messages
    name: str  # the graph's name (the file name without its suffixes)
    fmt: str  # "bif", "uai", or the suffix of a format pyAgrum reads (".net", ".xdsl", ...)
    sha256: str
    data: bytes = field(repr=False)
    semiring: str = "prob"
    evidence_vars: tuple[str, ...] = ()
    buckets: tuple[int, ...] | None = DEFAULT_BUCKETS  # None: solve() only
    plan_time: float | None = None  # None: compile_model's default search (cached on disk)
    absorb_evidence: bool = False

    def key(self) -> tuple:
        """What a compiled model depends on: the content and every option, not the name."""
        return (
            self.sha256,
            self.fmt,
            self.semiring,
            self.evidence_vars,
            self.buckets,
            self.plan_time,
            self.absorb_evidence,
        )

    def graph(self) -> FactorGraph:
        if self.fmt == "bif":
            from .bif import read_bif

            return read_bif(self.data, name=self.name)
        if self.fmt in PYAGRUM_SUFFIXES:  # pyAgrum reads files only: the bytes go to one first
            import tempfile

            from ..interop.pyagrum import read_pyagrum_file

            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / f"model{self.fmt}"
                path.write_bytes(self.data)
                return read_pyagrum_file(path, name=self.name)
        from .uai import read_uai

        return read_uai(self.data, name=self.name)

    def compile(self) -> CompiledModel:
        from .model import CompiledModel

        return CompiledModel(
            self.graph(),
            self.semiring,
            evidence_vars=self.evidence_vars,
            buckets=self.buckets,
            plan_time=self.plan_time,
            absorb_evidence=self.absorb_evidence,
        )

    def with_options(self, **options: Any) -> ModelSource:
        from dataclasses import replace

        return replace(self, **options)


def model_source(
    model: Any,
    *,
    semiring: str | None = None,
    evidence_vars: Sequence[str] | None = None,
    buckets: Sequence[int] | None = None,
    plan_time: float | None = None,
) -> ModelSource:
    """A ModelSource from a model file (.bif, .uai, gzipped too), a fetched bnlearn
    network's name, or a saved profile of a model (.json, made by `catbp-jit aot MODEL`).
    A profile fixes the semiring, evidence variables and buckets: options that differ
    from it are an error (they would need kernels `aot` did not compile)."""
    if isinstance(model, ModelSource):
        return model
    path = Path(model)
    if path.suffix == ".json":
        return _from_profile(path, semiring, evidence_vars, buckets, plan_time)
    path = _model_path(model)
    data = path.read_bytes()
    return ModelSource(
        str(model),
        _stem(path),
        _format(path),
        hashlib.sha256(data).hexdigest(),
        data,
        (semiring or "prob").lower(),
        tuple(evidence_vars or ()),
        tuple(buckets) if buckets else DEFAULT_BUCKETS,
        plan_time,
    )


def _model_path(model: Any) -> Path:
    path = Path(model)
    if path.is_file():
        if not path.name.lower().endswith(MODEL_SUFFIXES):
            raise FactorGraphError(
                f"{model}: unknown model format (expected one of "
                f"{', '.join(MODEL_SUFFIXES)}, or a saved profile .json)"
            )
        return path
    from . import bnlearn

    if isinstance(model, str) and model in bnlearn.NETWORKS:
        return bnlearn.network_path(model)
    raise FactorGraphError(f"{model}: no such model file, and not a bnlearn network name")


def _format(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(PYAGRUM_SUFFIXES):
        return next(s for s in PYAGRUM_SUFFIXES if name.endswith(s))
    return "bif" if name.endswith((".bif", ".bif.gz")) else "uai"


def _stem(path: Path) -> str:
    name = path.name
    for suffix in MODEL_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


def profile_entry(
    model: Any,
    semiring: str,
    evidence_vars: Sequence[str],
    buckets: Sequence[int] | None,
    target: str = "cpu",
) -> dict:
    """What `catbp-jit aot MODEL` records in the profile about its model."""
    path = _model_path(model).resolve()
    return {
        "path": str(path),
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "target": target,
        "semiring": semiring.lower(),
        "evidence_vars": list(evidence_vars),
        "buckets": list(buckets) if buckets else list(DEFAULT_BUCKETS),
    }


def add_profile_entry(profile: Path, entry: dict) -> None:
    from ..saved import write_saved

    doc = json.loads(profile.read_text(encoding="utf-8"))
    doc[PROFILE_KEY] = entry
    write_saved(profile, doc)


def _from_profile(
    path: Path,
    semiring: str | None,
    evidence_vars: Sequence[str] | None,
    buckets: Sequence[int] | None,
    plan_time: float | None,
) -> ModelSource:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FactorGraphError(f"{path}: no such profile") from None
    except (ValueError, RecursionError) as e:  # RecursionError: arrays nested thousands deep
        raise FactorGraphError(f"{path}: not a saved profile (not JSON: {e})") from None
    entry = doc.get(PROFILE_KEY) if isinstance(doc, dict) else None
    if not isinstance(entry, dict):
        raise FactorGraphError(
            f"{path}: not the profile of a model (no {PROFILE_KEY!r} entry: "
            "make it with `catbp-jit aot MODEL --evidence-vars ...`)"
        )
    try:
        model, sha = Path(entry["path"]), str(entry["sha256"])
        saved: dict[str, Any] = dict(
            semiring=str(entry["semiring"]),  # option -> its value
            evidence_vars=tuple(map(str, entry["evidence_vars"])),
            buckets=tuple(int(b) for b in entry["buckets"]),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise FactorGraphError(f"{path}: the {PROFILE_KEY!r} entry is damaged ({e!r})") from None
    target = entry.get("target", CPU.name)
    if target not in MODEL_NAMES or not get_for_model(target).scales_out:  # workers: CPU kernels
        raise FactorGraphError(
            f"{path}: a profile for target {entry['target']!r}; scaling out "
            "runs on CPUs (compile it with `catbp-jit aot` for the cpu)"
        )
    asked: dict[str, Any] = dict(
        semiring=semiring and semiring.lower(),
        evidence_vars=None if evidence_vars is None else tuple(evidence_vars),
        buckets=None if buckets is None else tuple(buckets),
    )
    for option, value in asked.items():
        same = value is None or (
            set(value) == set(saved[option]) if option == "evidence_vars" else value == saved[option]
        )
        if not same:
            raise FactorGraphError(
                f"{path}: the profile was compiled with {option}={saved[option]!r}, not "
                f"{value!r} (compile another profile with `catbp-jit aot`)"
            )
    source = model_source(
        model,
        semiring=saved["semiring"],
        buckets=saved["buckets"],
        evidence_vars=asked["evidence_vars"] or saved["evidence_vars"],
        plan_time=plan_time,
    )
    if source.sha256 != sha:
        raise FactorGraphError(
            f"{path}: its model {model} changed since the profile was made "
            "(sha256 differs): run `catbp-jit aot` again"
        )
    return source


class LoadedModels:
    """The models this process compiled, by ModelSource.key(), the most recent kept. A
    model's session is one buffer, so each comes with a lock: threads of one worker
    take turns on it."""

    def __init__(self, size: int = MAX_LOADED):
        self.size = size
        self._models: OrderedDict[tuple, tuple[CompiledModel, threading.Lock]] = OrderedDict()
        self._lock = threading.Lock()
        self.compiled = 0  # models compiled (or loaded from the kernel cache) here

    def get(self, source: ModelSource) -> tuple[CompiledModel, threading.Lock]:
        key = source.key()
        with self._lock:
            if key in self._models:
                self._models.move_to_end(key)
                return self._models[key]
            entry = (source.compile(), threading.Lock())  # (two models at once: rare, slow)
            self.compiled += 1
            self._models[key] = entry
            while len(self._models) > self.size:
                self._models.popitem(last=False)
            return entry


LOADED = LoadedModels()  # this process's; a worker process has its own
