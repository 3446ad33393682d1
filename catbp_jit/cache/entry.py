"""The files of one kernel on disk (the layout is in the package docstring): its module
source, its manifest, signed with the user's key, and Numba's cache files; how they are
verified, written and removed.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import hmac
import json
import os
import re
import time

from ..atomic import atomic_write
from .key import _canonical_json
from .locks import _EntryLock
from .trust import _Access, _file_problem

MANIFEST_FORMAT = 1
_SHORT = 40  # key characters in file names (160 bits)
_HEADER_RE = re.compile(r"^# catbp_jit kernel sha256=([0-9a-f]{64}) key=([0-9a-f]{64})$")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _manifest_mac(secret: bytes, manifest: dict) -> str:
    body = {k: v for k, v in manifest.items() if k != "mac"}
    return hmac.new(secret, _canonical_json(body).encode("ascii"), hashlib.sha256).hexdigest()


class _Entry:
    """The files of one kernel on disk, and how to verify, write and remove them."""

    def __init__(self, directory: str, key: str, access: _Access):
        self.key = key
        self.access = access
        self.stem = "k_" + key[:_SHORT]
        self.kernels_dir = os.path.join(directory, "kernels")
        self.pycache = os.path.join(self.kernels_dir, "__pycache__")  # Numba's InTree dir
        self.source_path = os.path.join(self.kernels_dir, self.stem + ".py")
        self.manifest_path = os.path.join(self.kernels_dir, self.stem + ".json")
        self.lock = _EntryLock(os.path.join(directory, "locks", self.stem + ".lock"), access)

    # -- Numba's files for this module: "<stem>.<qualname>-<line>.pyXY.nbi" / ".N.nbc"
    def numba_files(self) -> dict[str, str]:
        found = {}
        for path in glob.glob(os.path.join(glob.escape(self.pycache), self.stem + ".*")):
            name = os.path.basename(path)
            if name.endswith((".nbi", ".nbc")):  # not Numba's "<file>.tmp.<uuid>" leftovers
                found[name] = path
        return found

    def hash_numba_files(self) -> dict[str, str]:
        out = {}
        for name, path in sorted(self.numba_files().items()):
            with contextlib.suppress(FileNotFoundError):
                with open(path, "rb") as f:
                    out[name] = _sha256(f.read())
        return out

    def read_manifest(self) -> tuple[dict | None, str]:
        """(manifest, "verified") if it is ours and signed with our key, else (None, why).
        The manifest's hashes are what every other file is checked against, so nothing
        it says is believed before its MAC verifies."""
        problem = _file_problem(self.manifest_path, self.access.check_owner)
        if problem:
            return None, problem
        try:
            with open(self.manifest_path, "rb") as f:
                m = json.loads(f.read().decode("utf-8"))
        except FileNotFoundError:
            return None, "manifest is missing"
        except (OSError, ValueError):
            return None, "manifest is unreadable"
        if not isinstance(m, dict):
            return None, "manifest is unreadable"
        if self.access.check_owner:
            mac = m.get("mac")
            if not isinstance(mac, str):
                return None, "manifest carries no MAC (not written by this user's catbp_jit)"
            if not hmac.compare_digest(mac, _manifest_mac(self.access.secret, m)):
                return None, ("manifest MAC does not verify (altered, forged, or signed with another key)")
        return m, "verified"

    def write_manifest(self, manifest: dict) -> None:
        manifest = dict(manifest, mac=_manifest_mac(self.access.secret, manifest))
        data = json.dumps(manifest, sort_keys=True, indent=1).encode("utf-8")
        atomic_write(self.manifest_path, data)

    def record(self, **fields) -> dict:
        """Rewrite the manifest with the current hashes of Numba's files (lock held)."""
        m = self.read_manifest()[0] or {}  # a manifest we did not sign contributes nothing
        m.update(fields)
        m["numba_files"] = self.hash_numba_files()
        m["updated"] = time.time()
        self.write_manifest(m)
        return m

    def verify_numba_files(self, manifest: dict | None = None) -> str | None:
        """None if Numba's files are exactly those in the (verified) manifest, else why."""
        m, why = self.read_manifest() if manifest is None else (manifest, "")
        recorded = (m or {}).get("numba_files")
        if not isinstance(recorded, dict):
            return why or "manifest records no Numba files"
        for path in self.numba_files().values():
            problem = _file_problem(path, self.access.check_owner)
            if problem:
                return problem
        actual = self.hash_numba_files()
        for name in sorted(set(recorded) | set(actual)):
            if name not in actual:
                return f"Numba cache file {name} is missing"
            if name not in recorded:
                return f"Numba cache file {name} is not in the manifest"
            if actual[name] != recorded[name]:
                return f"Numba cache file {name} fails its sha256 (truncated or altered)"
        return None

    def check(self, source: str) -> tuple[str, str, bytes | None]:
        """("ok" | "missing" | "invalid", reason, verified file bytes to execute)."""
        problem = _file_problem(self.source_path, self.access.check_owner)
        if problem:
            return "invalid", problem, None
        try:
            with open(self.source_path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            if not os.path.lexists(self.manifest_path) and not self.numba_files():
                return "missing", "no cache entry", None
            return "invalid", "module source file is missing", None
        head, nl, body = data.partition(b"\n")
        match = _HEADER_RE.match(head.decode("ascii", "replace"))
        if not nl or match is None:
            return "invalid", "module header is missing or damaged", None
        if match.group(1) != _sha256(body):
            return "invalid", "module source fails its sha256 (truncated or altered)", None
        if match.group(2) != self.key:
            return "invalid", "module belongs to another key", None
        if body != source.encode("utf-8"):
            return "invalid", "stored source differs from the generated source (stale)", None
        m, why = self.read_manifest()
        if m is None:
            return "invalid", why, None
        if m.get("key") != self.key or m.get("source_sha256") != _sha256(body):
            return "invalid", "manifest does not match the module", None
        reason = self.verify_numba_files(m)
        if reason:
            return "invalid", reason, None
        return "ok", "verified", data

    def write_source(self, source: str) -> bytes:
        body = source.encode("utf-8")
        header = f"# catbp_jit kernel sha256={_sha256(body)} key={self.key}\n".encode("ascii")
        data = header + body
        atomic_write(self.source_path, data)
        return data

    def purge(self) -> None:
        """Delete the module, manifest and Numba's files (and temp leftovers)."""
        # Manifest first: a crash part-way leaves an entry that fails verification.
        _unlink(self.manifest_path)
        _unlink(self.source_path)
        self.purge_numba_files()

    def purge_numba_files(self) -> None:
        for path in glob.glob(os.path.join(glob.escape(self.pycache), self.stem + ".*")):
            if not path.endswith(".pyc"):
                _unlink(path)
