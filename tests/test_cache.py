"""The on-disk kernel cache: keys, hits across processes, policies, integrity, locking."""

import json
import logging
import multiprocessing
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cache_helpers import SIG, entry_files, pattern, source
from catbp_jit import cache as cache_mod
from catbp_jit.cache import CacheDirError, CacheMissError, KernelCache, environment_identity, kernel_key

# A fresh interpreter: what a second run of the program sees.
REPO = Path(__file__).resolve().parents[1]
CHILD = r"""
import json, sys
from catbp_jit.cache import CacheMissError, KernelCache, kernel_key
a = json.loads(sys.argv[1])
kc = KernelCache(a["dir"], a["policy"])
out = {"key": kernel_key(a["pattern"])}
try:
    f = kc.get(a["pattern"], a["source"], "kernel", a["signatures"])
    out.update(ok=True, value=f(2, 3), stats=kc.stats,
               numba_hits=sum(f.stats.cache_hits.values()),
               numba_misses=sum(f.stats.cache_misses.values()))
except CacheMissError as e:
    out.update(ok=False, error=str(e), stats=kc.stats)
print(json.dumps(out))
"""


def run_child(directory, c, policy="fallback", signatures=SIG):
    env = {k: v for k, v in os.environ.items() if k != "CATBP_JIT_CACHE"}
    arg = json.dumps(
        {
            "dir": str(directory),
            "policy": policy,
            "pattern": pattern(c),
            "source": source(c),
            "signatures": signatures,
        }
    )
    p = subprocess.run(
        [sys.executable, "-c", CHILD, arg], capture_output=True, text=True, timeout=120, env=env
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------- processes


def test_miss_then_hit_in_new_process_and_strict_warm(tmp_path):
    first = run_child(tmp_path, 11)
    assert first["ok"] and first["value"] == 16
    assert first["stats"]["misses"] == 1 and first["stats"]["compiled"] == 1
    assert first["numba_misses"] == 1

    second = run_child(tmp_path, 11)
    assert second["ok"] and second["value"] == 16
    assert second["stats"]["hits"] == 1
    assert second["stats"]["misses"] == 0 and second["stats"]["compiled"] == 0
    assert second["numba_misses"] == 0 and second["numba_hits"] == 1

    strict = run_child(tmp_path, 11, policy="strict")
    assert strict["ok"] and strict["value"] == 16 and strict["stats"]["hits"] == 1
    assert strict["numba_misses"] == 0

    # The key is the same in every process (and here).
    assert first["key"] == second["key"] == strict["key"] == kernel_key(pattern(11))
    files = entry_files(tmp_path)
    assert [len(files[k]) for k in ("py", "json", "nbi", "nbc")] == [1, 1, 1, 1]


def test_strict_cold_dir_raises_in_new_process(tmp_path):
    out = run_child(tmp_path, 12, policy="strict")
    assert not out["ok"]
    assert "'test_add'" in out["error"] and out["key"] in out["error"]
    assert out["stats"]["compiled"] == 0
    files = entry_files(tmp_path)
    assert not any(files.values())  # nothing written, nothing compiled


def _worker(directory, c, barrier, queue):
    outcomes = []

    class Collect(logging.Handler):
        def emit(self, record):
            if hasattr(record, "catbp_jit"):  # not the "waiting for lock" notices
                outcomes.append(record.catbp_jit["outcome"])

    logger = logging.getLogger("catbp_jit.cache")
    logger.addHandler(Collect())
    logger.setLevel(logging.INFO)
    kc = KernelCache(directory, "fallback")
    try:
        barrier.wait(timeout=60)  # all three ask at the same moment
        f = kc.get(pattern(c), source(c), "kernel", SIG)
        queue.put({"ok": True, "value": f(2, 3), "stats": kc.stats, "outcomes": outcomes})
    except Exception as e:  # reported to the parent, which fails the test
        queue.put({"ok": False, "error": repr(e)})


def test_concurrent_processes_compile_once(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    barrier, queue = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(str(tmp_path), 13, barrier, queue)) for _ in range(3)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert all(r["ok"] for r in results), results
    assert [r["value"] for r in results] == [18, 18, 18]
    assert sum(r["stats"]["compiled"] for r in results) == 1
    assert sum(r["stats"]["misses"] for r in results) == 1
    assert sum(r["stats"]["hits"] for r in results) == 2
    assert sorted(o for r in results for o in r["outcomes"]) == ["compiled"]
    # The cache is intact: it verifies, and strict loads it without compiling.
    assert KernelCache(tmp_path).check(pattern(13), source(13))[0] == "ok"
    strict = KernelCache(tmp_path, "strict")
    f = strict.get(pattern(13), source(13), "kernel", SIG)
    assert f(2, 3) == 18 and strict.stats["hits"] == 1 and strict.stats["compiled"] == 0


# ---------------------------------------------------------------------------- integrity


def _truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _flip_constant(path):
    # One byte: "+ 14" -> "+ 15". Executed, it would return the wrong answer.
    data = bytearray(path.read_bytes())
    i = data.rindex(b"14")
    data[i + 1] = ord("5")
    path.write_bytes(bytes(data))


CORRUPTIONS = {
    "truncate_source": lambda f: _truncate(f["py"][0]),
    "alter_source_byte": lambda f: _flip_constant(f["py"][0]),
    "truncate_nbc": lambda f: _truncate(f["nbc"][0]),
    "truncate_nbi": lambda f: _truncate(f["nbi"][0], keep=0.3),
    "alter_nbc_byte": lambda f: f["nbc"][0].write_bytes(
        f["nbc"][0].read_bytes()[:-1] + bytes([f["nbc"][0].read_bytes()[-1] ^ 1])
    ),
    "delete_manifest": lambda f: f["json"][0].unlink(),
}


@pytest.mark.parametrize("damage", sorted(CORRUPTIONS))
def test_damaged_entry_is_rebuilt_never_executed(tmp_path, caplog, damage):
    caplog.set_level(logging.INFO, logger="catbp_jit.cache")
    KernelCache(tmp_path).get(pattern(14), source(14), "kernel", SIG)
    CORRUPTIONS[damage](entry_files(tmp_path))
    assert KernelCache(tmp_path).check(pattern(14), source(14))[0] == "invalid"

    # strict refuses a damaged entry, and leaves it alone
    with pytest.raises(CacheMissError):
        KernelCache(tmp_path, "strict").get(pattern(14), source(14), "kernel", SIG)

    caplog.clear()
    kc = KernelCache(tmp_path)
    f = kc.get(pattern(14), source(14), "kernel", SIG)
    assert f(2, 3) == 19
    assert kc.stats["rebuilt"] == 1 and kc.stats["compiled"] == 1 and kc.stats["hits"] == 0
    (rec,) = [r for r in caplog.records if r.name == "catbp_jit.cache"]
    assert rec.levelno == logging.WARNING and rec.catbp_jit["outcome"] == "rebuilt"
    # Rebuilt and whole again: the next instance hits.
    assert KernelCache(tmp_path).check(pattern(14), source(14))[0] == "ok"
    again = KernelCache(tmp_path)
    assert again.get(pattern(14), source(14), "kernel", SIG)(2, 3) == 19
    assert again.stats["hits"] == 1 and again.stats["compiled"] == 0


def test_stale_source_is_rebuilt(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="catbp_jit.cache")
    KernelCache(tmp_path).get(pattern(15), source(15), "kernel", SIG)
    caplog.clear()
    kc = KernelCache(tmp_path)
    f = kc.get(pattern(15), source(16), "kernel", SIG)  # same key, new text
    assert f(2, 3) == 21
    assert kc.stats["rebuilt"] == 1
    (rec,) = [r for r in caplog.records if r.name == "catbp_jit.cache"]
    assert "stale" in rec.catbp_jit["reason"]
    assert KernelCache(tmp_path).check(pattern(15), source(16))[0] == "ok"


def test_damage_after_get_is_caught_at_load(tmp_path):
    # get() without signatures verifies and returns; Numba loads lazily at the first
    # call, and the load hook checks the files again.
    KernelCache(tmp_path).get(pattern(17), source(17), "kernel", SIG)
    kc = KernelCache(tmp_path)
    f = kc.get(pattern(17), source(17), "kernel")
    assert kc.stats["hits"] == 1
    _truncate(entry_files(tmp_path)["nbc"][0])
    assert f(2, 3) == 22
    assert kc.stats["rebuilt"] == 1 and kc.stats["compiled"] == 1
    assert KernelCache(tmp_path).check(pattern(17), source(17))[0] == "ok"


def test_new_signature_strict_refuses_fallback_compiles(tmp_path, caplog):
    KernelCache(tmp_path).get(pattern(18), source(18), "kernel", SIG)
    with pytest.raises(CacheMissError, match="float64"):
        KernelCache(tmp_path, "strict").get(pattern(18), source(18), "kernel", ["float64(float64, float64)"])
    caplog.set_level(logging.INFO, logger="catbp_jit.cache")
    caplog.clear()
    kc = KernelCache(tmp_path)
    f = kc.get(pattern(18), source(18), "kernel", ["float64(float64, float64)"])
    assert f(2.0, 3.0) == 23.0
    assert kc.stats["misses"] == 1 and kc.stats["compiled"] == 1
    assert [r.catbp_jit["outcome"] for r in caplog.records] == ["compiled"]
    # both signatures now load from the cache, under strict
    strict = KernelCache(tmp_path, "strict")
    g = strict.get(pattern(18), source(18), "kernel", SIG + ["float64(float64, float64)"])
    assert g(2, 3) == 23 and strict.stats["hits"] == 1 and strict.stats["compiled"] == 0


def test_argument_only_signature_shares_cache_with_calls(tmp_path):
    KernelCache(tmp_path).get(pattern(26), source(26), "kernel", ["(int64, int64)"])
    strict = KernelCache(tmp_path, "strict")
    f = strict.get(pattern(26), source(26), "kernel")
    assert f(2, 3) == 31  # a call with (int64, int64) loads what the eager compile cached
    assert strict.stats["compiled"] == 0 and sum(f.stats.cache_hits.values()) == 1
    with pytest.raises(CacheMissError):
        f(2.0, 3.0)  # a new type under strict: refused, not compiled


# ---------------------------------------------------------------------------- policies


def test_off_never_writes_files(tmp_path):
    d = tmp_path / "never"
    kc = KernelCache(d, "off")
    f = kc.get(pattern(19), source(19), "kernel", SIG)
    assert f(2, 3) == 24
    assert kc.get(pattern(19), source(19), "kernel") is f
    assert kc.stats["compiled"] == 1 and kc.stats["misses"] == 1
    assert not d.exists()


def test_memo_returns_same_dispatcher_without_disk(tmp_path):
    kc = KernelCache(tmp_path / "c")
    f = kc.get(pattern(20), source(20), "kernel", SIG)
    shutil.rmtree(tmp_path / "c")  # disk gone entirely
    assert kc.get(pattern(20), source(20), "kernel", SIG) is f
    assert kc.stats["memo_hits"] == 1 and kc.stats["misses"] == 1
    assert not (tmp_path / "c").exists()
    assert kc.in_memory(pattern(20), source(20)) and not kc.in_memory(pattern(20), source(21))
    assert not KernelCache(tmp_path / "c").in_memory(pattern(20), source(20))  # another cache's memo


def test_a_second_compile_in_one_process_reads_no_entry(monkeypatch):
    """compile() asks the disk only about kernels this process has not loaded: verifying an
    entry hashes Numba's files, milliseconds a kernel, on every compile of a warm process."""
    from catbp_jit.bundle import load_bundle
    from catbp_jit.cache import entry as entry_mod
    from jit_helpers import compile_bundle

    b = load_bundle(str(REPO / "examples" / "grid3_d2__prob_float64"))
    first = compile_bundle(b, "compiled")
    assert first.wait()  # (a cold cache: the kernels come from worker processes)

    def no_disk(*args):
        raise AssertionError("a kernel this process has loaded was looked up on disk")

    monkeypatch.setattr(entry_mod._Entry, "check", no_disk)
    second = compile_bundle(b, "compiled")
    assert second.tier == "compiled" and [k.entry for k in second.kernels] == [k.entry for k in first.kernels]


def test_clear(tmp_path):
    kc = KernelCache(tmp_path)
    kc.get(pattern(21), source(21), "kernel", SIG)
    kc.clear()
    assert not any(entry_files(tmp_path).values())
    assert kc.check(pattern(21), source(21))[0] == "missing"
    assert kc.get(pattern(21), source(21), "kernel", SIG)(2, 3) == 26
    assert kc.stats["misses"] == 2


def test_telemetry_record_on_miss(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="catbp_jit.cache")
    KernelCache(tmp_path).get(pattern(22), source(22), "kernel", SIG)
    (rec,) = [r for r in caplog.records if r.name == "catbp_jit.cache"]
    assert rec.levelno == logging.INFO
    data = rec.catbp_jit
    assert data["kernel"] == pattern(22)
    assert data["key"] == kernel_key(pattern(22))
    assert data["target"] == "cpu" and data["policy"] == "fallback"
    assert data["outcome"] == "compiled"
    assert data["environment"] == environment_identity()
    assert data["compile_seconds"] > 0
    assert "compiled" in rec.getMessage() and "test_add" in rec.getMessage()

    caplog.clear()
    KernelCache(tmp_path).get(pattern(22), source(22), "kernel", SIG)  # a hit: silent
    assert not [r for r in caplog.records if r.name == "catbp_jit.cache"]

    with pytest.raises(CacheMissError):
        KernelCache(tmp_path, "strict").get(pattern(23), source(23), "kernel", SIG)
    (rec,) = [r for r in caplog.records if r.name == "catbp_jit.cache"]
    assert rec.catbp_jit["outcome"] == "refused" and rec.catbp_jit["policy"] == "strict"


# ---------------------------------------------------------------------------- keys, config


def test_kernel_key():
    k = kernel_key(pattern(1))
    assert len(k) == 64 and k == kernel_key(pattern(1)) == kernel_key(
        dict(reversed(list(pattern(1).items())))
    )  # key order does not matter
    assert kernel_key(pattern(2)) != k
    assert kernel_key(pattern(1, parallel=True)) != k
    assert kernel_key(pattern(1), target="cuda") != k
    assert KernelCache().key_for(pattern(1)) == k
    assert kernel_key(pattern(1), codegen_version="test-bump") != k
    assert environment_identity(codegen_version="test-bump")["codegen_version"] == "test-bump"
    assert environment_identity()["codegen_version"] == cache_mod.CODEGEN_VERSION
    with pytest.raises(TypeError):
        kernel_key({"bad": object()})


def test_environment_identity_fields():
    env = environment_identity()
    fields = ("numba", "llvmlite", "numpy", "python", "cpu_name", "cpu_features", "codegen_version")
    for field in fields + ("codegen_helpers",):
        assert env[field], field


def test_every_module_a_kernel_imports_is_in_the_key():
    """The modules generated sources import (compiled into the kernels, not in their
    source's digest) are key.HELPERS, whose digest is in every key: a change to an
    intrinsic alone recompiles. Read from the sources of every CPU template, the
    dispatcher and a CUDA kernel."""
    import re
    from pathlib import Path

    from catbp_jit.cache.key import HELPERS, helpers_digest
    from catbp_jit.codegen import cuda, dispatch
    from catbp_jit.codegen.loader import cpu_source
    from catbp_jit.plan.schedule import repack_pattern
    from catbp_jit.plan.steps import KernelPattern

    sources = [dispatch.dispatcher_source(), cpu_source(repack_pattern("PROB", "float64"))]
    for template in ("contract_reduce", "contract_lines"):
        for sr, dtype in (("PROB", "float64"), ("LOGPROB", "float64"), ("SAT", "bool")):
            for reduce in (False, True):
                pattern = KernelPattern(sr, dtype, reduce, False, False, template=template)
                sources.append(cpu_source(pattern))
    sources.append(cuda.kernel_source(KernelPattern("PROB", "float64", True, False, False)))
    imported = set()
    for text in sources:
        imported |= set(re.findall(r"from catbp_jit\.(\w+\.\w+) import", text))  # from catbp_jit.a.b import
        imported |= {f"codegen.{m}" for m in re.findall(r"from catbp_jit\.codegen import (\w+)", text)}
    package = Path(cache_mod.__file__).resolve().parents[1]
    listed = {name.removesuffix(".py").replace("/", ".") for name in HELPERS}
    assert imported and imported <= listed, imported - listed
    # the ABI constants that intrinsics.py re-exports (BUFFER, LANES, MAX_LEAVES)
    assert "abi" in listed and "codegen.intrinsics" in imported
    assert all((package / name).is_file() for name in HELPERS)
    assert environment_identity()["codegen_helpers"] == helpers_digest() and len(helpers_digest()) == 64


def test_directory_and_policy_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("CATBP_JIT_CACHE_DIR", str(tmp_path / "env"))
    monkeypatch.setenv("CATBP_JIT_CACHE", "strict")
    kc = KernelCache()
    assert kc.directory == str(tmp_path / "env") and kc.policy == "strict"
    with pytest.raises(CacheMissError):
        kc.get(pattern(24), source(24), "kernel")
    assert (tmp_path / "env" / "locks").is_dir()

    monkeypatch.delenv("CATBP_JIT_CACHE_DIR")
    monkeypatch.delenv("CATBP_JIT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    kc = KernelCache()
    if sys.platform.startswith("linux"):
        assert kc.directory == str(tmp_path / "xdg" / "catbp_jit")
    assert kc.policy == "fallback"
    with pytest.raises(ValueError):
        KernelCache(tmp_path, "sometimes")


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("where", ["the directory", "its parent"])
def test_a_file_where_the_directory_should_be(tmp_path, caplog, where):
    caplog.set_level(logging.INFO, logger="catbp_jit.cache")
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    directory = blocker if where == "the directory" else blocker / "cache"
    # fallback: compiled in memory, said once (naming the directory and why), nothing lost
    kc = KernelCache(directory)
    assert kc.get(pattern(25), source(25), "kernel", SIG)(2, 3) == 30
    assert kc.get(pattern(26), source(26), "kernel", SIG)(2, 3) == 31
    (warning,) = warnings_of(caplog)
    assert f"kernel cache directory {str(directory)!r} is not writable (" in warning
    assert "is not a directory" in warning and "compiled in memory" in warning
    assert "Errno 17" not in warning  # not makedirs' "File exists" for a file
    assert blocker.read_text() == "not a directory" and kc.stats["compiled"] == 2
    # strict: an error naming the directory
    with pytest.raises(
        CacheDirError, match=f"kernel cache directory '{directory}' is not writable .*is not a directory"
    ):
        KernelCache(directory, "strict").get(pattern(25), source(25), "kernel", SIG)


# A fresh interpreter whose files cannot grow past `limit` bytes (RLIMIT_FSIZE): a write
# past it fails with EFBIG, as one on a full disk fails with ENOSPC. A real OSError from
# the kernel, with no hook in the cache for a test to pull.
LIMITED = r"""
import json, resource, signal, sys
a = json.loads(sys.argv[1])
from catbp_jit.cache import KernelCache
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of the signal
resource.setrlimit(resource.RLIMIT_FSIZE, (a["limit"], a["limit"]))
kc = KernelCache(a["dir"], a["policy"])
print(json.dumps([kc.get(p, s, "kernel", a["signatures"])(2, 3) for p, s in a["kernels"]]))
"""


def run_limited(directory, constants, policy="fallback", limit=100):
    env = {k: v for k, v in os.environ.items() if k != "CATBP_JIT_CACHE"}
    arg = json.dumps(
        {
            "dir": str(directory),
            "policy": policy,
            "limit": limit,
            "kernels": [[pattern(c), source(c)] for c in constants],
            "signatures": SIG,
        }
    )
    return subprocess.run(
        [sys.executable, "-c", LIMITED, arg], capture_output=True, text=True, timeout=300, env=env
    )


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_FSIZE is POSIX")
@pytest.mark.parametrize("limit", [100, 4096], ids=["the source fails", "Numba's save fails"])
def test_a_disk_that_cannot_take_the_entry(tmp_path, limit):
    # (a kernel's source is ~240 bytes, its manifest ~2 KB, Numba's data file ~9 KB)
    directory = tmp_path / "cache"
    KernelCache(directory)._prepare_dir()  # the directories and the key file exist
    # fallback: answers, compiled in memory, said once (the directory and the reason)
    p = run_limited(directory, [27, 28], limit=limit)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == [32, 33]
    lines = p.stderr.strip().splitlines()  # (the logger's last-resort handler)
    assert len(lines) == 1, p.stderr
    assert f"kernel cache directory {str(directory)!r} is not writable (" in lines[0]
    assert "File too large" in lines[0] and "compiled in memory" in lines[0]
    # nothing half-written is left: the next process compiles and caches as ever
    kc = KernelCache(directory)
    assert [kc.check(pattern(c), source(c))[0] for c in (27, 28)] == ["missing", "missing"]
    assert kc.get(pattern(27), source(27), "kernel", SIG)(2, 3) == 32
    assert kc.check(pattern(27), source(27))[0] == "ok"
    # strict on a warm cache writes nothing it needs: a full disk still answers
    p = run_limited(directory, [27], policy="strict", limit=0)
    assert p.returncode == 0 and json.loads(p.stdout) == [32], p.stderr


def test_strict_names_the_directory_when_the_disk_fails(tmp_path):
    directory = tmp_path / "cache"
    KernelCache(directory).get(pattern(29), source(29), "kernel", SIG)
    strict = KernelCache(directory, "strict")
    strict._prepare_dir()  # settled: a writable, warm cache
    shutil.rmtree(directory / "locks")
    (directory / "locks").write_text("")  # now every lock file fails to open (ENOTDIR)
    with pytest.raises(
        CacheDirError, match=f"kernel cache directory '{directory}' is not writable .*Not a directory"
    ):
        strict.get(pattern(29), source(29), "kernel", SIG)
