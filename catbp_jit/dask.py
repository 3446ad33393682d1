"""Scaling out on Dask: evidence tables, arrays and many models, partition by partition.

    from catbp_jit.dask import solve_table
    post = solve_table("alarm.bif", cases)   # cases: a Dask DataFrame, a column per variable
    post.to_parquet("posteriors/")           # lazy until here

`solve_table` maps each partition of the table through `CompiledModel.solve_batch` on
whichever worker Dask picks; `solve_array` does the same for the row blocks of a Dask
array of state indices, and `solve_many` answers many models (one evidence each) as a
Dask bag. The model travels as a ModelSource (frontend/model_source.py): the file's
bytes and options, one task every partition depends on, so Dask ships it to a worker
once; each worker process compiles it once (LOADED, keyed by the content's sha256) and,
with a warm kernel cache, compiles no kernel at all (docs/scaling.md).

The result's columns and dtypes (`meta`) come from the model file alone, parsed on the
client: nothing runs until the result is computed. dask and distributed are the optional
extra `dask`; without them every function here raises one ImportError saying so.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .errors import name_list
from .frontend.frames import frame_states
from .frontend.graph import FactorGraph, FactorGraphError
from .frontend.model_source import LOADED, ModelSource, model_source

COLUMN_CHOICES = ("posteriors", "log_Z")  # or a list of variables


class DaskMissingError(ImportError):
    """catbp_jit.dask was used without dask and distributed installed."""


def _need(module: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise DaskMissingError(
            f"catbp_jit.dask needs dask[dataframe] and distributed (the "
            f"'dask' extra): pip install 'catbp_jit[dask]' (no {module})"
        ) from None


# -- what a result holds --------------------------------------------------------------------


def result_variables(graph: FactorGraph, columns: Any = "posteriors") -> tuple[str, ...]:
    """The variables whose posteriors a result holds: all ("posteriors"), none ("log_Z"),
    or those listed."""
    if isinstance(columns, str):
        if columns not in COLUMN_CHOICES:
            raise ValueError(
                f"columns must be one of {', '.join(COLUMN_CHOICES)} or a list of variables, got {columns!r}"
            )
        return tuple(graph.variables) if columns == "posteriors" else ()
    wanted = tuple(columns)
    unknown = [v for v in wanted if v not in graph.variables]
    if unknown:
        raise FactorGraphError(f"{graph.name}: columns names unknown variable(s) {name_list(unknown, repr)}")
    return wanted


def result_columns(graph: FactorGraph, columns: Any = "posteriors") -> list[str]:
    """A result's columns: log_Z, then `var=state` per state of each variable kept."""
    from .frontend.table import posterior_columns

    return ["log_Z"] + posterior_columns(graph, result_variables(graph, columns))


def _check_evidence(graph: FactorGraph, evidence_vars: Sequence[str]) -> None:
    unknown = [v for v in evidence_vars if v not in graph.variables]
    if unknown or len(set(evidence_vars)) != len(evidence_vars):
        raise FactorGraphError(
            f"{graph.name}: the evidence columns must be distinct variables "
            f"of the model; unknown or repeated: "
            f"{name_list(unknown, repr) or 'repeated'}"
        )


def _source(model: Any, evidence_vars, buckets, semiring, plan_time, default_vars) -> ModelSource:
    """The model with its options; evidence_vars None: a profile's, else default_vars."""
    source = model_source(
        model, semiring=semiring, evidence_vars=evidence_vars, buckets=buckets, plan_time=plan_time
    )
    if evidence_vars is None and not source.evidence_vars and default_vars is not None:
        source = source.with_options(evidence_vars=tuple(default_vars))
    return source


# -- DataFrames -------------------------------------------------------------------------------


def solve_table(
    model: Any,
    table: Any,
    *,
    evidence_vars: Sequence[str] | None = None,
    columns: Any = "posteriors",
    buckets: Sequence[int] | None = None,
    semiring: str | None = None,
    plan_time: float | None = None,
) -> Any:
    """Posteriors of every row of a Dask DataFrame of evidence, lazily, partition by partition.

    model: a model file (.bif, .uai), a fetched bnlearn network's name, or a saved profile
    of a model (`catbp-jit aot MODEL --evidence-vars ...`: it fixes semiring, evidence
    variables and buckets). table: one column per evidence variable (evidence_vars, by
    default every column, or a profile's), cells state names or indices; a missing cell
    (None, NaN, NA, "", "?", -1) leaves the variable unobserved. columns: "posteriors",
    "log_Z" or a list of variables. Returns a Dask DataFrame with the table's index and
    partitions: log_Z, then one float64 column `var=state` per posterior (SAT: 0/1; a row
    whose evidence is impossible has log_Z -inf and NaN posteriors).
    """
    dask = _need("dask")
    dd = _need("dask.dataframe")
    import pandas as pd

    if not isinstance(table, dd.DataFrame):
        raise TypeError(
            f"solve_table: table must be a Dask DataFrame, got "
            f"{type(table).__name__} (dask.dataframe.from_pandas makes one)"
        )
    source = _source(model, evidence_vars, buckets, semiring, plan_time, list(table.columns))
    graph = source.graph()  # parsed here for the meta; compiled only on workers
    _check_evidence(graph, source.evidence_vars)
    missing = [v for v in source.evidence_vars if v not in table.columns]
    if missing:
        raise FactorGraphError(
            f"{source.label}: the table has no column for evidence variable(s) {name_list(missing, repr)}"
        )
    variables = result_variables(graph, columns)
    cols = result_columns(graph, columns)
    meta = pd.DataFrame({c: np.zeros(0) for c in cols}, index=table._meta.index)
    shipped = dask.delayed(source, pure=True)  # one key: sent to each worker once
    return table[list(source.evidence_vars)].map_partitions(_solve_frame, shipped, variables, cols, meta=meta)


def _solve_frame(frame: Any, source: ModelSource, variables: tuple[str, ...], cols: list[str]) -> Any:
    """One partition: its rows' answers, on the worker (the model from LOADED)."""
    import pandas as pd

    if len(frame) == 0:  # no rows: no model needed
        return pd.DataFrame({c: np.zeros(0) for c in cols}, index=frame.index)
    model, lock = LOADED.get(source)
    states = frame_states(model, frame)
    with lock:
        res = model.solve_batch(states)
    return pd.DataFrame(_matrix(res, variables), index=frame.index, columns=cols)


def _matrix(res: Any, variables: tuple[str, ...]) -> np.ndarray:
    parts = [np.asarray(res.log_Z, dtype=np.float64)[:, None]]
    parts += [np.asarray(res.marginals[v], dtype=np.float64) for v in variables]
    return np.concatenate(parts, axis=1)


# -- arrays -----------------------------------------------------------------------------------


def solve_array(
    model: Any,
    array: Any,
    *,
    evidence_vars: Sequence[str] | None = None,
    columns: Any = "posteriors",
    buckets: Sequence[int] | None = None,
    semiring: str | None = None,
    plan_time: float | None = None,
) -> Any:
    """solve_table for a 2-D integer Dask array of state indices (rows x evidence_vars,
    -1 unobserved): a float64 Dask array (rows x result_columns(graph, columns)) with the
    array's row chunks. evidence_vars: the columns' variables (a profile's by default)."""
    da = _need("dask.array")
    dask = _need("dask")
    if not isinstance(array, da.Array):
        raise TypeError(
            f"solve_array: array must be a Dask array, got {type(array).__name__} "
            "(dask.array.from_array makes one)"
        )
    source = _source(model, evidence_vars, buckets, semiring, plan_time, None)
    graph = source.graph()
    _check_evidence(graph, source.evidence_vars)
    k = len(source.evidence_vars)
    if array.ndim != 2 or array.shape[1] != k or np.dtype(array.dtype).kind not in "iu":
        raise FactorGraphError(
            f"{source.label}: an evidence array is a 2-D integer array of shape (rows, {k}) "
            f"with columns {name_list(source.evidence_vars, repr)}; got {array.dtype} {array.shape}"
        )
    variables = result_variables(graph, columns)
    width = len(result_columns(graph, columns))
    array = array.rechunk({1: -1})
    return da.map_blocks(
        _solve_block,
        array,
        dask.delayed(source, pure=True),
        variables,
        width,
        dtype=np.float64,
        chunks=(array.chunks[0], (width,)),
        meta=np.zeros((0, width)),
    )


def _solve_block(
    block: np.ndarray,
    source: ModelSource,
    variables: tuple[str, ...],
    width: int,
    block_info: dict | None = None,
) -> np.ndarray:
    if len(block) == 0:
        return np.zeros((0, width))
    model, lock = LOADED.get(source)
    first = block_info[0]["array-location"][0][0] if block_info else 0
    try:
        from .frontend.batch import evidence_table

        table = evidence_table(model.built, np.asarray(block))
    except FactorGraphError as e:  # its row is the block's: say the array's
        raise FactorGraphError(f"{e} (the block from array row {first})") from None
    with lock:
        res = model.solve_batch(table)
    return _matrix(res, variables)


# -- many models ------------------------------------------------------------------------------


def solve_many(
    paths: Sequence[Any], evidence: Any = None, *, semiring: str = "prob", plan_time: float | None = None
) -> Any:
    """Each model's log Z and marginals under its evidence, as a Dask bag of dicts
    {model, path, sha256, evidence, log_Z, marginals: {variable: [p per state]}}, in the
    order of paths. evidence: None, one {variable: state} for every model, or a sequence
    of them, one per model. The evidence is absorbed (as `solve` does)."""
    db = _need("dask.bag")
    paths = list(paths)
    if evidence is None or isinstance(evidence, Mapping):
        evidences = [dict(evidence or {})] * len(paths)
    else:
        evidences = [dict(e) for e in evidence]
        if len(evidences) != len(paths):
            raise ValueError(
                f"solve_many: {len(paths)} models but {len(evidences)} evidence "
                "mappings (give one per model, or one for all)"
            )
    jobs = [
        (
            model_source(p, semiring=semiring, evidence_vars=tuple(e), plan_time=plan_time).with_options(
                absorb_evidence=True, buckets=None
            ),
            e,
        )  # (solve: no batches)
        for p, e in zip(paths, evidences)
    ]
    return db.from_sequence(jobs, npartitions=max(1, len(jobs))).map(_solve_one)


def _solve_one(job: tuple[ModelSource, dict[str, Any]]) -> dict[str, Any]:
    source, evidence = job
    model, lock = LOADED.get(source)
    with lock:
        sol = model.solve(evidence)
    return {
        "model": source.name,
        "path": source.label,
        "sha256": source.sha256,
        "evidence": evidence,
        "log_Z": float(sol.log_Z),
        "marginals": {v: np.asarray(m, dtype=np.float64).tolist() for v, m in sol.marginals.items()},
    }


# -- the command line ----------------------------------------------------------------------

# how long --dask keeps trying its scheduler: one that is starting up answers within seconds
CONNECT_TIMEOUT_S = 10.0


def solve_parquet(
    model: Any,
    table: str,
    output: str,
    *,
    scheduler: str | None = None,
    workers: int | None = None,
    semiring: str | None = None,
    plan_time: float | None = None,
    progress: bool = True,
    connect_timeout: float = CONNECT_TIMEOUT_S,
) -> int:
    """`catbp-jit solve MODEL --evidence-table T.parquet --dask ADDRESS | --workers N -o DIR`:
    a Parquet file or directory in, a directory of Parquet parts out, one per input
    partition, under Dask's progress bar (on stderr). The number of rows solved.
    connect_timeout: seconds to keep trying the scheduler at `scheduler`."""
    dd = _need("dask.dataframe")
    distributed = _need("distributed")
    from .atomic import replacing_dir
    from .frontend.table import parquet_errors

    with parquet_errors(table):  # no Parquet file (found here, or by a worker): one line
        cases = dd.read_parquet(table)
    result = solve_table(model, cases, semiring=semiring, plan_time=plan_time)
    # the parts go to a directory beside `output`, put in its place once all are written:
    # a failed partition leaves the old output as it was
    with (
        _client(distributed, scheduler, workers, connect_timeout) as client,
        replacing_dir(output) as tmp,
        parquet_errors(table),
    ):
        job = client.compute(result.to_parquet(str(tmp), compute=False))
        try:
            if progress:
                with contextlib.redirect_stdout(sys.stderr):
                    distributed.progress(job)
                print(file=sys.stderr)
            job.result()
        except BaseException:
            # other partitions may still be writing into tmp: let them end, or the
            # directory's removal races their files and leaves it behind
            client.cancel(job)
            _until_quiet(Path(tmp))
            raise
        return int(dd.read_parquet(str(tmp), columns=["log_Z"]).shape[0].compute())


def _until_quiet(directory: Path, quiet_s: float = 0.5, most_s: float = 30.0) -> None:
    """Wait until no file in `directory` has appeared or grown for quiet_s (at most
    most_s): a task already running on a worker cannot be stopped, only waited for."""

    def snapshot() -> set:
        with contextlib.suppress(OSError):
            return {(f.name, f.stat().st_size) for f in directory.rglob("*") if f.is_file()}
        return set()

    start = last_change = time.monotonic()
    seen = snapshot()
    while time.monotonic() - last_change < quiet_s and time.monotonic() - start < most_s:
        time.sleep(0.05)
        now = snapshot()
        if now != seen:
            seen, last_change = now, time.monotonic()


@contextlib.contextmanager
def _client(
    distributed: Any, scheduler: str | None, workers: int | None, connect_timeout: float = CONNECT_TIMEOUT_S
):
    """A client of the scheduler at `scheduler` (tried for connect_timeout seconds), or of
    a local cluster of `workers` processes (one thread each: the kernels are single-threaded)."""
    if scheduler is not None:
        try:
            client = distributed.Client(scheduler, timeout=f"{connect_timeout}s")
        except (OSError, TimeoutError) as e:
            raise FactorGraphError(f"cannot reach the Dask scheduler at {scheduler}: {e}") from None
        with client:
            yield client
        return
    with (
        distributed.LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        yield client
