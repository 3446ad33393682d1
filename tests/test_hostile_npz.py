"""A bundle's arrays.npz damaged in its zip headers is one error (found by
perf/hostile_fuzz.py: a flipped byte made the compression method unknown)."""

import shutil
import struct
from pathlib import Path

import pytest

from catbp_jit.bundle import BundleError, load_bundle

SEED = Path(__file__).resolve().parent / "data" / "corpus" / "coloring_cycle5__sat_bool"


def _central_entries(data: bytes):
    at = data.find(b"PK\x01\x02")
    while at >= 0:
        yield at
        at = data.find(b"PK\x01\x02", at + 4)


@pytest.mark.parametrize(
    "field, offset, value, fmt",
    [
        ("compression method 99", 10, 99, "<H"),  # zipfile: NotImplementedError
        ("compression method LZMA", 10, 14, "<H"),  # the deflated bytes are no LZMA stream
        ("encrypted", 8, 1, "<H"),  # zipfile: RuntimeError, a password is required
    ],
)
def test_a_damaged_npz_header_is_one_error(tmp_path, field, offset, value, fmt):
    shutil.copytree(SEED, tmp_path / "b")
    path = tmp_path / "b" / "arrays.npz"
    data = bytearray(path.read_bytes())
    for at in _central_entries(bytes(data)):
        struct.pack_into(fmt, data, at + offset, value)
    path.write_bytes(bytes(data))
    with pytest.raises(BundleError, match="arrays.npz cannot be read"):
        load_bundle(tmp_path / "b")
