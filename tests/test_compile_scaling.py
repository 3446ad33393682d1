"""Compile time grows linearly with a program's length (issue 24), and progress lines.

A MARKOV chain of n binary variables (`2 i-1 i` pairwise factors, UAI format) took ~46 s
to compile at n = 4,000 and ~296 s at 10^4 (a list searched per segment in fusion, a
register list scanned per node in emit_tree, a plan search, every segment lowered
alone). Work is counted here rather than timed, but for one generous bound on 10^4.
"""

import cProfile
import math
import pstats
import threading
import time

import numpy as np
import pytest

from catbp_jit.cli import main
from catbp_jit.executable import plan
from catbp_jit.frontend import compile_model
from catbp_jit.frontend.uai import read_uai
from catbp_jit.progress import DelayedLines, command_lines, silent, ticker
from frontend_helpers import chain_uai


def chain_log_z(graph) -> float:
    """log Z by the forward recursion, normalized at each step (float64)."""
    message, log_z = np.ones(2), 0.0
    for factor in graph.factors:
        message = message @ np.asarray(factor.values, dtype=np.float64)
        total = message.sum()
        message, log_z = message / total, log_z + math.log(total)
    return log_z


def planned(n: int):
    """(the chain's front-end model, its plan), nothing compiled; with a profile of both."""
    graph = read_uai(chain_uai(n))
    profile = cProfile.Profile()
    profile.enable()
    model = compile_model(graph, "prob", absorb_evidence=True, target="reference")
    the_plan = plan(list(model.programs), model.sr, factor_specs=model.factor_specs)
    profile.disable()
    return model, the_plan, pstats.Stats(profile)


def calls_of(stats: pstats.Stats, name: str) -> int:
    return sum(row[1] for (_, _, fn), row in stats.stats.items() if fn == name)


@pytest.mark.slow  # (~7 s: two chains of 750 and 3,000 variables planned under a profiler)
def test_planning_work_grows_linearly_with_the_chain():
    """Function calls per variable stay the same from 750 to 3,000 variables (a list
    search by equality per segment made fusion's grow with n), and a chain's segments,
    all of a few shapes, are lowered once per shape."""
    _, small_plan, small = planned(750)
    _, big_plan, big = planned(3000)
    assert len(big_plan.fused.segments) > 4 * 3000 * 0.9
    ratio = big.total_calls / small.total_calls
    assert ratio < 4.5, f"4x the variables made {ratio:.2f}x the calls"
    assert calls_of(big, "lower_segment") < 40 < len(big_plan.fused.segments)
    # no plan search for a tree of pairwise factors: the greedy plan is already optimal
    assert calls_of(big, "searched_order") == 0


@pytest.mark.slow
def test_a_10k_variable_chain_compiles_end_to_end_in_bounded_time():
    """The whole compile (front end, plan, kernels from the cache) of the issue's 10^4
    chain, within a bound the quadratic planner missed five times over; the answer is
    the forward recursion's."""
    graph = read_uai(chain_uai(10_000))
    compile_model(read_uai(chain_uai(50)), "prob", absorb_evidence=True)  # warm kernels
    t0 = time.perf_counter()
    model = compile_model(graph, "prob", absorb_evidence=True)
    seconds = time.perf_counter() - t0
    assert seconds < 60, f"compiling a 10^4-variable chain took {seconds:.0f} s"
    assert model.solve().log_Z == pytest.approx(chain_log_z(graph), rel=1e-12)


# -- progress lines ------------------------------------------------------------------------


def test_a_ticker_says_at_most_one_line_per_interval():
    lines = []
    tick = ticker(lines.append, "planning: segments lowered", 5000, every=3600)
    for i in range(5000):
        tick(i)
    assert lines == []
    tick = ticker(lines.append, "planning: segments lowered", 5000, every=0)
    tick(3000)
    assert lines == ["planning: segments lowered 3,000/5,000"]
    ticker(None, "x", 1)(0)  # no progress: nothing to call
    ticker(silent, "x", 1)(0)


def test_delayed_lines_show_nothing_for_a_quick_compile():
    lines = []
    progress = DelayedLines(lines.append, after=3600)
    progress("planning: fusing 3 nodes")
    progress.close()
    progress("compiled")
    assert lines == []


def test_delayed_lines_show_every_line_once_the_time_has_come():
    lines = []
    progress = DelayedLines(lines.append, after=0)
    progress("planning: fusing 3 nodes")
    progress.close()
    progress("after close")
    assert len(lines) == 1 and lines[0].endswith("s] planning: fusing 3 nodes")


def test_the_stage_still_running_is_shown_when_the_time_comes():
    shown = threading.Event()
    lines = []
    progress = DelayedLines(lambda line: (lines.append(line), shown.set()), after=0.05)
    progress("kernel 1/4: contract_reduce_prob_float64")  # held back: too early
    assert shown.wait(30), "the timer never showed the held-back line"
    progress.close()
    assert len(lines) == 1 and lines[0].endswith("kernel 1/4: contract_reduce_prob_float64")


def test_quiet_commands_get_no_progress():
    assert command_lines(quiet=True) is silent


@pytest.fixture
def chain_file(tmp_path):
    path = tmp_path / "chain.uai"
    path.write_text(chain_uai(40))
    return str(path)


def test_solve_prints_progress_lines_past_the_threshold(chain_file, capsys, monkeypatch):
    monkeypatch.setenv("CATBP_JIT_PROGRESS_AFTER", "0")
    assert main(["solve", chain_file, "--format", "json"]) == 0
    err = capsys.readouterr().err
    assert "planning: lowering" in err and "planning: fusing" in err
    assert main(["solve", chain_file, "--format", "json", "-q"]) == 0
    assert capsys.readouterr().err == ""


def test_solve_is_silent_before_the_threshold(chain_file, capsys, monkeypatch):
    monkeypatch.setenv("CATBP_JIT_PROGRESS_AFTER", "3600")
    assert main(["solve", chain_file, "--format", "json"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("value", ["-1", "soon", "inf"])
def test_a_bad_progress_threshold_is_one_line(value, chain_file, capsys, monkeypatch):
    monkeypatch.setenv("CATBP_JIT_PROGRESS_AFTER", value)
    assert main(["solve", chain_file]) == 2
    err = capsys.readouterr().err
    assert "CATBP_JIT_PROGRESS_AFTER" in err and err.count("\n") == 1
