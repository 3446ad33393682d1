"""Models from pgmpy and pyAgrum objects (catbp_jit.interop), and the model files that
read_model hands to pyAgrum.

The converted tables are checked entry by entry against each library's own lookup by
state (pgmpy's get_value, pyAgrum's Instantiation), not against their array layouts; the
bnlearn networks (asia, alarm: `python -m catbp_jit.frontend.bnlearn` fetches them)
against read_bif of the same file, and the answers against each library's inference.
The pgmpy tests skip without pgmpy, the pyAgrum tests without pyAgrum.
"""

from __future__ import annotations

import gzip
import itertools
import json
import math
import sys

import numpy as np
import pytest

from catbp_jit.frontend import FactorGraphError, bnlearn, compile_model
from catbp_jit.frontend.bif import read_bif
from catbp_jit.frontend.commands import CommandError, read_model
from catbp_jit.interop import from_pgmpy, from_pyagrum, read_pyagrum_file
from frontend_helpers import brute_force

NETWORKS = ["asia", "alarm"]
ASIA_EVIDENCE = {"asia": "yes", "xray": "yes", "dysp": "no"}


@pytest.fixture(scope="module")
def pgmpy():
    return pytest.importorskip("pgmpy")


@pytest.fixture(scope="module")
def pgmpy_networks(pgmpy):
    """name -> pgmpy's model of a bnlearn network, read once (pgmpy's reader takes ~1 s)."""
    from pgmpy.readwrite import BIFReader

    read = {}

    def network(name):
        if name not in read:
            read[name] = BIFReader(string=bif_text(name)).get_model()
        return read[name]

    return network


@pytest.fixture(scope="module")
def gum():
    return pytest.importorskip("pyagrum")


def bif_text(name):
    if name not in bnlearn.available():
        pytest.skip(f"{name} not in {bnlearn.data_dir()} (python -m catbp_jit.frontend.bnlearn fetches it)")
    return gzip.decompress(bnlearn.network_path(name).read_bytes()).decode()


def answers(graph, evidence):
    model = compile_model(graph, "prob", target="reference", evidence_vars=tuple(evidence))
    return model.solve(evidence)


def assert_same_answers(got, want):
    assert got.log_Z == pytest.approx(want.log_Z, rel=1e-12, abs=1e-12)
    assert list(got.marginals) == list(want.marginals)
    for v, m in want.marginals.items():
        np.testing.assert_allclose(got.marginals[v], m, rtol=1e-12, atol=1e-15)


def aligned(factor, scope):
    """factor's table with its axes in `scope` order."""
    return np.transpose(factor.values, [factor.scope.index(v) for v in scope])


def assert_same_graph(graph, want):
    """Same variables in the same order, same states, and the same tables exactly (each
    factor found by its set of variables: the CPTs of a network have distinct ones)."""
    assert list(graph.variables.items()) == list(want.variables.items())
    assert graph.states == want.states
    assert len(graph.factors) == len(want.factors)
    by_scope = {frozenset(f.scope): f for f in graph.factors}
    for f in want.factors:
        got = aligned(by_scope[frozenset(f.scope)], f.scope)
        assert got.dtype == np.float64
        np.testing.assert_array_equal(got, f.values)


def unlikely_evidence(graph, names):
    """Each variable in turn observed in its least likely possible state (so P(e) > 0),
    given by state name."""
    evidence = {}
    for v in names:
        p = answers(graph, evidence).marginals[v]
        evidence[v] = graph.states[v][int(np.argmin(np.where(p > 0, p, np.inf)))]
    return evidence


def check_evidence_by_name(graph, want_graph, evidence):
    """graph answers evidence given by state names as want_graph does, and as the same
    evidence given by state indices."""
    got = answers(graph, evidence)
    assert_same_answers(got, answers(want_graph, evidence))
    by_index = {v: graph.states[v].index(s) for v, s in evidence.items()}
    assert_same_answers(answers(graph, by_index), got)
    return got


# ---------------------------------------------------------------------------------------
# pgmpy


def small_pgmpy_network(pgmpy):
    from pgmpy.factors.discrete import TabularCPD
    from pgmpy.models import DiscreteBayesianNetwork

    model = DiscreteBayesianNetwork([("A", "C"), ("B", "C")])
    states = {"A": ["a0", "a1"], "B": ["lo", "mid", "hi"], "C": ["no", "yes"]}
    rows = np.array([[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.9, 0.8, 0.7, 0.6, 0.5, 0.4]])
    model.add_cpds(
        TabularCPD("A", 2, [[0.3], [0.7]], state_names={"A": states["A"]}),
        TabularCPD("B", 3, [[0.2], [0.5], [0.3]], state_names={"B": states["B"]}),
        TabularCPD("C", 2, rows, evidence=["A", "B"], evidence_card=[2, 3], state_names=states),
    )
    return model


def test_pgmpy_tables_follow_the_cpd_layout(pgmpy):
    model = small_pgmpy_network(pgmpy)
    graph = from_pgmpy(model)
    assert list(graph.variables.items()) == [("A", 2), ("C", 2), ("B", 3)]  # the model's node order
    assert graph.states == {"A": ("a0", "a1"), "B": ("lo", "mid", "hi"), "C": ("no", "yes")}
    assert graph.name == "pgmpy model" and from_pgmpy(model, name="mine").name == "mine"
    cpt = {f.scope[0]: f for f in graph.factors}["C"]
    assert cpt.scope == ("C", "A", "B")
    cpd = model.get_cpds("C")
    flat = cpd.get_values()  # (card C, card A * card B), B (the last evidence) fastest
    for c, a, b in itertools.product(range(2), range(2), range(3)):
        names = {"C": graph.states["C"][c], "A": graph.states["A"][a], "B": graph.states["B"][b]}
        assert cpt.values[c, a, b] == cpd.get_value(**names) == flat[c, 3 * a + b]
    cpd.values[...] = 0  # the graph holds copies
    assert cpt.values[1, 1, 2] == 0.4


@pytest.mark.parametrize("name", NETWORKS)
def test_pgmpy_bnlearn_network_is_read_bif(pgmpy_networks, name):
    graph = from_pgmpy(pgmpy_networks(name), name=name)
    want = read_bif(bif_text(name), name=name, normalize=False)  # pgmpy keeps the entries as written
    assert_same_graph(graph, want)
    evidence = unlikely_evidence(want, list(want.variables)[-3:])
    check_evidence_by_name(graph, want, evidence)
    assert_same_answers(answers(graph, {}), answers(want, {}))


def test_pgmpy_asia_posteriors_match_variable_elimination(pgmpy_networks):
    from pgmpy.inference import VariableElimination

    model = pgmpy_networks("asia")
    graph = from_pgmpy(model)
    ours = answers(graph, ASIA_EVIDENCE)
    inference = VariableElimination(model)
    for v in graph.variables:
        if v not in ASIA_EVIDENCE:
            theirs = inference.query([v], evidence=ASIA_EVIDENCE, show_progress=False)
            assert theirs.state_names[v] == list(graph.states[v])
            np.testing.assert_allclose(ours.marginals[v], theirs.values, rtol=1e-12, atol=1e-15)


def test_pgmpy_markov_network_matches_enumeration(pgmpy):
    from pgmpy.factors.discrete import DiscreteFactor
    from pgmpy.models import DiscreteMarkovNetwork

    rng = np.random.default_rng(7)
    states = {"A": ["a0", "a1"], "B": ["b0", "b1", "b2"], "C": ["c0", "c1"]}
    scopes = [("A", "B"), ("C", "B"), ("A", "C"), ("B",)]  # a loop, and a unary factor
    model = DiscreteMarkovNetwork([("A", "B"), ("B", "C"), ("C", "A")])
    model.name = "loop"
    factors = []
    for scope in scopes:
        values = rng.uniform(0.5, 3.0, size=[len(states[v]) for v in scope])
        values.flat[0] = 0.0  # a zero, exactly kept
        factors.append(
            DiscreteFactor(list(scope), values.shape, values, state_names={v: states[v] for v in scope})
        )
    model.add_factors(*factors)
    graph = from_pgmpy(model)
    assert graph.name == "loop" and list(graph.variables) == list(model.nodes())
    for ours, theirs in zip(graph.factors, factors):
        assert ours.scope == tuple(theirs.variables)
        for index in itertools.product(*map(range, ours.values.shape)):
            names = {v: states[v][i] for v, i in zip(ours.scope, index)}
            assert ours.values[index] == theirs.get_value(**names)
    evidence = {"B": "b2"}
    joint, marg = brute_force(graph, {"B": 2})
    got = answers(graph, evidence)
    assert got.log_Z == pytest.approx(math.log(joint.sum()), rel=1e-12)
    for v, m in marg.items():
        np.testing.assert_allclose(got.marginals[v], m / m.sum(), rtol=1e-12, atol=1e-15)


def test_pgmpy_models_that_do_not_convert(pgmpy):
    from pgmpy.factors.continuous import LinearGaussianCPD
    from pgmpy.factors.discrete import DiscreteFactor, TabularCPD
    from pgmpy.models import DiscreteBayesianNetwork, DiscreteMarkovNetwork, LinearGaussianBayesianNetwork

    with pytest.raises(FactorGraphError, match="net: the Bayesian network has no CPDs"):
        from_pgmpy(DiscreteBayesianNetwork([("A", "B")]), name="net")

    gaussian = LinearGaussianBayesianNetwork([("A", "B")])
    gaussian.add_cpds(LinearGaussianCPD("A", [0.5], 1.0), LinearGaussianCPD("B", [0.1, 2.0], 1.0, ["A"]))
    with pytest.raises(FactorGraphError, match="LinearGaussianBayesianNetwork is not a pgmpy"):
        from_pgmpy(gaussian)
    continuous_cpd = DiscreteBayesianNetwork()
    continuous_cpd.add_node("A")
    continuous_cpd.cpds.append(LinearGaussianCPD("A", [0.5], 1.0))  # add_cpds refuses it: pgmpy 0.1 took it
    with pytest.raises(FactorGraphError, match="CPD of 'A' is a LinearGaussianCPD; only discrete"):
        from_pgmpy(continuous_cpd)

    partial = DiscreteBayesianNetwork([("A", "B")])
    partial.add_cpds(TabularCPD("A", 2, [[0.5], [0.5]]))
    with pytest.raises(FactorGraphError, match="no CPD for 'B'"):
        from_pgmpy(partial)

    disagree = DiscreteBayesianNetwork([("A", "C")])
    disagree.add_cpds(
        TabularCPD("A", 3, [[0.2], [0.3], [0.5]]),
        TabularCPD("C", 2, [[0.1, 0.2], [0.9, 0.8]], evidence=["A"], evidence_card=[2]),
    )
    with pytest.raises(FactorGraphError, match="the CPD of 'C' gives 'A' 2 states; it has 3 elsewhere"):
        from_pgmpy(disagree)

    renamed = small_pgmpy_network(pgmpy)
    renamed.add_cpds(TabularCPD("A", 2, [[0.3], [0.7]], state_names={"A": ["x", "y"]}))
    with pytest.raises(FactorGraphError, match="names the states of 'A' .*'a0', 'a1'"):
        from_pgmpy(renamed)

    unlinked = DiscreteBayesianNetwork([("A", "C")])
    unlinked.add_node("B")
    unlinked.add_cpds(*small_pgmpy_network(pgmpy).get_cpds())  # C's CPD names B, the graph does not
    with pytest.raises(FactorGraphError, match="CPD of 'C' is conditioned on .* parents in the graph are"):
        from_pgmpy(unlinked)

    markov = DiscreteMarkovNetwork([("A", "B")])
    with pytest.raises(FactorGraphError, match="the Markov network has no factors"):
        from_pgmpy(markov)
    markov.add_node("Z")
    markov.add_factors(DiscreteFactor(["A", "B"], [2, 2], [1.0, 2.0, 3.0, 4.0]))
    with pytest.raises(FactorGraphError, match="no factor is over 'Z', so their numbers of states"):
        from_pgmpy(markov)


# ---------------------------------------------------------------------------------------
# pyAgrum


def entries(gum, tensor):
    """Each entry of a pyAgrum tensor as ({variable: state index}, value), by pyAgrum's
    own Instantiation (independent of toarray()'s axis order)."""
    at = gum.Instantiation(tensor)
    at.setFirst()
    while not at.end():
        yield {at.variable(i).name(): at.val(i) for i in range(at.nbrDim())}, tensor.get(at)
        at.inc()


def assert_tables_match(gum, factor, tensor):
    assert set(factor.scope) == set(tensor.names)
    for states, value in entries(gum, tensor):
        assert factor.values[tuple(states[v] for v in factor.scope)] == value


def small_pyagrum_network(gum, discretized=True):
    """A -> C <- B, D -> C; D a DiscretizedVariable (interval labels, which pyAgrum's own
    .net writer does not write so that its reader reads them back), else a labelized one."""
    model = gum.BayesNet("small")
    model.add(gum.LabelizedVariable("A", "A", ["a0", "a1"]))
    model.add(gum.RangeVariable("B", "B", 1, 3))
    if discretized:
        model.add(gum.DiscretizedVariable("D", "D", [0.0, 0.5, 1.5]))
    else:
        model.add(gum.LabelizedVariable("D", "D", ["low", "high"]))
    model.add(gum.LabelizedVariable("C", "C", ["no", "yes"]))
    for parent in "ABD":
        model.addArc(parent, "C")
    rng = np.random.default_rng(3)
    for v in "ABDC":
        cpt = model.cpt(v)
        cpt.fillWith(list(rng.uniform(0.1, 1.0, size=cpt.domainSize())))
        cpt.normalizeAsCPT()
    return model


def test_pyagrum_tables_follow_the_tensor_layout(gum):
    model = small_pyagrum_network(gum)
    graph = from_pyagrum(model)
    assert list(graph.variables.items()) == [("A", 2), ("B", 3), ("D", 2), ("C", 2)]  # node id order
    assert graph.states == {
        "A": ("a0", "a1"),
        "B": ("1", "2", "3"),
        "D": ("[0;0.5[", "[0.5;1.5]"),
        "C": ("no", "yes"),
    }
    assert graph.name == "small" and from_pyagrum(model, name="mine").name == "mine"
    for factor, node in zip(graph.factors, sorted(model.nodes())):  # a CPT per node, in id order
        assert factor.values.dtype == np.float64
        assert factor.scope[-1] == model.variable(node).name()  # pyAgrum's first variable: the CPT's own
        assert_tables_match(gum, factor, model.cpt(node))


@pytest.mark.parametrize("name", NETWORKS)
def test_pyagrum_bnlearn_network_is_read_bif(gum, name, tmp_path):
    text = bif_text(name)
    path = tmp_path / f"{name}.bif"  # pyAgrum reads uncompressed files only
    path.write_text(text)
    model = gum.loadBN(str(path))
    want = read_bif(text, name=name, normalize=False)
    # pyAgrum's BIF reader rounds the entries to float32: put back the exact ones (by
    # pyAgrum's own Instantiation, so this does not lean on the layout under test)
    for factor in want.factors:
        cpt = model.cpt(factor.scope[0])
        at = gum.Instantiation(cpt)
        at.setFirst()
        while not at.end():
            states = {at.variable(i).name(): at.val(i) for i in range(at.nbrDim())}
            cpt.set(at, float(factor.values[tuple(states[v] for v in factor.scope)]))
            at.inc()
    graph = from_pyagrum(model, name=name)
    assert_same_graph(graph, want)
    evidence = unlikely_evidence(want, list(want.variables)[-3:])
    check_evidence_by_name(graph, want, evidence)
    assert_same_answers(answers(graph, {}), answers(want, {}))


def test_pyagrum_asia_posteriors_match_lazy_propagation(gum, tmp_path):
    path = tmp_path / "asia.bif"
    path.write_text(bif_text("asia"))
    model = gum.loadBN(str(path))
    graph = from_pyagrum(model)
    ours = answers(graph, ASIA_EVIDENCE)
    inference = gum.LazyPropagation(model)
    inference.setEvidence(ASIA_EVIDENCE)
    inference.makeInference()
    assert ours.log_Z == pytest.approx(math.log(inference.evidenceProbability()), rel=1e-12)
    for v in graph.variables:
        np.testing.assert_allclose(
            ours.marginals[v], inference.posterior(v).toarray(), rtol=1e-12, atol=1e-15
        )


def test_pyagrum_markov_random_field_matches_enumeration(gum):
    model = gum.MarkovRandomField("loop")
    model.add(gum.LabelizedVariable("A", "A", ["a0", "a1"]))
    model.add(gum.LabelizedVariable("B", "B", ["b0", "b1", "b2"]))
    model.add(gum.IntegerVariable("C", "C", [3, 7]))
    model.add(gum.LabelizedVariable("D", "D", ["d0", "d1"]))  # in no factor: a free variable
    rng = np.random.default_rng(5)
    for scope in (["A", "B"], ["B", "C"], ["C", "A"], ["A", "B", "C"]):
        model.addFactor(scope)
        tensor = model.factor(scope)
        values = rng.uniform(0.5, 3.0, size=tensor.domainSize())
        values[0] = 0.0
        tensor.fillWith(list(values))
    graph = from_pyagrum(model)
    assert graph.name == "loop" and list(graph.variables) == ["A", "B", "C", "D"]
    assert graph.states["C"] == ("3", "7")
    for factor, nodes in zip(graph.factors, model.factors()):
        assert_tables_match(gum, factor, model.factor(nodes))

    evidence = {"C": "7"}
    joint, marg = brute_force(graph, {"C": 1})
    got = answers(graph, evidence)
    assert got.log_Z == pytest.approx(math.log(joint.sum()), rel=1e-12)
    inference = gum.ShaferShenoyMRFInference(model)
    inference.setEvidence(evidence)
    inference.makeInference()
    for v, m in marg.items():
        np.testing.assert_allclose(got.marginals[v], m / m.sum(), rtol=1e-12, atol=1e-15)
        if v != "D":  # pyAgrum has no posterior for a variable in no factor
            np.testing.assert_allclose(
                got.marginals[v], inference.posterior(v).toarray(), rtol=1e-12, atol=1e-15
            )


def test_pyagrum_objects_that_do_not_convert(gum):
    with pytest.raises(FactorGraphError, match="a InfluenceDiagram is not a pyAgrum BayesNet"):
        from_pyagrum(gum.InfluenceDiagram())


def pyagrum_formats(gum):
    found = [".net", ".xdsl", ".bifxml", ".dsl", ".o3prm"]
    return found + [f".{ext}" for ext in ("jgum", "bgum") if ext in gum.availableBNExts().split("|")]


def test_pyagrum_files_through_read_model(gum, tmp_path):
    import pyagrum.prm  # noqa: F401  (pyAgrum writes .o3prm only with it)

    model = small_pyagrum_network(gum, discretized=False)
    evidence = {"C": "yes", "D": "high"}
    want = answers(from_pyagrum(model), evidence)
    for suffix in pyagrum_formats(gum):
        path = tmp_path / f"small{suffix}"
        gum.saveBN(model, str(path))
        graph = read_model(str(path))
        assert graph.name == "small", suffix  # the file's name
        # the writers round the entries (to 6 digits in .xdsl): compare with what pyAgrum reads back
        assert_same_graph(graph, from_pyagrum(gum.loadBN(str(path)), name="small"))
        got = answers(graph, evidence)
        assert got.log_Z == pytest.approx(want.log_Z, rel=1e-5), suffix
        for v, m in want.marginals.items():
            np.testing.assert_allclose(got.marginals[v], m, rtol=1e-5, err_msg=suffix)


def test_pyagrum_file_through_the_cli(gum, tmp_path, capsys):
    from catbp_jit.cli import main

    path = tmp_path / "small.net"
    gum.saveBN(small_pyagrum_network(gum, discretized=False), str(path))
    argv = ["solve", str(path), "--observe", "C=yes", "--observe", "B=3", "--format", "json"]
    assert main([*argv, "--target", "reference", "-q"]) == 0
    doc = json.loads(capsys.readouterr().out)
    want = answers(read_pyagrum_file(path), {"C": "yes", "B": "3"})
    assert doc["log_Z"] == pytest.approx(want.log_Z, rel=1e-12)
    assert doc["states"]["D"] == ["low", "high"]
    np.testing.assert_allclose(doc["marginals"]["A"], want.marginals["A"], rtol=1e-12)


def test_a_pyagrum_file_as_a_model_source_and_through_aot(gum, tmp_path):
    """Dask's workers and `catbp-jit aot` take the file's bytes (model_source.py): they read
    the formats read_model reads."""
    from catbp_jit.cli import main
    from catbp_jit.frontend.model_source import model_source

    path = tmp_path / "small.net"
    gum.saveBN(small_pyagrum_network(gum, discretized=False), str(path))
    source = model_source(str(path), evidence_vars=["C"])
    assert (source.fmt, source.name) == (".net", "small")
    assert_same_graph(source.graph(), read_pyagrum_file(path))
    profile = tmp_path / "small.profile.json"
    assert main(["aot", str(path), "--evidence-vars", "C", "-o", str(profile), "-q"]) == 0
    assert model_source(str(profile)).key() == source.key()


def test_pyagrum_files_that_do_not_read(gum, tmp_path, capsys):
    from catbp_jit.cli import main

    garbage = tmp_path / "bad.net"
    garbage.write_text("net {{{ not hugin")
    with pytest.raises(FactorGraphError, match=r"bad\.net: pyAgrum cannot read it: .*Syntax error"):
        read_model(str(garbage))
    assert main(["solve", str(garbage), "-q"]) == 2  # pyAgrum's lines of message, as one line
    err = capsys.readouterr().err
    assert err.startswith("catbp-jit: error: ") and "Syntax error" in err and err.count("\n") == 1
    with pytest.raises(FactorGraphError, match=r"pyAgrum cannot read it: .*missing\.xdsl"):
        read_pyagrum_file(tmp_path / "missing.xdsl")
    pickled = tmp_path / "model.pkl"
    gum.saveBN(small_pyagrum_network(gum), str(pickled))
    with pytest.raises(FactorGraphError, match="a pickle runs code when it is loaded"):
        read_pyagrum_file(pickled)


# ---------------------------------------------------------------------------------------
# without either library


def test_read_model_says_how_to_install_pyagrum(tmp_path, monkeypatch):
    path = tmp_path / "model.xdsl"
    path.write_text("<smile/>")
    for module in ("pyagrum", "pyAgrum"):
        monkeypatch.setitem(sys.modules, module, None)  # as if neither were installed
    with pytest.raises(
        CommandError, match=r"model\.xdsl: reading this model needs pyAgrum: pip install pyagrum"
    ):
        read_model(str(path))


def test_other_objects_are_refused_without_either_library():
    with pytest.raises(FactorGraphError, match="pgmpy model: a dict is not a pgmpy Discrete"):
        from_pgmpy({"A": 2})
    with pytest.raises(FactorGraphError, match="mine: a list is not a pyAgrum BayesNet"):
        from_pyagrum([1, 2], name="mine")


def test_read_model_unknown_suffix(tmp_path):
    path = tmp_path / "model.xyz"
    path.write_text("")
    with pytest.raises(
        CommandError, match=r"model\.xyz: unknown model format \(expected one of \.uai, .*\.net"
    ):
        read_model(str(path))
