import os

# The CUDA kernels run under Numba's simulator here, unless the environment says otherwise
# (a GPU machine runs the same tests with NUMBA_ENABLE_CUDASIM=0). Numba reads this when it
# is first imported, so it is set before anything imports it.
os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
# compile() waits for its kernels here (the numpy tier and its switch are tested where a
# test asks for tier="auto"): a test that checks kernels gets them, and no test leaves
# worker processes compiling behind it.
os.environ["CATBP_JIT_TIER"] = "compiled"

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"  # shipped: the suite passes from a clone alone


def shared_dir() -> Path:
    """The project's shared data when it is there (../shared beside the checkout, where CI
    puts it, or CATBP_SHARED_DIR), else the copy of what the tests need in tests/data."""
    env = os.environ.get("CATBP_SHARED_DIR")
    shared = Path(env) if env else REPO.parent / "shared"
    return shared if (shared / "corpus").is_dir() else DATA


def bundle_dirs(kind: str):
    """The bundles of `kind` in shared_dir(), and those of tests/data that it lacks: the
    project's own, such as the MAXLOG corpus bundles (tests/data/make_maxlog_bundles.py)."""
    found = {}
    for root in (DATA / kind, shared_dir() / kind):  # the shared data's win
        found.update({p.name: p for p in root.glob("*/") if (p / "bundle.json").exists()})
    return [found[name] for name in sorted(found)]


def pytest_configure(config):
    # a plan search that fails part-way is survived, so only its warning would tell. (Not
    # in pyproject.toml: pytest would import catbp_jit, hence Numba, to resolve the class
    # before this file sets NUMBA_ENABLE_CUDASIM, and the CUDA tests would want a GPU.)
    config.addinivalue_line("filterwarnings", "error::catbp_jit.frontend.search.PlanSearchWarning")


CORPUS = bundle_dirs("corpus")
BENCH = bundle_dirs("bench")


def corpus_sample():
    """The corpus bundles a per-bundle test runs by default: the first of each structure
    (chain8, grid3_d2...) and of each semiring and dtype (prob_float32...), so that every
    structure and every kind runs; the others run with the slow tests (pytest.params,
    their ids the bundles' names)."""
    seen, chosen = set(), set()
    for p in CORPUS:
        structure, kind = p.name.split("__", 1)
        if structure not in seen or kind not in seen:
            chosen.add(p.name)
        seen.update((structure, kind))
    return [pytest.param(p, id=p.name, marks=() if p.name in chosen else pytest.mark.slow) for p in CORPUS]


@pytest.fixture(scope="session")
def corpus_dirs():
    if not CORPUS:
        pytest.fail(f"no corpus bundles under {shared_dir() / 'corpus'} (tests/data ships them)")
    return CORPUS


def run_temp_dir(tmp_path_factory, config) -> Path:
    """The run's temporary folder: pytest's base folder, or under pytest-xdist the one
    above the workers' own (each worker's config has a workerinput)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if hasattr(config, "workerinput") else base


def suite_cache_root(tmp_path_factory, config) -> Path:
    """Where the suite keeps its kernel cache and signing key: the run's temporary folder,
    or CATBP_JIT_TEST_CACHE_DIR, which several runs may share (CI's runs after the first
    find the kernels the first one compiled)."""
    shared = os.environ.get("CATBP_JIT_TEST_CACHE_DIR")
    return Path(shared) if shared else run_temp_dir(tmp_path_factory, config)


@pytest.fixture(autouse=True, scope="session")
def _own_cache_dir(tmp_path_factory, request):
    # Tests never touch the user's kernel cache, even one CATBP_JIT_CACHE_DIR names: signed
    # with the suite's key, its entries would fail their MACs in the user's next run.
    # Under pytest-xdist the workers share one cache (the run's base folder, above each
    # worker's own): a kernel one worker compiled is a hit for the others. The cache is
    # made for processes that share it (entry locks, files that appear whole).
    base = suite_cache_root(tmp_path_factory, request.config)
    cache, key = base / "kernel_cache", base / "cache_key"
    cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    key.mkdir(mode=0o700, exist_ok=True)
    os.environ["CATBP_JIT_CACHE_DIR"] = str(cache)
    # ... nor the user's cache key (~/.config/catbp_jit/cache.key, or CATBP_JIT_KEY_FILE).
    os.environ["CATBP_JIT_KEY_FILE"] = str(key / "cache.key")
