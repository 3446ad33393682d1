"""The gather kernel: elements of the device arena at given offsets, into one buffer.

A model's answers (Z, the scales, the marginals) lie in many slots of the arena; copying
each back costs a transfer (and its latency) apiece. `gather(mem, index, out)` puts
out[i] = mem[index[i]] on the device, so they come back in one copy
(cuda_session.CudaSession.gatherer). One kernel per dtype, through the kernel cache.
"""

from __future__ import annotations

ENTRY = "gather"

SOURCE = '''"""catbp_jit CUDA gather kernel ({dtype}): out[i] = mem[index[i]], grid-stride."""
from numba import cuda


@cuda.jit(cache=True)
def gather(mem, index, out):
    i = cuda.grid(1)
    while i < out.shape[0]:
        out[i] = mem[index[i]]
        i += cuda.gridsize(1)
'''


def gather_source(dtype: str) -> str:
    """The module (the dtype is in its docstring: one cache entry per dtype)."""
    return SOURCE.format(dtype=dtype)


def gather_signature(dtype: str) -> str:
    return f"(Array({dtype}, 1, 'C'), Array(int64, 1, 'C'), Array({dtype}, 1, 'C'))"
