"""Source of the compiled-mode dispatcher: the whole schedule walked inside Numba.

The schedule is data (the int64 table: one (kernel id, parameter offset, chunks, finish)
row per step), and so are the kernels: the dispatcher calls each through the C address of its
compiled entry (an int64 array indexed by kernel id). It is therefore not linked against
any kernel, and one dispatcher, compiled once per machine, serves every schedule. (Linking
would make its compile re-optimize and re-emit every kernel it calls: seconds per
kernel set.)

A step of several chunks is a job for the thread pool (catbp_jit/pool.py): the dispatcher
posts it in the pool's control block (abi.py), takes chunks itself, and waits only for the
chunks other threads took to be done. Chunks are taken with an atomic counter, so a pool
thread that is asleep or descheduled costs the step nothing: the dispatcher then does
every chunk itself. The chunks are fixed by the plan, each computed alone whoever runs it,
so the results are the same bits on any number of threads. What follows a step's chunks
(its NORMALIZE) runs on the dispatcher's thread once they are done, or, where the step's
row says SPLIT_FINISH, as two more jobs of as many chunks (abi.py), one after the other.
The pool's threads run this same function (thread >= 0): one compiled module, one cache
entry.

A schedule in tracks (plan/tracks.py) is walked as one job of a chunk per thread: the
thread that takes chunk k < tracks makes track k its own and runs its tasks in order, each
once the tasks of other tracks it waits for are done; a thread of a later chunk (more
threads than tracks) owns none and takes chunks of joint steps, the steps cut in chunks
that a track posts for every idle thread to share. A track's next task is claimed by
compare-and-swap on the track's state word, so a thread whose track is blocked (or done)
also runs the next task of a track no thread owns, or whose owner has not been seen to
move for STEAL_PAUSES: a run whose helpers never come walks every track alone. The
earliest task not yet done waits for nothing that is not done, so some thread can always
run it.
"""

from __future__ import annotations

from .. import abi

ENTRY = "run_schedule"

SOURCE = '''"""catbp_jit dispatcher: runs steps first..last-1 of a schedule (or its tracks), each
kernel at its address, the chunks of a step that has several shared with the pool's threads."""
import numpy as np
from numba import carray, njit

from catbp_jit.codegen.atomics import (
    atomic_add, atomic_cas, atomic_load, atomic_store, call_sleep, spin_pause
)
from catbp_jit.codegen.intrinsics import BUFFER, call_kernel, pointer_int64, stack_buffer_int64

{abi}
{pool}
{tracks}
CHUNK_MASK = (1 << JOB_SHIFT) - 1
JOB_MASK = (1 << 31) - 1  # job numbers wrap here (POOL_CLAIM holds them above JOB_SHIFT)
ZERO = np.int64(0)  # (arguments typed int64, never literals: see the kernels' ZERO)
ONE = np.int64(1)
STEAL_PAUSES = {steal}  # a thread runs an owned track's task after waiting this long


@njit(cache=True, nogil=True)
def run_schedule(mem_address, mem_length, P_address, P_length, kernels_address, n_kernels,
                 first, last, pool_address, helpers, thread, tracks):
    """Steps first..last-1, with up to `helpers` pool threads taking chunks (0: this
    thread runs them all); or, if tracks >= 0, the tracks of the section at P[tracks].
    Called by pool thread i with thread = i (and -1 otherwise): that thread's loop
    (serve), which reads nothing but the pool's control block."""
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
    if tracks >= 0:
        run_tracks(C, P, K, mem_address, mem_length, P_address, P_length, kernels_address, n_kernels,
                   tracks, held)
        first = last  # (no step besides)
    for s in range(first, last):
        row = STEP_ROW * s
        kernel, p, chunks = K[P[row + STEP_KERNEL]], P[row + STEP_PARAMS], P[row + STEP_CHUNKS]
        if chunks == 1:
            call_kernel(kernel, mem_address, mem_length, P_address, P_length, p, ZERO, ONE)
            continue
        # its chunks, then what follows them all: a NORMALIZE, on this thread or in two
        # passes of as many chunks (one call site: each copy of run_chunks costs compile time)
        split = P[row + STEP_FINISH] == SPLIT_FINISH
        for phase in range(3 if split else 1):
            run_chunks(C, held, kernel, mem_address, mem_length, P_address, P_length, p,
                       phase * chunks + min(phase, ONE), chunks)
        if not split:
            call_kernel(kernel, mem_address, mem_length, P_address, P_length, p, chunks, chunks)
    if held:
        atomic_store(C, POOL_OWNER, ZERO)


@njit(nogil=True, inline="always")
def close_claim(A, claim, job):
    """Set the claim word A[claim] to job `job` with no chunk left to take, by
    compare-and-swap (a full barrier), before a new job's fields are written: a thread that
    read the last job's claim and that job's fields then fails its compare-and-swap, and
    never takes a chunk of the last job's number with the new job's fields (the chunk
    counted done twice, a run went on before one of its chunks was)."""
    while True:
        old = atomic_load(A, claim)
        if atomic_cas(A, claim, old, (job << JOB_SHIFT) | CHUNK_MASK):
            return


@njit(nogil=True, inline="always")
def post_job(C, kernel, n_kernels, mem_address, mem_length, P_address, P_length, p, first, chunks,
             tracks):
    """Post a job in the pool's control block: a step's chunks, the kernel's chunks first..
    first+chunks-1 (tracks = -1: kernel is the step's kernel address), or a run's tracks
    (tracks: the offset of its tracks section, kernel the address of the kernels' address
    array, n_kernels long)."""
    job = (C[POOL_SEQ] + 1) & JOB_MASK  # (only the pool's owner writes POOL_SEQ)
    close_claim(C, POOL_CLAIM, job)
    C[JOB_KERNEL] = kernel
    C[JOB_N_KERNELS] = n_kernels
    C[JOB_MEM] = mem_address
    C[JOB_MEM_LENGTH] = mem_length
    C[JOB_P] = P_address
    C[JOB_P_LENGTH] = P_length
    C[JOB_PARAMS] = p
    C[JOB_FIRST] = first
    C[JOB_CHUNKS] = chunks
    C[JOB_TRACKS] = tracks
    atomic_store(C, POOL_DONE, ZERO)
    atomic_store(C, POOL_CLAIM, job << JOB_SHIFT)
    atomic_store(C, POOL_SEQ, job)  # last: a thread that sees it sees all of the above


@njit(nogil=True, inline="always")
def take_and_wait(A, claim, done, kernel, mem_address, mem_length, P_address, P_length, p, first,
                  chunks):
    """A job's poster: take its chunks (fetch-add on the claim word A[claim]; chunk c is the
    kernel's first + c) until none is left, then wait until A[done] counts them all, those
    other threads took included."""
    while True:
        c = atomic_add(A, claim, ONE) & CHUNK_MASK
        if c >= chunks:
            break
        call_kernel(kernel, mem_address, mem_length, P_address, P_length, p, first + c, chunks)
        atomic_add(A, done, ONE)
    while atomic_load(A, done) < chunks:
        spin_pause()


@njit(nogil=True, inline="always")
def run_chunks(C, held, kernel, mem_address, mem_length, P_address, P_length, p, first, chunks):
    """The kernel's chunks first..first+chunks-1 of a step of `chunks`: shared with the
    pool (held: post the job, take chunks until none is left, then wait for those the
    pool's threads took), else all on this thread."""
    if held:
        post_job(C, kernel, ZERO, mem_address, mem_length, P_address, P_length, p, first, chunks, -ONE)
        take_and_wait(C, POOL_CLAIM, POOL_DONE, kernel, mem_address, mem_length, P_address, P_length,
                      p, first, chunks)
    else:
        for c in range(chunks):
            call_kernel(kernel, mem_address, mem_length, P_address, P_length, p, first + c, chunks)


@njit(nogil=True, inline="always")
def run_task(K, mem_address, mem_length, P_address, P_length, P, first, last, joint):
    """Steps first..last-1 (a task of the track whose joint step lines are at `joint`) on
    this thread; a step of several chunks is posted there, its chunks shared with the
    threads that have no task ready."""
    for s in range(first, last):
        row = STEP_ROW * s
        kernel, p, chunks = K[P[row + STEP_KERNEL]], P[row + STEP_PARAMS], P[row + STEP_CHUNKS]
        if chunks > 1:
            # its chunks, then what follows them all (as run_schedule)
            split = P[row + STEP_FINISH] == SPLIT_FINISH
            for phase in range(3 if split else 1):
                share_joint(P, joint, s, kernel, mem_address, mem_length, P_address, P_length, p,
                            phase * chunks + min(phase, ONE), chunks)
            if not split:
                call_kernel(kernel, mem_address, mem_length, P_address, P_length, p, chunks, chunks)
        else:
            call_kernel(kernel, mem_address, mem_length, P_address, P_length, p, ZERO, ONE)


@njit(nogil=True, inline="always")
def share_joint(P, joint, s, kernel, mem_address, mem_length, P_address, P_length, p, first, chunks):
    """Post the kernel's chunks first..first+chunks-1 of step s as the track's joint step
    (its lines at `joint`), take them with the threads that have no task ready, and wait
    for them all."""
    job = (P[joint + JOINT_SEQ] + 1) & JOB_MASK  # (only the track's runner writes it)
    close_claim(P, joint + JOINT_CLAIM, job)
    P[joint + JOINT_STEP] = s
    P[joint + JOINT_FIRST] = first
    atomic_store(P, joint + JOINT_DONE, ZERO)
    atomic_store(P, joint + JOINT_CLAIM, job << JOB_SHIFT)
    atomic_store(P, joint + JOINT_SEQ, job)  # last: a thread that sees it sees the above
    take_and_wait(P, joint + JOINT_CLAIM, joint + JOINT_DONE, kernel, mem_address, mem_length,
                  P_address, P_length, p, first, chunks)


@njit(nogil=True, inline="always")
def help_joint(K, mem_address, mem_length, P_address, P_length, P, joint):
    """Run chunks of the joint step at `joint` until none is left (take_chunks' protocol:
    a chunk is taken by compare-and-swap on JOINT_CLAIM, which holds the job's number);
    how many this thread ran."""
    job = atomic_load(P, joint + JOINT_SEQ)
    ran = ZERO
    while job != 0:  # (0: none posted in this run, numbers start at 1)
        claim = atomic_load(P, joint + JOINT_CLAIM)
        if claim >> JOB_SHIFT != job:
            return ran
        c = claim & CHUNK_MASK
        row = STEP_ROW * P[joint + JOINT_STEP]
        chunks = P[row + STEP_CHUNKS]
        if c >= chunks:
            return ran
        if atomic_cas(P, joint + JOINT_CLAIM, claim, claim + 1):
            call_kernel(K[P[row + STEP_KERNEL]], mem_address, mem_length, P_address, P_length,
                        P[row + STEP_PARAMS], P[joint + JOINT_FIRST] + c, chunks)
            atomic_add(P, joint + JOINT_DONE, ONE)
            ran += 1
    return ran


@njit(nogil=True, inline="always")
def run_tracks(C, P, K, mem_address, mem_length, P_address, P_length, kernels_address, n_kernels, at,
               held):
    """A run's tracks: every track's state cleared, then one job of a chunk per thread (with
    the pool held; else this thread walks every track): chunk k < tracks makes track k
    its taker's own, a thread of a later chunk owns none (it takes joint steps' chunks,
    and tasks no owner runs); then wait for the chunks taken."""
    n = P[at + TRACKS_COUNT]
    state = P[at + TRACKS_STATE]
    for k in range(n):
        atomic_store(P, state + TRACK_STRIDE * k + TRACK_WORD, ZERO)
        atomic_store(P, state + TRACK_STRIDE * k + TRACK_OWNED, ZERO)
    for k in range(n):
        joint = state + TRACK_STRIDE * (n + JOINT_LINES * k)
        for field in (JOINT_SEQ, JOINT_CLAIM, JOINT_DONE):
            atomic_store(P, joint + field, ZERO)
    chunks = max(n, C[POOL_HELPERS] + 1) if held else n
    if held:  # (a tracks job: the kernels' array, not one kernel)
        post_job(C, kernels_address, n_kernels, mem_address, mem_length, P_address, P_length, at, ZERO,
                 chunks, at)
    taken = ZERO  # (without the pool: this thread takes every chunk)
    while True:
        if held:
            c = atomic_add(C, POOL_CLAIM, ONE) & CHUNK_MASK
        else:
            c = taken
            taken += 1
        if c >= chunks:
            break
        walk_tracks(K, mem_address, mem_length, P_address, P_length, P, at, c)
        if held:
            atomic_add(C, POOL_DONE, ONE)
    while held and atomic_load(C, POOL_DONE) < chunks:
        spin_pause()


@njit(nogil=True, inline="always")
def waits_met(P, state, known, task, n):
    """Whether the task at `task` may start: every track has done the tasks it waits for
    (known: the progress this thread last read of each, walk_tracks)."""
    for other in range(n):
        need = P[task + TASK_WAITS + other]
        if other < BUFFER and known[other] >= need:
            continue
        done_there = atomic_load(P, state + TRACK_STRIDE * other + TRACK_WORD) >> 1
        if other < BUFFER:
            known[other] = done_there
        if done_there < need:
            return False
    return True


@njit(nogil=True)
def walk_tracks(K, mem_address, mem_length, P_address, P_length, P, at, own):
    """Run tasks until every track is done: track `own`'s next tasks while they are ready
    (own >= the tracks: none), else the next ready tasks of a track no thread owns, or of
    any track once no track has moved for STEAL_PAUSES pauses (its owner descheduled);
    with none ready, chunks of a joint step."""
    n = P[at + TRACKS_COUNT]
    state = P[at + TRACKS_STATE]
    joints = state + TRACK_STRIDE * n  # (track k's joint step: TRACK_STRIDE * JOINT_LINES * k on)
    row = TASK_WAITS + n
    owner = own < n
    first = own % n  # the track this thread looks at first (its own, if it owns one)
    if owner:
        atomic_store(P, state + TRACK_STRIDE * own + TRACK_OWNED, ONE)
    idle = ZERO  # pauses since a track last moved
    seen = -ONE  # the tracks' words summed when last looked at
    # known[k]: track k's tasks done when this thread last read its word. A track's word
    # is written by the thread running it, on another core: read it again only when a
    # task waits for more than was known (most waits were met long before), so that a
    # task's start does not wait for a cache line from the other core
    known = carray(stack_buffer_int64(), BUFFER)
    for k in range(min(n, BUFFER)):
        known[k] = ZERO
    while True:
        left = ZERO
        ran = False
        moved = ZERO
        for k in range(n):
            track = first + k if first + k < n else first + k - n  # (no division per task)
            word = state + TRACK_STRIDE * track + TRACK_WORD
            w = atomic_load(P, word)
            moved += w
            done = w >> 1
            if done >= P[at + TRACKS_HEADER + TRACK_FIELDS * track + TRACK_COUNT]:
                continue
            left += 1
            if w & 1:
                continue  # a thread runs its next task
            mine = owner and k == 0
            if not mine and idle < STEAL_PAUSES and atomic_load(P, word - TRACK_WORD + TRACK_OWNED) != 0:
                continue  # (its owner will)
            task = P[at + TRACKS_HEADER + TRACK_FIELDS * track + TRACK_TASKS] + row * done
            if waits_met(P, state, known, task, n) and atomic_cas(P, word, w, w + 1):
                # this thread holds the track (the bit in its word) while its next tasks
                # are ready, publishing each one done with a release store: no other
                # thread takes them, and a task costs no compare-and-swap (a locked
                # instruction, which also waits for the last task's stores to leave the
                # core)
                count = P[at + TRACKS_HEADER + TRACK_FIELDS * track + TRACK_COUNT]
                joint = joints + TRACK_STRIDE * JOINT_LINES * track
                while True:
                    run_task(K, mem_address, mem_length, P_address, P_length, P,
                             P[task + TASK_FIRST], P[task + TASK_LAST], joint)
                    done += 1
                    task += row
                    if done >= count or not waits_met(P, state, known, task, n):
                        break
                    atomic_store(P, word, (done << 1) | 1)
                atomic_store(P, word, done << 1)
                ran = True
                break
        if left == 0:
            return
        for k in range(n if not ran else 0):  # nothing ready: the tracks' joint steps
            if help_joint(K, mem_address, mem_length, P_address, P_length, P,
                          joints + TRACK_STRIDE * JOINT_LINES * k) > 0:
                ran = True
        if ran or moved != seen:
            seen = moved
            idle = ZERO
        else:
            spin_pause()
            idle += 1


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
            if C[JOB_TRACKS] >= 0:
                walk_tracks(carray(pointer_int64(C[JOB_KERNEL]), C[JOB_N_KERNELS]), C[JOB_MEM],
                            C[JOB_MEM_LENGTH], C[JOB_P], C[JOB_P_LENGTH],
                            carray(pointer_int64(C[JOB_P]), C[JOB_P_LENGTH]), C[JOB_TRACKS], c)
            else:
                call_kernel(C[JOB_KERNEL], C[JOB_MEM], C[JOB_MEM_LENGTH], C[JOB_P], C[JOB_P_LENGTH],
                            C[JOB_PARAMS], C[JOB_FIRST] + c, chunks)
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


# A thread whose own track waits takes the next task of a track whose owner has not moved
# for this many pauses (~20-70 us): an owner descheduled on a busy machine
STEAL_PAUSES = 2000


def dispatcher_source() -> str:
    return SOURCE.format(
        abi=abi.source_constants(),
        pool=abi.pool_constants(),
        tracks=abi.tracks_constants(),
        steal=STEAL_PAUSES,
    )
