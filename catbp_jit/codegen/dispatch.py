"""Source of the compiled-mode dispatcher: the whole schedule walked inside Numba.

The schedule is data (the int64 table: one (kernel id, parameter offset) row per step),
and so are the kernels: the dispatcher calls each through the C address of its compiled
entry (an int64 array indexed by kernel id). It is therefore not linked against any
kernel, and one dispatcher, compiled once per machine, serves every schedule. (Linking
would make its compile re-optimize and re-emit every kernel it calls: seconds per
kernel set.)
"""

from __future__ import annotations

from .. import abi

ENTRY = "run_schedule"

SOURCE = '''"""catbp_jit dispatcher: runs steps 0..n_steps-1 of a schedule, each kernel at its address."""
from numba import carray, njit

from catbp_jit.codegen.intrinsics import call_kernel, pointer_int64

{abi}

@njit(cache=True, nogil=True)
def run_schedule(mem_address, mem_length, P_address, P_length, kernels_address, n_kernels,
                 n_steps):
    P = carray(pointer_int64(P_address), P_length)
    K = carray(pointer_int64(kernels_address), n_kernels)
    for s in range(n_steps):
        row = STEP_ROW * s
        call_kernel(K[P[row + STEP_KERNEL]], mem_address, mem_length, P_address, P_length,
                    P[row + STEP_PARAMS])
'''


def dispatcher_source() -> str:
    return SOURCE.format(abi=abi.source_constants())
