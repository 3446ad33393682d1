"""catbp_jit.dask on a real cluster: answers equal a local solve_batch row for row.

One LocalCluster (2 worker processes, 1 thread each) serves the whole module. Its workers
run under CATBP_JIT_CACHE=strict on the kernel cache this process warmed (by compiling
the same models locally, the oracle the answers are compared with): any kernel a worker
had to compile would fail its task, and test_warm_strict_workers_compile_nothing checks
the workers' counters too.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time

import numpy as np
import pytest

dd = pytest.importorskip("dask.dataframe")
distributed = pytest.importorskip("distributed")
import dask  # noqa: E402
import dask.array as da  # noqa: E402
import pandas as pd  # noqa: E402

from catbp_jit.cli import main  # noqa: E402
from catbp_jit.dask import (  # noqa: E402
    DaskMissingError,
    frame_states,
    result_columns,
    solve_array,
    solve_many,
    solve_table,
)
from catbp_jit.frontend import factor_graph  # noqa: E402
from catbp_jit.frontend.graph import FactorGraphError  # noqa: E402
from catbp_jit.frontend.model_source import LOADED, model_source  # noqa: E402
from catbp_jit.frontend.uai import write_uai  # noqa: E402
from conftest import REPO  # noqa: E402

ASIA = str(REPO / "examples" / "asia.bif")
ASIA_VARS = ("dysp", "smoke")
CHAIN_VARS = ("2", "0")  # UAI variables are named by index
BUCKETS = (1, 8)  # small, so that a partition of 20 rows is larger than the largest
OPTIONS = dict(buckets=BUCKETS, plan_time=0)  # greedy plans: the same on every worker
MANY_EVIDENCE = [{"dysp": "yes", "smoke": 0}, {"0": 1}]


def chain_model(path):
    """A small UAI model (states by index only) with a zero, so some evidence is impossible."""
    rng = np.random.default_rng(7)
    ab = rng.uniform(0.1, 1, (2, 3))
    ab[1, 2] = 0.0  # a=1, b=2 together: impossible (a, b, c, d are 0, 1, 2, 3 in the file)
    bc, cd = rng.uniform(0.1, 1, (3, 2)), rng.uniform(0.1, 1, (2, 3))
    graph = factor_graph(
        {"a": 2, "b": 3, "c": 2, "d": 3}, [(("a", "b"), ab), (("b", "c"), bc), (("c", "d"), cd)], name="chain"
    )
    path.write_text(write_uai(graph))
    return str(path)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The model files and, compiled here (which warms the kernel cache the workers
    read), the local models the answers are checked against."""
    chain = chain_model(tmp_path_factory.mktemp("models") / "chain.uai")
    local = {
        name: model_source(path, evidence_vars=ev, **OPTIONS).compile()
        for name, path, ev in (("asia", ASIA, ASIA_VARS), ("chain", chain, CHAIN_VARS))
    }
    many = [
        model_source(p, evidence_vars=tuple(e), plan_time=0)
        .with_options(absorb_evidence=True, buckets=None)
        .compile()
        for p, e in zip((ASIA, chain), MANY_EVIDENCE)
    ]
    for model, e in zip(many, MANY_EVIDENCE):
        model.solve(e)
    # impossible rows are certified by SAT: its companion model is compiled on first need
    local["chain"].solve_batch(np.array([[-1, 1]]))
    # the command line's model: the default buckets
    model_source(ASIA, evidence_vars=ASIA_VARS, plan_time=0).compile()
    return {"asia": ASIA, "chain": chain, "local": local, "many": many}


@pytest.fixture(scope="module")
def client(models):
    from catbp_jit.cache import default_cache

    env = {"CATBP_JIT_CACHE": "strict", "CATBP_JIT_CACHE_DIR": default_cache().directory}
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, env=env
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        yield client


def partitioned(parts):
    """A Dask DataFrame with exactly these pandas frames as its partitions."""
    return dd.from_delayed([dask.delayed(p) for p in parts], meta=parts[0].iloc[:0], verify_meta=False)


def assert_same_as_local(got, model, frame):
    """got (a computed result) equals model.solve_batch on the whole frame, row for row."""
    want = model.solve_batch(frame_states(model, frame[list(model.evidence_columns)]))
    assert list(got.columns) == result_columns(model.graph)
    assert list(got.index) == list(frame.index)
    np.testing.assert_allclose(got["log_Z"].to_numpy(), want.log_Z, rtol=1e-12, atol=1e-12)
    cols = [want.marginals[v] for v in model.graph.variables]
    np.testing.assert_allclose(
        got.to_numpy()[:, 1:], np.concatenate(cols, axis=1), rtol=1e-12, atol=1e-12, equal_nan=True
    )


def asia_parts():
    """Names and indices, missing cells, an empty partition, one over the largest bucket."""
    rng = np.random.default_rng(1)

    def part(n, start):
        dysp = rng.choice(np.array(["yes", "no", None], dtype=object), n)
        smoke = rng.choice([0.0, 1.0, np.nan], n)  # indices, NaN unobserved
        return pd.DataFrame({"dysp": dysp, "smoke": smoke}, index=range(start, start + n))

    sizes = [3, 0, 20, 5]
    starts = np.cumsum([0] + sizes)
    return [part(n, s) for n, s in zip(sizes, starts)]


def test_state_names_indices_missing_and_empty_partitions_match_local(client, models):
    parts = asia_parts()
    table = partitioned(parts)
    result = solve_table(models["asia"], table, **OPTIONS)
    assert result.npartitions == len(parts)
    got = result.compute()
    assert_same_as_local(got, models["local"]["asia"], pd.concat(parts))


def test_index_table_with_impossible_rows_matches_local(client, models):
    rng = np.random.default_rng(2)
    frames = []
    for n in (12, 0, 9):  # c, a: int columns, -1 unobserved (a=1 with b=2 impossible)
        frames.append(
            pd.DataFrame({"2": rng.integers(-1, 2, n), "0": rng.integers(-1, 2, n), "unused": np.zeros(n)})
        )
    frames = [f.set_axis(range(i * 100, i * 100 + len(f))) for i, f in enumerate(frames)]
    got = solve_table(models["chain"], partitioned(frames), evidence_vars=CHAIN_VARS, **OPTIONS).compute()
    assert_same_as_local(got, models["local"]["chain"], pd.concat(frames))


def test_meta_comes_from_the_file_without_running_the_model(models):
    compiled = LOADED.compiled
    table = partitioned(asia_parts())
    result = solve_table(models["asia"], table, columns=["lung"], **OPTIONS)
    assert list(result.columns) == ["log_Z", "lung=yes", "lung=no"]
    assert set(result.dtypes) == {np.dtype(np.float64)}
    assert LOADED.compiled == compiled  # nothing compiled (nor run) to build the result
    only_z = solve_table(models["asia"], table, columns="log_Z", **OPTIONS)
    assert list(only_z.columns) == ["log_Z"]


def models_loaded():
    """On a worker: how many models it compiled (this module is pickled by value there,
    so the counter is imported, not captured)."""
    from catbp_jit.frontend.model_source import LOADED

    return LOADED.compiled


def test_each_worker_loads_a_model_once_however_many_partitions(client, models):
    before = client.run(models_loaded)
    parts = [asia_parts()[2].set_axis(range(i * 20, i * 20 + 20)) for i in range(6)]
    solve_table(models["asia"], partitioned(parts), **OPTIONS).compute()
    after = client.run(models_loaded)
    assert all(after[w] - before[w] <= 1 for w in after)  # 6 partitions, 2 workers


def test_the_model_cache_is_keyed_by_content(tmp_path):
    copy = tmp_path / "renamed.bif"
    shutil.copy(ASIA, copy)
    assert model_source(copy, **OPTIONS).key() == model_source(ASIA, **OPTIONS).key()
    copy.write_text(copy.read_text().replace("0.01", "0.02", 1))
    assert model_source(copy, **OPTIONS).key() != model_source(ASIA, **OPTIONS).key()


def test_a_process_keeps_its_most_recent_models(models):
    from catbp_jit.frontend.model_source import LoadedModels

    loaded = LoadedModels(size=1)
    asia = model_source(models["asia"], evidence_vars=ASIA_VARS, **OPTIONS)
    chain = model_source(models["chain"], evidence_vars=CHAIN_VARS, **OPTIONS)
    first, _ = loaded.get(asia)
    assert loaded.get(asia)[0] is first and loaded.compiled == 1
    loaded.get(chain)  # evicts asia
    assert loaded.get(asia)[0] is not first and loaded.compiled == 3


def test_dask_array_matches_local(client, models):
    rng = np.random.default_rng(3)
    states = np.stack([rng.integers(-1, 2, 30), rng.integers(-1, 2, 30)], axis=1)
    array = da.from_array(states, chunks=((4, 0, 17, 9), (1, 1)))
    got = solve_array(models["asia"], array, evidence_vars=ASIA_VARS, **OPTIONS).compute()
    want = models["local"]["asia"].solve_batch(states)
    np.testing.assert_allclose(got[:, 0], want.log_Z, rtol=1e-12, atol=1e-12)
    marg = np.concatenate([want.marginals[v] for v in want.marginals], axis=1)
    np.testing.assert_allclose(got[:, 1:], marg, rtol=1e-12, atol=1e-12)


def test_solve_many_matches_each_model_solved_locally(client, models):
    bag = solve_many([models["asia"], models["chain"]], MANY_EVIDENCE, plan_time=0)
    got = bag.compute()
    assert [g["model"] for g in got] == ["asia", "chain"]
    for answer, model, evidence in zip(got, models["many"], MANY_EVIDENCE):
        want = model.solve(evidence)
        assert answer["log_Z"] == pytest.approx(want.log_Z, rel=1e-12, abs=1e-12)
        for v, m in want.marginals.items():
            np.testing.assert_allclose(answer["marginals"][v], m, rtol=1e-12, atol=1e-12)


def _gated_part(frame, gated):
    """A test partition that waits for the event 'go' (so that the run is mid-way), its
    thread given back meanwhile (secede) so that the worker runs the other partitions."""
    if gated:
        distributed.secede()
        distributed.Event("go").wait(timeout=120)
        distributed.rejoin()
    return frame


def test_a_worker_killed_mid_run_is_retried_and_the_result_is_complete(client, models):
    parts = [asia_parts()[2].set_axis(range(i * 20, i * 20 + 20)) for i in range(8)]
    gated = [i >= 6 for i in range(8)]  # the last two wait until a worker was killed
    table = dd.from_delayed(
        [dask.delayed(_gated_part)(p, g) for p, g in zip(parts, gated)],
        meta=parts[0].iloc[:0],
        verify_meta=False,
    )
    result = solve_table(models["asia"], table, **OPTIONS).persist()
    futures = client.futures_of(result)
    deadline = time.monotonic() + 120
    while sum(f.done() for f in futures) < 6 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sum(f.done() for f in futures) == 6  # the ungated ones; two still waiting
    holders = client.who_has(futures)
    victim = max(
        client.scheduler_info()["workers"], key=lambda w: sum(w in held for held in holders.values())
    )
    pids = client.run(os.getpid)
    os.kill(pids[victim], signal.SIGKILL)  # its results and its running task are lost
    deadline = time.monotonic() + 120
    while victim in client.scheduler_info()["workers"] and time.monotonic() < deadline:
        time.sleep(0.1)
    distributed.Event("go", client=client).set()
    got = result.compute()
    assert victim not in client.scheduler_info()["workers"]
    assert_same_as_local(got, models["local"]["asia"], pd.concat(parts))
    client.wait_for_workers(2, timeout=120)  # the nanny restarted it, for the tests after


def test_a_profile_from_aot_runs_on_strict_workers(client, models, tmp_path, capsys):
    profile = tmp_path / "asia.profile.json"
    assert (
        main(
            [
                "aot",
                ASIA,
                "--evidence-vars",
                ",".join(ASIA_VARS),
                "--buckets",
                "1,8",
                "-o",
                str(profile),
                "-q",
            ]
        )
        == 0
    )
    parts = asia_parts()
    got = solve_table(str(profile), partitioned(parts)).compute()
    local = model_source(str(profile)).compile()
    assert_same_as_local(got, local, pd.concat(parts))


def test_warm_strict_workers_compile_nothing(client, models):
    """After the tests above ran on these workers (one of them restarted): under strict a
    miss would have failed its task (test_cache.py), and the counters show none. Each
    worker solves the table itself (left to the scheduler, all of it went to one worker
    once, and the other's counters were empty)."""
    for worker in client.scheduler_info()["workers"]:
        table = solve_table(models["asia"], partitioned(asia_parts()), **OPTIONS)
        client.compute(table, workers=[worker]).result()

    def counters():
        from catbp_jit.cache import default_cache

        cache = default_cache()
        return cache.policy, dict(cache.stats)

    seen = client.run(counters)
    assert len(seen) == 2
    for policy, stats in seen.values():
        assert policy == "strict"
        assert stats.get("compiled", 0) == 0 and stats.get("misses", 0) == 0
        assert stats.get("hits", 0) + stats.get("memo_hits", 0) > 0


def test_cli_writes_parquet_parts_like_the_input(client, models, tmp_path, capsys):
    src = tmp_path / "cases"
    src.mkdir()
    parts = asia_parts()
    for i, p in enumerate(parts):
        p.reset_index(drop=True).to_parquet(src / f"part{i}.parquet")
    out = tmp_path / "posteriors"
    code = main(
        [
            "solve",
            ASIA,
            "--evidence-table",
            str(src),
            "--dask",
            client.scheduler.address,
            "-o",
            str(out),
            "--plan-time",
            "0",
            "-q",
        ]
    )
    assert code == 0, capsys.readouterr().err
    written = sorted(out.glob("*.parquet"), key=lambda p: int(p.name.split(".")[1]))
    assert [len(pd.read_parquet(p)) for p in written] == [len(p) for p in parts]
    got = pd.concat([pd.read_parquet(p) for p in written]).set_axis(pd.concat(parts).index)
    assert_same_as_local(got, models["local"]["asia"], pd.concat(parts))


def test_a_failed_cli_run_leaves_the_old_output_directory(client, models, tmp_path, capsys):
    src = tmp_path / "cases"
    src.mkdir()
    parts = asia_parts()
    parts[2].loc[parts[2].index[5], "dysp"] = "maybe"  # a bad cell in one partition
    for i, p in enumerate(parts):
        p.reset_index(drop=True).to_parquet(src / f"part{i}.parquet")
    out = tmp_path / "posteriors"
    out.mkdir()
    (out / "old.parquet").write_text("the user's old output")
    code = main(
        [
            "solve",
            ASIA,
            "--evidence-table",
            str(src),
            "--dask",
            client.scheduler.address,
            "-o",
            str(out),
            "--plan-time",
            "0",
            "-q",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "'maybe' is not" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cases", "posteriors"]
    assert [p.name for p in out.iterdir()] == ["old.parquet"]


# -- errors: one clear message, no cluster needed ------------------------------------------


def test_a_bad_cell_names_the_model_row_and_column(models):
    frame = pd.DataFrame({"dysp": ["yes", "maybe"], "smoke": [0, 1]}, index=[10, 11])
    with (
        dask.config.set(scheduler="sync"),
        pytest.raises(FactorGraphError, match=r"asia: evidence row 11: dysp='maybe' is not"),
    ):
        solve_table(models["asia"], dd.from_pandas(frame, npartitions=1), **OPTIONS).compute()


def test_unknown_columns_and_profile_mismatches_are_one_error(models, tmp_path):
    with pytest.raises(TypeError, match="table must be a Dask DataFrame, got DataFrame"):
        solve_table(models["asia"], pd.DataFrame({"dysp": ["yes"]}))
    frame = dd.from_pandas(pd.DataFrame({"nosuch": [0]}), npartitions=1)
    with pytest.raises(FactorGraphError, match="asia: .*unknown or repeated: 'nosuch'"):
        solve_table(models["asia"], frame, **OPTIONS)
    profile = tmp_path / "p.profile.json"
    assert main(["aot", ASIA, "--evidence-vars", "dysp", "--buckets", "1,8", "-o", str(profile), "-q"]) == 0
    with pytest.raises(FactorGraphError, match="compiled with buckets=\\(1, 8\\)"):
        model_source(str(profile), buckets=(1, 64))
    doc = json.loads(profile.read_text())
    for target in ("cuda", "tpu"):  # a GPU's profile, and a name no target has
        doc["model"]["target"] = target
        other = tmp_path / f"{target}.profile.json"
        other.write_text(json.dumps(doc))
        with pytest.raises(
            FactorGraphError, match=f"a profile for target '{target}'; scaling out runs on CPUs"
        ):
            model_source(str(other))
    edited = tmp_path / "asia.bif"
    shutil.copy(ASIA, edited)
    assert main(["aot", str(edited), "--evidence-vars", "dysp", "-o", str(profile), "-q"]) == 0
    edited.write_text(edited.read_text().replace("0.01", "0.02", 1))
    with pytest.raises(FactorGraphError, match="changed since the profile was made"):
        model_source(str(profile))


def test_cli_dask_errors_are_one_line(models, tmp_path, capsys):
    csv = tmp_path / "cases.csv"
    csv.write_text("dysp\nyes\n")
    fake = tmp_path / "fake.parquet"
    fake.write_text("dysp\nyes\n")
    for argv, message in [
        (
            ["--evidence-table", str(csv), "--workers", "1", "-o", str(tmp_path / "o")],
            "solve a Parquet evidence table",
        ),
        (
            ["--evidence-table", str(fake), "--workers", "1", "-o", str(tmp_path / "o")],
            "fake.parquet: not a readable Parquet file (Error creating dataset.",
        ),
        (["--dask", "tcp://x:1", "--workers", "2"], "exclude each other"),
        (["--workers", "1", "--dask-timeout", "5"], "--dask-timeout goes with --dask ADDRESS"),
        (["--dask", "tcp://x:1", "--dask-timeout", "0"], "--dask-timeout must be more than 0 seconds, got 0"),
        (
            ["--evidence-table", str(fake), "--workers", "1", "--target", "cuda", "-o", str(tmp_path / "o")],
            "(the workers run the CPU kernels)",
        ),
    ]:
        code = main(["solve", ASIA, *argv, "-q"])
        err = capsys.readouterr().err
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    src = tmp_path / "cases"
    src.mkdir()
    asia_parts()[0].to_parquet(src / "part0.parquet")
    code = main(
        [
            "solve",
            ASIA,
            "--evidence-table",
            str(src),
            "--dask",
            "tcp://127.0.0.1:1",
            "--dask-timeout",
            "1",
            "-o",
            str(tmp_path / "out"),
            "-q",
        ]
    )  # nobody listens: 1 s to give up (10 by default)
    err = capsys.readouterr().err
    assert code == 2 and "cannot reach the Dask scheduler at tcp://127.0.0.1:1" in err
    assert "Timed out trying to connect to tcp://127.0.0.1:1 after 1" in err, err
    assert len(err.strip().splitlines()) == 1
    assert main(["solve", ASIA, "--workers", "0"]) == 2  # argparse: usage, then the reason
    assert "number of workers >= 1" in capsys.readouterr().err


def test_without_dask_one_error_names_the_extra(monkeypatch, models):
    import sys

    monkeypatch.setitem(sys.modules, "dask.bag", None)  # as if not installed
    with pytest.raises(DaskMissingError, match=r"pip install 'catbp_jit\[dask\]'"):
        solve_many([models["asia"]])
