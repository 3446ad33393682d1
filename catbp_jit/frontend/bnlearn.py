"""The standard bnlearn Bayesian networks (asia, alarm, ..., munin), as .bif.gz files.

pgmpy 0.1.x shipped them inside its wheel as `pgmpy/utils/example_models/NAME.bif.gz`.
pgmpy 1.x fetches them from the Hugging Face hub instead (which CI cannot reach), and
pgmpy 0.1.26 cannot be imported without torch; so `fetch` downloads the 0.1.26 wheel with
pip (CI can reach the package registry) and unzips just those files, without installing
or importing pgmpy.

    python -m catbp_jit.frontend.bnlearn     # fetch once, print the directory

The directory is $CATBP_JIT_BNLEARN_DIR, else ~/.cache/catbp_jit/bnlearn.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .. import environment
from .bif import read_bif
from .graph import FactorGraph

NETWORKS = (
    "asia",
    "cancer",
    "earthquake",
    "sachs",
    "survey",
    "alarm",
    "barley",
    "child",
    "insurance",
    "mildew",
    "water",
    "hailfinder",
    "hepar2",
    "win95pts",
    "andes",
    "diabetes",
    "link",
    "pathfinder",
    "pigs",
    "munin",
    "munin1",
    "munin2",
    "munin3",
    "munin4",
)

PGMPY_VERSION = "0.1.26"
_MODELS_IN_WHEEL = "pgmpy/utils/example_models/"
_SUFFIXES = (".bif.gz", ".bif")


def data_dir() -> Path:
    """$CATBP_JIT_BNLEARN_DIR if set, else ~/.cache/catbp_jit/bnlearn."""
    env = environment.bnlearn_dir()
    return Path(env) if env else Path.home() / ".cache" / "catbp_jit" / "bnlearn"


def _find(directory: Path, name: str) -> Path | None:
    for suffix in _SUFFIXES:
        path = directory / (name + suffix)
        if path.is_file():
            return path
    return None


def available() -> list[str]:
    """The networks present in data_dir(): NETWORKS order first, then any others sorted."""
    directory = data_dir()
    if not directory.is_dir():
        return []
    present = [n for n in NETWORKS if _find(directory, n)]
    others = set()
    for path in directory.iterdir():
        for suffix in _SUFFIXES:
            if path.name.endswith(suffix) and path.is_file():
                others.add(path.name[: -len(suffix)])
                break
    return present + sorted(others - set(NETWORKS))


def network_path(name: str) -> Path:
    """The file of network `name` in data_dir(); FileNotFoundError saying how to get it."""
    directory = data_dir()
    path = _find(directory, name)
    if path is not None:
        return path
    known = "" if name in NETWORKS else f" (the bnlearn networks are: {', '.join(NETWORKS)})"
    raise FileNotFoundError(
        f"bnlearn network {name!r} not found in {directory}{known}. Download the networks "
        f"with `python -m catbp_jit.frontend.bnlearn` or catbp_jit.frontend.bnlearn.fetch() "
        "(set CATBP_JIT_BNLEARN_DIR to use another directory)."
    )


def load_network(name: str) -> FactorGraph:
    """The bnlearn network `name` as a FactorGraph (one CPT factor per variable)."""
    return read_bif(network_path(name), name=name)


def parents_first(graph: FactorGraph) -> tuple[list[str], dict[str, tuple]]:
    """A Bayesian network's variables parents-first, and each one's parents.

    A network read from BIF has one factor per variable, its CPT, whose scope is
    (child, parents...): ancestral sampling and observations drawn from the network
    itself walk the variables in this order.
    """
    parents = {f.scope[0]: tuple(f.scope[1:]) for f in graph.factors}
    order: list[str] = []
    seen = set()
    for root in graph.variables:  # depth-first, without recursion: deep chains are fine
        if root in seen:
            continue
        seen.add(root)
        stack = [(root, iter(parents[root]))]
        while stack:
            v, rest = stack[-1]
            p = next(rest, None)
            if p is None:
                stack.pop()
                order.append(v)
            elif p not in seen:
                seen.add(p)
                stack.append((p, iter(parents[p])))
    return order, parents


def _complete(directory: Path) -> bool:
    return all((directory / f"{n}.bif.gz").is_file() for n in NETWORKS)


def fetch(
    dest: str | os.PathLike | None = None,
    *,
    pip: str = sys.executable,
    wheel: str | os.PathLike | None = None,
) -> Path:
    """Make sure every NETWORKS file is in `dest` (default data_dir()); return `dest`.

    Does nothing when they are all there. Otherwise downloads the pgmpy 0.1.26 wheel with
    `pip -m pip download` (`pip` is the Python interpreter to run; pass `wheel` to use a
    wheel already on disk) and extracts only the example models. Files are extracted into
    a temporary directory beside `dest` and then moved in, so an interrupted fetch never
    leaves a partial file behind. RuntimeError if pip fails or the wheel lacks the models.
    """
    dest = Path(dest) if dest is not None else data_dir()
    if _complete(dest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".bnlearn-fetch-", dir=dest.parent))
    try:
        wheel_path = Path(wheel) if wheel is not None else _download_wheel(pip, work)
        staged = work / "models"
        staged.mkdir()
        _extract_models(wheel_path, staged)
        try:
            staged.rename(dest)  # atomic when dest does not exist yet
        except OSError:
            # dest exists (empty, partial, or created meanwhile): move file by file, each
            # os.replace being atomic.
            dest.mkdir(parents=True, exist_ok=True)
            for path in staged.iterdir():
                os.replace(path, dest / path.name)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dest


def _download_wheel(pip: str, work: Path) -> Path:
    download = work / "download"
    # --only-binary: the wheel is what holds the models; never fall back to building an sdist.
    cmd = [
        pip,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--disable-pip-version-check",
        "--no-deps",
        "--only-binary",
        ":all:",
        f"pgmpy=={PGMPY_VERSION}",
        "-d",
        str(download),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        raise RuntimeError(f"could not run {' '.join(cmd)}: {exc}") from exc
    if proc.returncode != 0:
        output = (proc.stderr or proc.stdout or "").strip()[-2000:]
        raise RuntimeError(
            f"downloading pgmpy {PGMPY_VERSION} (for the bnlearn networks) "
            f"failed: {' '.join(cmd)} exited with status {proc.returncode}"
            + (f":\n{output}" if output else "")
        )
    wheels = sorted(download.glob("pgmpy-*.whl"))
    if not wheels:
        raise RuntimeError(f"pip download of pgmpy {PGMPY_VERSION} produced no wheel in {download}")
    return wheels[0]


def _extract_models(wheel: Path, out: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        members = [
            m
            for m in zf.namelist()
            if m.startswith(_MODELS_IN_WHEEL)
            and m.endswith(".bif.gz")
            and "/" not in m[len(_MODELS_IN_WHEEL) :]
        ]
        missing = set(NETWORKS) - {m[len(_MODELS_IN_WHEEL) : -len(".bif.gz")] for m in members}
        if missing:
            raise RuntimeError(f"{wheel} lacks the example models {sorted(missing)} under {_MODELS_IN_WHEEL}")
        for member in members:
            # Write by base name only: nothing in the archive can choose another path.
            (out / Path(member).name).write_bytes(zf.read(member))


if __name__ == "__main__":
    print(fetch())
