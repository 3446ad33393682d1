"""Shared by the front-end tests: random small factor graphs with evidence, the answer by
brute-force enumeration and its check, and random Ising grids."""

import math

import numpy as np
import pytest
from hypothesis import strategies as st

from catbp_jit.frontend import factor_graph
from catbp_jit.frontend.search import PlanSearch

SEMIRINGS = ("prob", "logprob", "sat", "count")
# for the tests of real instances, whose answers do not depend on the plan: two seeded
# trials, the same plan on any machine (they fit the budget), where the default search
# spends its 10 s on each instance
SHORT_SEARCH = PlanSearch(trials=2)


@st.composite
def graphs(draw, max_vars=6):
    n = draw(st.integers(1, max_vars))
    sizes = {f"v{i}": draw(st.integers(1, 3)) for i in range(n)}
    names = list(sizes)
    factors = []
    for _ in range(draw(st.integers(0, 7))):
        scope = draw(st.lists(st.sampled_from(names), min_size=0, max_size=min(4, n), unique=True))
        shape = [sizes[v] for v in scope]
        count = int(np.prod(shape, dtype=np.int64))
        vals = draw(st.lists(st.one_of(st.just(0.0), st.floats(0.05, 3.0)), min_size=count, max_size=count))
        factors.append((tuple(scope), np.array(vals, dtype=np.float64).reshape(shape)))
    evidence = draw(st.dictionaries(st.sampled_from(names), st.integers(0, 2), max_size=3))
    evidence = {v: x % sizes[v] for v, x in evidence.items()}
    return factor_graph(sizes, factors), evidence


def brute_force(graph, evidence):
    """The joint table by enumeration: the product of every factor and indicator."""
    names = list(graph.variables)
    shape = tuple(graph.variables.values())
    joint = np.ones(shape)
    letters = "abcdefghijklmnopqrstuvwxyz"
    for f in graph.factors:
        sub = "".join(letters[names.index(v)] for v in f.scope)
        joint = joint * np.einsum(f"{sub}->{''.join(sorted(sub))}", f.values).reshape(
            [s if letters[i] in sub else 1 for i, s in enumerate(shape)]
        )
    for v, x in evidence.items():
        i = names.index(v)
        ind = np.zeros(shape[i])
        ind[x] = 1.0
        joint = joint * ind.reshape([shape[i] if j == i else 1 for j in range(len(shape))])
    marg = {v: joint.sum(axis=tuple(j for j in range(len(shape)) if j != i)) for i, v in enumerate(names)}
    return joint, marg


def check_solution(s, joint, marg, semiring):
    z = joint.sum()
    if semiring == "prob":
        assert s.Z == pytest.approx(z, rel=1e-12, abs=0)
    elif semiring == "logprob":
        assert s.log_Z == (-math.inf if z == 0 else pytest.approx(math.log(z), rel=1e-10, abs=1e-12))
    elif semiring == "sat":
        assert s.Z is bool(z > 0) and s.log_Z == (0.0 if z > 0 else -math.inf)
    else:
        assert s.Z == int(np.count_nonzero(joint))
    for v, m in marg.items():
        got = s.marginals[v]
        if semiring == "sat":
            np.testing.assert_array_equal(got, m > 0)
        elif semiring == "count":
            counts = np.count_nonzero(
                joint, axis=tuple(j for j in range(joint.ndim) if j != list(marg).index(v))
            )
            np.testing.assert_array_equal(s.raw_marginals[v], counts)
        elif z > 0:
            np.testing.assert_allclose(got, m / z, rtol=1e-10, atol=1e-14)
        else:
            assert np.isnan(got).all()


def ising_grid(n: int, m: int, strength: float, seed: int, offset: float = 0.0):
    """Fields and couplings uniform in ±strength, as log-potentials; offset shifts every
    log-potential (a negative offset makes log Z very negative)."""
    rng = np.random.default_rng(seed)

    def name(i, j):
        return f"x{i}_{j}"

    factors = []
    for i in range(n):
        for j in range(m):
            h = rng.uniform(-strength, strength)
            factors.append(((name(i, j),), np.exp(np.array([h, -h]) + offset)))
            for di, dj in ((0, 1), (1, 0)):
                if i + di < n and j + dj < m:
                    J = rng.uniform(-strength, strength)
                    factors.append(
                        ((name(i, j), name(i + di, j + dj)), np.exp(np.array([[J, -J], [-J, J]]) + offset))
                    )
    return factor_graph({name(i, j): 2 for i in range(n) for j in range(m)}, factors, name=f"ising{n}x{m}")


def chain_uai(n: int, seed: int = 0) -> str:
    """The issue's model: n binary variables, factor i over (i-1, i)."""
    rng = np.random.default_rng(seed)
    lines = ["MARKOV", str(n), " ".join(["2"] * n), str(n - 1)]
    lines += [f"2 {i - 1} {i}" for i in range(1, n)]
    for _ in range(1, n):
        lines += ["4", " ".join(f"{x:.6f}" for x in rng.uniform(0.1, 1.0, 4))]
    return "\n".join(lines) + "\n"
