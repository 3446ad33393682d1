"""The kernel cache under attack: planted pickles, forged manifests, directories and key
files others can write, a lock held forever, and a read-only warm cache under strict."""

import hashlib
import hmac
import json
import logging
import os
import pickle
import re
import stat
import subprocess
import sys
import time

import pytest

from cache_helpers import SIG, entry_files, pattern, source
from catbp_jit import cache as cache_mod
from catbp_jit.cache import (
    CacheLockTimeout,
    CacheMissError,
    CacheTrustError,
    KernelCache,
    kernel_key,
)
from conftest import suite_cache_root

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


class Payload:
    """What an attacker plants: unpickling it runs a shell command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def warm(directory, c, signatures=SIG):
    kc = KernelCache(directory)
    assert kc.get(pattern(c), source(c), "kernel", signatures)(2, 3) == 5 + c
    return kc


def manifest_path(directory):
    (path,) = entry_files(directory)["json"]
    return path


def cache_records(caplog):
    return [r.catbp_jit for r in caplog.records if hasattr(r, "catbp_jit")]


# ---------------------------------------------------------------------------- 1. pickles


@pytest.mark.parametrize("target", ["nbi", "nbc"])
def test_planted_pickle_with_its_hash_in_the_manifest_never_runs(tmp_path, caplog, target):
    cache_dir, marker = tmp_path / "cache", tmp_path / "PWNED"
    warm(cache_dir, 40)
    # The attack: replace Numba's file with a pickle whose __reduce__ runs a command, and
    # put its sha256 in the manifest, as the manifest's own hashes would demand.
    (planted,) = entry_files(cache_dir)[target][:1]
    planted.write_bytes(pickle.dumps(Payload(marker)))
    m = json.loads(manifest_path(cache_dir).read_text())
    m["numba_files"][planted.name] = hashlib.sha256(planted.read_bytes()).hexdigest()
    manifest_path(cache_dir).write_text(json.dumps(m))

    with pytest.raises(CacheMissError, match="MAC"):
        KernelCache(cache_dir, "strict").get(pattern(40), source(40), "kernel", SIG)
    assert not marker.exists()

    caplog.set_level(logging.INFO, logger="catbp_jit.cache")
    kc = KernelCache(cache_dir)
    assert kc.get(pattern(40), source(40), "kernel", SIG)(2, 3) == 45
    assert not marker.exists()
    assert kc.stats["rebuilt"] == 1 and kc.stats["hits"] == 0
    (rec,) = [r for r in cache_records(caplog) if r["outcome"] == "rebuilt"]
    assert "MAC does not verify" in rec["reason"]
    again = KernelCache(cache_dir, "strict")  # the rebuilt entry is signed again
    assert again.get(pattern(40), source(40), "kernel", SIG)(2, 3) == 45
    assert again.stats["hits"] == 1 and not marker.exists()


@pytest.mark.parametrize("when", ["before_the_first_call", "right_after_the_check"])
def test_file_swapped_after_the_check_is_never_unpickled(tmp_path, when):
    # get() without signatures verifies and returns; Numba reads its files at the first
    # call. A pickle planted in between (manifest untouched) must not be unpickled, not
    # even when it lands between the load hook's hash check and Numba's read.
    cache_dir, marker = tmp_path / "cache", tmp_path / "PWNED"
    warm(cache_dir, 41, ["(int64, int64)"])  # what a plain call loads
    (nbc,) = entry_files(cache_dir)["nbc"]

    def plant():
        return nbc.write_bytes(pickle.dumps(Payload(marker)))

    swapped = []

    def swap_once(paths):  # the hashes have just been checked; Numba reads next
        if when == "right_after_the_check" and not swapped:
            assert str(nbc) in paths
            plant()
            swapped.append(nbc)

    kc = KernelCache(cache_dir, on_verified=swap_once)
    f = kc.get(pattern(41), source(41), "kernel")
    if when == "before_the_first_call":
        plant()
    assert f(2, 3) == 46
    assert swapped == ([nbc] if when == "right_after_the_check" else [])
    assert not marker.exists() and kc.stats["rebuilt"] == 1 and kc.stats["compiled"] == 1
    assert KernelCache(cache_dir).check(pattern(41), source(41))[0] == "ok"


@pytest.mark.parametrize("mac", ["missing", "forged", "other_field_changed"])
def test_manifest_without_a_valid_mac_is_rebuilt(tmp_path, caplog, mac):
    cache_dir = tmp_path / "cache"
    warm(cache_dir, 42)
    m = json.loads(manifest_path(cache_dir).read_text())
    if mac == "missing":
        del m["mac"]
    elif mac == "forged":  # signed, but not with this user's key
        body = json.dumps({k: v for k, v in m.items() if k != "mac"}, sort_keys=True, separators=(",", ":"))
        m["mac"] = hmac.new(os.urandom(32), body.encode(), hashlib.sha256).hexdigest()
    else:
        m["pid"] = m["pid"] + 1
    manifest_path(cache_dir).write_text(json.dumps(m))
    status, reason = KernelCache(cache_dir).check(pattern(42), source(42))
    assert status == "invalid" and "MAC" in reason, reason

    caplog.set_level(logging.INFO, logger="catbp_jit.cache")
    kc = KernelCache(cache_dir)
    assert kc.get(pattern(42), source(42), "kernel", SIG)(2, 3) == 47
    assert kc.stats["rebuilt"] == 1
    assert [r["outcome"] for r in cache_records(caplog)] == ["rebuilt"]
    assert KernelCache(cache_dir).check(pattern(42), source(42))[0] == "ok"


# ---------------------------------------------------------------------------- 1a. owners


@pytest.mark.parametrize("which", ["root", "kernels", "__pycache__"])
def test_group_writable_cache_directory_is_refused_or_bypassed(tmp_path, caplog, which):
    cache_dir = tmp_path / "cache"
    warm(cache_dir, 43)
    loose = {
        "root": cache_dir,
        "kernels": cache_dir / "kernels",
        "__pycache__": cache_dir / "kernels" / "__pycache__",
    }[which]
    loose.chmod(0o775)
    with pytest.raises(CacheTrustError, match=re.escape(f"{loose} is writable by group or")):
        KernelCache(cache_dir, "strict").get(pattern(43), source(43), "kernel", SIG)

    before = sorted(p.name for p in cache_dir.rglob("*"))
    caplog.set_level(logging.INFO, logger="catbp_jit.cache")
    caplog.clear()
    kc = KernelCache(cache_dir)
    f = kc.get(pattern(43), source(43), "kernel", SIG)
    assert f(2, 3) == 48 and kc.get(pattern(44), source(44), "kernel", SIG)(2, 3) == 49
    assert kc.stats["hits"] == 0 and kc.stats["misses"] == 2  # compiled in memory
    outcomes = [r["outcome"] for r in cache_records(caplog)]
    assert outcomes == ["bypassed", "compiled", "compiled"]  # one warning, not one per kernel
    (warning,) = [r for r in caplog.records if r.catbp_jit["outcome"] == "bypassed"]
    assert warning.levelno == logging.WARNING and str(loose) in warning.getMessage()
    assert sorted(p.name for p in cache_dir.rglob("*")) == before  # nothing written there


def test_cache_owned_by_another_user(tmp_path):
    if not IS_ROOT:
        pytest.skip("changing a file's owner needs root")
    cache_dir = tmp_path / "cache"
    warm(cache_dir, 45)
    for p in [cache_dir, *cache_dir.rglob("*")]:
        os.chown(p, 12345, 12345)
    with pytest.raises(CacheTrustError, match="owned by uid 12345, not by this user"):
        KernelCache(cache_dir, "strict").get(pattern(45), source(45), "kernel", SIG)
    # A deployment's shared cache, its owner trusted explicitly.
    trusted = KernelCache(cache_dir, "strict", trust_owner=True)
    assert trusted.get(pattern(45), source(45), "kernel", SIG)(2, 3) == 50
    assert trusted.stats["hits"] == 1 and trusted.stats["compiled"] == 0


@pytest.mark.parametrize("damage", ["group_writable", "other_owner", "symlink"])
def test_untrusted_entry_file_is_rebuilt(tmp_path, damage):
    cache_dir = tmp_path / "cache"
    warm(cache_dir, 46)
    (nbc,) = entry_files(cache_dir)["nbc"]
    if damage == "group_writable":
        nbc.chmod(0o664)
    elif damage == "other_owner":
        if not IS_ROOT:
            pytest.skip("changing a file's owner needs root")
        os.chown(nbc, 12345, 12345)
    else:
        real = tmp_path / "elsewhere.nbc"
        real.write_bytes(nbc.read_bytes())
        nbc.unlink()
        nbc.symlink_to(real)
    status, reason = KernelCache(cache_dir).check(pattern(46), source(46))
    assert status == "invalid" and str(nbc) in reason, reason
    with pytest.raises(CacheMissError, match=re.escape(str(nbc))):
        KernelCache(cache_dir, "strict").get(pattern(46), source(46), "kernel", SIG)
    kc = KernelCache(cache_dir)
    assert kc.get(pattern(46), source(46), "kernel", SIG)(2, 3) == 51
    assert kc.stats["rebuilt"] == 1
    assert KernelCache(cache_dir).check(pattern(46), source(46))[0] == "ok"


def test_cache_files_are_private_whatever_the_umask(tmp_path):
    old = os.umask(0o002)
    try:
        kc = warm(tmp_path / "cache", 47)
    finally:
        os.umask(old)
    files = entry_files(tmp_path / "cache")
    lock = tmp_path / "cache" / "locks" / f"k_{kernel_key(pattern(47))[:40]}.lock"
    for p in [*files["py"], *files["json"], *files["nbi"], *files["nbc"], lock]:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    for d in ["", "kernels", "kernels/__pycache__", "locks"]:
        assert stat.S_IMODE((tmp_path / "cache" / d).stat().st_mode) == 0o700, d
    assert kc.stats["compiled"] == 1


# ---------------------------------------------------------------------------- 1b. key file


def test_key_file_is_made_private_and_a_loose_one_is_refused(tmp_path, monkeypatch, caplog):
    key_file = tmp_path / "config" / "catbp_jit" / "cache.key"
    monkeypatch.setenv("CATBP_JIT_KEY_FILE", str(key_file))
    warm(tmp_path / "cache", 48)
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert len(key_file.read_bytes()) == 32
    assert stat.S_IMODE(key_file.parent.stat().st_mode) == 0o700

    key_file.chmod(0o644)
    with pytest.raises(CacheTrustError, match=re.escape(f"{key_file} is readable by group")):
        KernelCache(tmp_path / "cache", "strict").get(pattern(48), source(48), "kernel", SIG)
    caplog.set_level(logging.INFO, logger="catbp_jit.cache")
    caplog.clear()
    kc = KernelCache(tmp_path / "cache")
    assert kc.get(pattern(48), source(48), "kernel", SIG)(2, 3) == 53
    assert kc.stats["hits"] == 0 and cache_records(caplog)[0]["outcome"] == "bypassed"

    # A new key (the old one deleted): every entry signed with the old one is rebuilt.
    key_file.unlink()
    kc = KernelCache(tmp_path / "cache")
    assert kc.get(pattern(48), source(48), "kernel", SIG)(2, 3) == 53
    assert kc.stats["rebuilt"] == 1


def test_key_file_inside_the_cache_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("CATBP_JIT_KEY_FILE", str(tmp_path / "cache" / "cache.key"))
    with pytest.raises(CacheTrustError, match="inside the cache directory"):
        KernelCache(tmp_path / "cache", "strict").check(pattern(49), source(49))


# ---------------------------------------------------------------------------- 2. locks

HOLDER = r"""
import os, sys, time
from catbp_jit.cache import KernelCache
from catbp_jit.cache.locks import _FileLock
directory, stem = sys.argv[1], sys.argv[2]
KernelCache(directory)._prepare_dir()
_FileLock.for_path(os.path.join(directory, "locks", stem + ".lock")).acquire(10)
print("held", flush=True)
time.sleep(300)
"""


@pytest.fixture
def lock_holder(tmp_path):
    """A second process holding kernel 50's lock, as a writer stopped mid-compile would."""
    stem = "k_" + kernel_key(pattern(50))[:40]
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "cache"), stem], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_held_lock_is_reported_then_fallback_compiles_in_memory(tmp_path, caplog, lock_holder):
    caplog.set_level(logging.INFO, logger="catbp_jit.cache")
    kc = KernelCache(tmp_path / "cache", lock_timeout=3)
    started = time.monotonic()
    f = kc.get(pattern(50), source(50), "kernel", SIG)
    waited = time.monotonic() - started
    assert f(2, 3) == 55 and waited >= 3
    (notice,) = [r for r in caplog.records if "waiting for lock" in r.getMessage()]
    assert f"pid {lock_holder.pid} on " in notice.getMessage()
    assert notice.levelno == logging.WARNING
    (bypass,) = [r for r in cache_records(caplog) if r["outcome"] == "bypassed"]
    assert f"held by pid {lock_holder.pid}" in bypass["reason"]
    # The entry the holder might be writing is untouched.
    assert not any(entry_files(tmp_path / "cache").values())

    with pytest.raises(CacheLockTimeout, match=f"held by pid {lock_holder.pid} on .* after 1s"):
        KernelCache(tmp_path / "cache", "strict", lock_timeout=1).get(pattern(50), source(50), "kernel", SIG)

    lock_holder.kill()
    lock_holder.wait(timeout=30)
    kc = KernelCache(tmp_path / "cache", lock_timeout=30)
    assert kc.get(pattern(50), source(50), "kernel", SIG)(2, 3) == 55
    assert (
        kc.stats["compiled"] == 1
        and KernelCache(tmp_path / "cache").check(pattern(50), source(50))[0] == "ok"
    )


def test_check_of_a_held_lock_is_busy_under_fallback_and_get_waits_no_more(tmp_path, caplog, lock_holder):
    # check() is how compile() sorts cold kernels from warm: a held lock must not end the
    # compile under fallback, only send that kernel to memory (once, said once).
    caplog.set_level(logging.INFO, logger="catbp_jit.cache")
    kc = KernelCache(tmp_path / "cache", lock_timeout=1)
    status, reason = kc.check(pattern(50), source(50))
    assert status == "busy" and f"held by pid {lock_holder.pid}" in reason
    assert kc.check(pattern(51), source(51))[0] == "missing"  # other kernels as ever
    assert kc.get(pattern(50), source(50), "kernel", SIG)(2, 3) == 55
    (bypass,) = [r for r in caplog.records if getattr(r, "catbp_jit", {}).get("outcome") == "bypassed"]
    assert bypass.levelno == logging.WARNING and "compiled in memory" in bypass.getMessage()
    assert not [r for r in caplog.records if "waiting for lock" in r.getMessage()]
    assert not any(entry_files(tmp_path / "cache").values())  # the holder's entry untouched
    with pytest.raises(CacheLockTimeout, match=f"held by pid {lock_holder.pid}"):
        KernelCache(tmp_path / "cache", "strict", lock_timeout=1).check(pattern(50), source(50))


@pytest.fixture
def dispatcher_lock_holder():
    """Another process holding the dispatcher's lock in the session's cache, as a solve
    stopped mid-compile would (every CPU compile loads the dispatcher)."""
    from catbp_jit.codegen.loader import dispatcher_unit

    unit = dispatcher_unit()
    stem = "k_" + kernel_key(unit.identity)[:40]
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, os.environ["CATBP_JIT_CACHE_DIR"], stem],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_solve_answers_when_a_lock_stays_held_under_fallback(dispatcher_lock_holder):
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "CATBP_JIT_CACHE"}
    env.update(CATBP_JIT_LOCK_TIMEOUT="1", CATBP_JIT_COMPILE_WORKERS="0")
    r = subprocess.run(
        [sys.executable, "-m", "catbp_jit", "solve", str(repo / "examples" / "asia.bif"), "-q"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    assert "dysp    yes=0.435971  no=0.564029" in r.stdout
    lines = r.stderr.strip().splitlines()  # (the logger's last-resort handler: a line each)
    assert "Traceback" not in r.stderr and all("kernel cache bypassed" in line for line in lines), r.stderr
    # one line for the held dispatcher; (a kernel that another test's process compiles
    # into the session's cache at that moment is held for a while too, and said alike)
    (held,) = [line for line in lines if f"held by pid {dispatcher_lock_holder.pid}" in line]
    assert "compiled in memory" in held


def test_lock_timeout_and_trust_from_environment(monkeypatch):
    monkeypatch.delenv("CATBP_JIT_LOCK_TIMEOUT", raising=False)
    monkeypatch.delenv("CATBP_JIT_TRUSTED_CACHE", raising=False)
    assert KernelCache().lock_timeout == 120 and not KernelCache().trust_owner
    monkeypatch.setenv("CATBP_JIT_TRUSTED_CACHE", "1")
    assert KernelCache().trust_owner and not KernelCache(trust_owner=False).trust_owner
    monkeypatch.setenv("CATBP_JIT_LOCK_TIMEOUT", "7.5")
    assert KernelCache().lock_timeout == 7.5
    assert KernelCache(lock_timeout=2).lock_timeout == 2
    monkeypatch.setenv("CATBP_JIT_LOCK_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="CATBP_JIT_LOCK_TIMEOUT"):
        KernelCache()


# ---------------------------------------------------------------------------- 3. read-only


def test_read_only_warm_cache_under_strict(tmp_path, monkeypatch):
    cache_dir = tmp_path / "cache"
    warm(cache_dir, 51)
    tree = sorted((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in cache_dir.rglob("*"))
    subprocess.run(["chmod", "-R", "a-w", str(cache_dir)], check=True)
    opts = {}
    if IS_ROOT:
        # root writes through any mode bits: simulate the read-only mount instead.
        opts["write_check"] = lambda d: PermissionError(13, "Permission denied (simulated)", d)
    try:
        strict = KernelCache(cache_dir, "strict", **opts)
        assert strict.get(pattern(51), source(51), "kernel", SIG)(2, 3) == 56
        assert strict.stats["hits"] == 1 and strict.stats["compiled"] == 0
        with pytest.raises(CacheMissError, match="policy 'strict' forbids compiling"):
            strict.get(pattern(52), source(52), "kernel", SIG)  # cold: refused, as ever
        # fallback on a read-only directory: compiled in memory, said once
        fallback = KernelCache(cache_dir, **opts)
        assert fallback.get(pattern(51), source(51), "kernel", SIG)(2, 3) == 56
        assert fallback.stats["compiled"] == 1
        assert (
            sorted((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in cache_dir.rglob("*")) == tree
        )  # not even a lock file
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(cache_dir)], check=True)


def test_command_line_reports_an_untrusted_cache_in_one_line(tmp_path, monkeypatch, capsys):
    from pathlib import Path

    from catbp_jit.cli import main

    asia = str(Path(__file__).resolve().parents[1] / "examples" / "asia.bif")
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir(mode=0o777)
    cache_dir.chmod(0o777)
    monkeypatch.setenv("CATBP_JIT_CACHE_DIR", str(cache_dir))
    monkeypatch.setenv("CATBP_JIT_CACHE", "strict")
    with cache_mod.fresh_default_cache():  # the process-wide cache, from the env
        assert main(["solve", asia, "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith("catbp-jit: error: kernel cache directory refused: ")
    assert f"{cache_dir} is writable by group or others (mode 0777)" in err


# ---------------------------------------------------------------------------- 4. the suite


def test_the_suite_never_touches_the_users_cache(tmp_path):
    # The user's cache signed with the suite's key would fail its MACs on the user's next
    # run (every kernel rebuilt); so tests/conftest.py gives the suite a cache and a key of
    # its own, whatever the environment says.
    from pathlib import Path

    user_cache, user_key = tmp_path / "user_cache", tmp_path / "user.key"
    env = dict(os.environ, CATBP_JIT_CACHE_DIR=str(user_cache), CATBP_JIT_KEY_FILE=str(user_key))
    env.pop("CATBP_JIT_TEST_CACHE_DIR", None)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",
            "0",
            f"--basetemp={tmp_path / 'inner'}",
            f"{__file__}::test_the_suite_has_a_cache_of_its_own",
        ],
        cwd=Path(__file__).resolve().parents[1],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert not user_cache.exists() and not user_key.exists()


def test_the_suite_has_a_cache_of_its_own(tmp_path_factory, pytestconfig):
    from pathlib import Path

    base = suite_cache_root(tmp_path_factory, pytestconfig)
    kc = KernelCache()
    assert Path(kc.directory).is_relative_to(base), kc.directory
    assert Path(cache_mod.key_file_path()).is_relative_to(base)
    assert kc.get(pattern(53), source(53), "kernel", SIG)(2, 3) == 58
