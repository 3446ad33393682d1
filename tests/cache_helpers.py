"""Shared by the kernel cache tests: a test pattern, its kernel's source and signature, and
the files a cache entry leaves on disk."""

from pathlib import Path

SIG = ["int64(int64, int64)"]


def pattern(c, **extra):
    return {"template": "test_add", "const": c, "dtype": "int64", "parallel": False, **extra}


def source(c):
    # The constant makes each pattern's source distinct (and a wrong module visible).
    return f"import numba\n\n\n@numba.njit(cache=True)\ndef kernel(a, b):\n    return a + b + {c}\n"


def entry_files(directory):
    kernels = Path(directory) / "kernels"
    return {
        "py": sorted(kernels.glob("k_*.py")),
        "json": sorted(kernels.glob("k_*.json")),
        "nbi": sorted((kernels / "__pycache__").glob("k_*.nbi")),
        "nbc": sorted((kernels / "__pycache__").glob("k_*.nbc")),
    }
