"""Alignment of a tensor to an output spec, by axis key (CatBP's VM specification; docs/ir.md)."""

from __future__ import annotations

import numpy as np

from ..errors import AlignmentError
from ..ir.schema import TensorSpec, format_key


def align_array_to(arr: np.ndarray, in_spec: TensorSpec, out_spec: TensorSpec) -> np.ndarray:
    """Transpose and reshape `arr` so that its axes stand in `out_spec` order.

    Axes are matched by key (kind, id), never by id alone. Output axes the input lacks
    become size-1 dimensions (numpy broadcasts them later); input axes the output lacks
    must have size 1. Raises AlignmentError (a ValueError) otherwise.
    """
    in_pos = in_spec.axis_pos()
    out_keys = set(out_spec.keys)
    for i, ax in enumerate(in_spec.axes):
        if ax.key not in out_keys and arr.shape[i] != 1:
            raise AlignmentError(
                f"input axis {format_key(ax.key)} (size {arr.shape[i]}) is not in the output "
                f"spec {out_spec} and is not a singleton"
            )

    taken = [in_pos[k] for k in out_spec.keys if k in in_pos]
    if taken:
        rest = [i for i in range(arr.ndim) if i not in taken]
        arr_t = np.transpose(arr, axes=taken + rest)
        arr_t = arr_t.reshape(arr_t.shape[: len(taken)])  # drops the trailing size-1 axes
    else:
        arr_t = np.array(arr).reshape(())

    shape: list[int] = []
    cursor = 0
    for ax in out_spec.axes:
        if ax.key in in_pos:
            if arr_t.shape[cursor] != ax.size:
                raise AlignmentError(
                    f"size mismatch for axis {format_key(ax.key)}: input has "
                    f"{arr_t.shape[cursor]}, output spec {out_spec} says {ax.size}"
                )
            shape.append(ax.size)
            cursor += 1
        else:
            shape.append(1)
    return arr_t.reshape(tuple(shape))
