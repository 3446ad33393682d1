"""Source of the compiled-mode dispatcher: the whole schedule walked inside Numba.

The schedule is data (the int64 table: one (kernel id, parameter offset) row per step);
the dispatcher is specialized only on the set of kernels it may call, so programs that use
the same kernels share it.
"""

from __future__ import annotations

from typing import List, Sequence

ENTRY = "run_schedule"


def dispatcher_source(keys: Sequence[str], names: Sequence[str]) -> str:
    lines: List[str] = [
        f'"""catbp_jit dispatcher over {len(keys)} kernels: runs steps 0..n_steps-1 of a schedule."""',
        "from numba import njit",
        "",
        "from catbp_jit.codegen.loader import loaded",
        "",
    ]
    lines += [f'k{i} = loaded("{key}")  # {name}' for i, (key, name) in enumerate(zip(keys, names))]
    lines += ["", "",
              "@njit(cache=True, nogil=True)",
              "def run_schedule(mem, P, n_steps):",
              "    for s in range(n_steps):",
              "        kid = P[2 * s]",
              "        p = P[2 * s + 1]"]
    for i in range(len(keys)):
        lines += [f"        {'if' if i == 0 else 'elif'} kid == {i}:",
                  f"            k{i}(mem, P, p)"]
    if not keys:
        lines += ["        pass"]
    lines += [""]
    return "\n".join(lines)
