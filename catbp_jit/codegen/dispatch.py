"""Source of the compiled-mode dispatcher: the whole schedule walked inside Numba.

The schedule is data (the int64 table: one (kernel id, parameter offset, chunks) row per
step), and so are the kernels: the dispatcher calls each through the C address of its
compiled entry (an int64 array indexed by kernel id). It is therefore not linked against
any kernel, and one dispatcher, compiled once per machine, serves every schedule. (Linking
would make its compile re-optimize and re-emit every kernel it calls: seconds per
kernel set.)

A step of several chunks is a job for the thread pool (catbp_jit/pool.py): the dispatcher
posts it in the pool's control block (abi.py), takes chunks itself, and waits only for the
chunks other threads took to be done. Chunks are taken with an atomic counter, so a pool
thread that is asleep or descheduled costs the step nothing: the dispatcher then does
every chunk itself. The chunks are fixed by the plan, each computed alone whoever runs it,
so the results are the same bits on any number of threads. The pool's threads run this
same function (thread >= 0): one compiled module, one cache entry.
"""

from __future__ import annotations

from .. import abi

ENTRY = "run_schedule"

SOURCE = '''"""catbp_jit dispatcher: runs steps first..last-1 of a schedule, each kernel at its
address, the chunks of a step that has several shared with the pool's threads."""
import numpy as np
from numba import carray, njit

from catbp_jit.codegen.atomics import (
    atomic_add, atomic_cas, atomic_load, atomic_store, call_sleep, spin_pause
)
from catbp_jit.codegen.intrinsics import call_kernel, pointer_int64

{abi}
{pool}
CHUNK_MASK = (1 << JOB_SHIFT) - 1
JOB_MASK = (1 << 31) - 1  # job numbers wrap here (POOL_CLAIM holds them above JOB_SHIFT)
ZERO = np.int64(0)  # (arguments typed int64, never literals: see the kernels' ZERO)
ONE = np.int64(1)


@njit(cache=True, nogil=True)
def run_schedule(mem_address, mem_length, P_address, P_length, kernels_address, n_kernels,
                 first, last, pool_address, helpers, thread):
    """Steps first..last-1, with up to `helpers` pool threads taking chunks (0: this
    thread runs them all). Called by pool thread i with thread = i (and -1 otherwise):
    that thread's loop (serve), which reads nothing but the pool's control block."""
    C = carray(pointer_int64(pool_address), POOL_SIZE)
    if thread >= 0:
        serve(C, thread)
        return
    P = carray(pointer_int64(P_address), P_length)
    K = carray(pointer_int64(kernels_address), n_kernels)
    # the pool is this run's unless a run in another thread holds it: that one's helpers
    # then stay with it, and this run does its chunks alone
    held = helpers > 0 and atomic_cas(C, POOL_OWNER, ZERO, ONE)
    if held:
        C[POOL_HELPERS] = helpers  # (published by the first job's release of POOL_SEQ)
    for s in range(first, last):
        row = STEP_ROW * s
        kernel, p, chunks = K[P[row + STEP_KERNEL]], P[row + STEP_PARAMS], P[row + STEP_CHUNKS]
        if chunks > 1 and held:
            run_job(C, kernel, mem_address, mem_length, P_address, P_length, p, chunks)
        else:
            for c in range(chunks):
                call_kernel(kernel, mem_address, mem_length, P_address, P_length, p, c, chunks)
        if chunks > 1:  # then what follows all its chunks (NORMALIZE), on this thread
            call_kernel(kernel, mem_address, mem_length, P_address, P_length, p, chunks, chunks)
    if held:
        atomic_store(C, POOL_OWNER, ZERO)


@njit(nogil=True, inline="always")
def run_job(C, kernel, mem_address, mem_length, P_address, P_length, p, chunks):
    """One step's chunks, shared with the pool: post the job, take chunks until none is
    left, then wait for those the pool's threads took."""
    job = (C[POOL_SEQ] + 1) & JOB_MASK  # (only the pool's owner writes POOL_SEQ)
    C[JOB_KERNEL] = kernel
    C[JOB_MEM] = mem_address
    C[JOB_MEM_LENGTH] = mem_length
    C[JOB_P] = P_address
    C[JOB_P_LENGTH] = P_length
    C[JOB_PARAMS] = p
    C[JOB_CHUNKS] = chunks
    atomic_store(C, POOL_DONE, ZERO)
    atomic_store(C, POOL_CLAIM, job << JOB_SHIFT)
    atomic_store(C, POOL_SEQ, job)  # last: a thread that sees it sees all of the above
    while True:
        c = atomic_add(C, POOL_CLAIM, ONE) & CHUNK_MASK
        if c >= chunks:
            break
        call_kernel(kernel, mem_address, mem_length, P_address, P_length, p, c, chunks)
        atomic_add(C, POOL_DONE, ONE)
    while atomic_load(C, POOL_DONE) < chunks:
        spin_pause()


@njit(nogil=True, inline="always")
def take_chunks(C, job):
    """Pool thread: run chunks of job `job` until none is left. A chunk is taken by
    compare-and-swap on POOL_CLAIM, which holds the job's number: a thread that comes late
    (the job done, another posted) takes nothing, and the job's fields, read once a chunk
    is taken, stay put until that chunk is counted done."""
    while True:
        claim = atomic_load(C, POOL_CLAIM)
        if claim >> JOB_SHIFT != job:
            return
        c = claim & CHUNK_MASK
        chunks = C[JOB_CHUNKS]
        if c >= chunks:
            return
        if atomic_cas(C, POOL_CLAIM, claim, claim + 1):
            call_kernel(C[JOB_KERNEL], C[JOB_MEM], C[JOB_MEM_LENGTH], C[JOB_P], C[JOB_P_LENGTH],
                        C[JOB_PARAMS], c, chunks)
            atomic_add(C, POOL_DONE, ONE)


@njit(nogil=True, inline="always")
def serve(C, thread):
    """Pool thread `thread`: take chunks of every job posted; spin POOL_SPIN times for the
    next one, then, while a run holds the pool, nap POOL_NAP microseconds between looks;
    return when no run holds it (the thread then waits in Python, pool.py) or at POOL_STOP."""
    seen = np.int64(-1)  # so a job posted before this thread came is looked at too
    spins = ZERO
    while atomic_load(C, POOL_STOP) == 0:
        seq = atomic_load(C, POOL_SEQ)
        if seq != seen:
            seen = seq
            if thread < C[POOL_HELPERS]:
                take_chunks(C, seq)
            spins = ZERO
        elif spins < C[POOL_SPIN]:
            spin_pause()
            spins += 1
        elif atomic_load(C, POOL_OWNER) != 0 and C[POOL_SLEEP] != 0:
            call_sleep(C[POOL_SLEEP], C[POOL_NAP])
        else:
            return
'''


def dispatcher_source() -> str:
    return SOURCE.format(abi=abi.source_constants(), pool=abi.pool_constants())
