"""Scaling out: rows per second on a Dask LocalCluster against one local solve_batch.

For each bnlearn network (alarm, hailfinder, pathfinder by default) and each row count,
rows of 10 evidence variables are drawn by ancestral sampling (bench_batch.sample_rows),
each cell then left unobserved with probability 0.2. In the same run they are solved

- locally: one `CompiledModel.solve_batch(table)` call (buckets 1, 64, 1024), and
- by `catbp_jit.dask.solve_table` on a LocalCluster of 1 and of 2 worker processes (one
  thread each), the table split into partitions of --partition-rows rows and persisted on
  the workers first, so that only solving is timed; the posteriors are summed per column
  on the workers (`.sum()`), so every posterior is computed but not shipped back.

Rows per second = rows / wall time. The time to the first result is reported apart: a
fresh cluster's first answer (one row per worker), which is each worker loading the model
(parse, plan, kernels from the warm disk cache). The local compile before it warms the
cache; the workers share it (CATBP_JIT_CACHE_DIR). Prints a Markdown table.

    python perf/bench_dask.py [--networks alarm,hailfinder,pathfinder] [--rows 10000,100000]
                              [--partition-rows 25000]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # perf/common.py

from common import sample_rows  # noqa: E402

NETWORKS = ("alarm", "hailfinder", "pathfinder")
ROWS = (10_000, 100_000)
WORKERS = (1, 2)
OBSERVED = 10
MISSING = 0.2
BUCKETS = (1, 64, 1024)


def evidence_frame(graph, n: int, seed: int):
    """n rows of OBSERVED sampled variables (state indices, -1 unobserved) as a DataFrame."""
    import pandas as pd

    names = list(graph.variables)  # the same variables for every n
    chosen = [names[i] for i in sorted(np.random.default_rng(0).choice(len(names), OBSERVED, replace=False))]
    rng = np.random.default_rng(seed)
    sample = sample_rows(graph, n, seed)
    cols = {}
    for v in chosen:
        col = sample[v].astype(np.int64)
        col[rng.random(n) < MISSING] = -1
        cols[v] = col
    return pd.DataFrame(cols)


def local_rate(model, frame) -> float:
    table = frame.to_numpy()
    model.solve_batch(table[:1024])  # the batched executable's first run binds its tables
    t0 = time.perf_counter()
    model.solve_batch(table)
    return len(table) / (time.perf_counter() - t0)


def dask_rates(path: str, frames, client, partition_rows: int):
    """(seconds to the first result, {rows: rows per second}) on the client's cluster."""
    import dask.dataframe as dd

    from catbp_jit.dask import solve_table

    workers = len(client.scheduler_info()["workers"])
    first = frames[min(frames)].iloc[:workers]
    t0 = time.perf_counter()
    solve_table(path, dd.from_pandas(first, npartitions=workers), buckets=BUCKETS).sum().compute()
    first_s = time.perf_counter() - t0
    rates = {}
    for n, frame in sorted(frames.items()):
        parts = max(2 * workers, -(-n // partition_rows))
        table = client.persist(dd.from_pandas(frame, npartitions=parts))
        client.wait_for_workers(workers)
        table.sum().compute()  # (persisted: this only waits for it)
        t0 = time.perf_counter()
        solve_table(path, table, buckets=BUCKETS).sum().compute()
        rates[n] = n / (time.perf_counter() - t0)
        del table
    return first_s, rates


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--networks", default=",".join(NETWORKS))
    ap.add_argument("--rows", default=",".join(map(str, ROWS)))
    ap.add_argument("--partition-rows", type=int, default=25_000)
    args = ap.parse_args(argv)
    import distributed

    from catbp_jit.frontend.bnlearn import network_path
    from catbp_jit.frontend.model_source import model_source

    networks = [n for n in args.networks.split(",") if n]
    counts = [int(float(x)) for x in args.rows.split(",") if x]
    frames, local, paths = {}, {}, {}
    for name in networks:
        paths[name] = str(network_path(name))
        graph = model_source(paths[name]).graph()
        frames[name] = {n: evidence_frame(graph, n, seed=n) for n in counts}
        ev = list(frames[name][counts[0]].columns)
        assert all(list(f.columns) == ev for f in frames[name].values())
        t0 = time.perf_counter()
        model = model_source(paths[name], evidence_vars=ev, buckets=BUCKETS).compile()
        print(f"{name}: compiled locally in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        local[name] = {n: local_rate(model, frames[name][n]) for n in counts}
        print(f"{name}: local {local[name]}", file=sys.stderr)
        del model
    results = {}
    for workers in WORKERS:
        t0 = time.perf_counter()
        with (
            distributed.LocalCluster(
                n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
            ) as cluster,
            distributed.Client(cluster) as client,
        ):
            print(f"{workers} workers: cluster up in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            for name in networks:
                results[name, workers] = dask_rates(paths[name], frames[name], client, args.partition_rows)
                print(f"{name}, {workers} workers: {results[name, workers]}", file=sys.stderr)
    print(
        f"\nrows/s, {OBSERVED} evidence variables ({MISSING:.0%} of cells unobserved), "
        f"buckets {BUCKETS}, partitions of {args.partition_rows} rows "
        f"(at least 2 per worker); {os.cpu_count()} CPUs\n"
    )
    head = ["network", "rows", "local solve_batch"] + [f"{w} worker{'s' * (w > 1)}" for w in WORKERS]
    head += [f"first result, {w} worker{'s' * (w > 1)}" for w in WORKERS]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name in networks:
        for n in counts:
            cells = [name, f"{n:,}", f"{local[name][n]:,.0f}"]
            cells += [f"{results[name, w][1][n]:,.0f}" for w in WORKERS]
            cells += [f"{results[name, w][0]:.2f} s" for w in WORKERS]
            print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
