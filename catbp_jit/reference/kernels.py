"""The reference VM's three tensor kernels (CatBP's VM specification; docs/ir.md), numpy only."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..ir.schema import AxisKey, TensorSpec
from ..semiring import VMSemiringRuntime
from .align import align_array_to


def vm_unit(out_spec: TensorSpec, sr: VMSemiringRuntime) -> np.ndarray:
    """A tensor of the semiring's 1 with the shape of out_spec."""
    return sr.one(out_spec.shape).astype(sr.dtype, copy=False)


def vm_contract(
    inputs: Sequence[tuple[np.ndarray, TensorSpec]], out_spec: TensorSpec, sr: VMSemiringRuntime
) -> np.ndarray:
    """The ⊗-product of the inputs aligned to out_spec, multiplied left to right."""
    if not inputs:
        return vm_unit(out_spec, sr)
    acc = None
    for arr, spec in inputs:
        view = align_array_to(arr, spec, out_spec).astype(sr.dtype, copy=False)
        aligned = np.broadcast_to(view, out_spec.shape)
        acc = aligned.copy() if acc is None else sr.mul(acc, aligned)
    assert acc is not None  # (inputs is not empty)
    return acc


def vm_eliminate_keep(
    arr: np.ndarray, in_spec: TensorSpec, keep_keys: Sequence[AxisKey], sr: VMSemiringRuntime
) -> tuple[np.ndarray, TensorSpec]:
    """⊕-reduce every axis not in keep_keys; the result's axes follow keep_keys order.

    Keys in keep_keys that the input lacks are ignored. Kept axes are moved first (in
    keep_keys order), dropped axes last, and the trailing axes are reduced in one call.
    """
    if not keep_keys:
        if arr.ndim == 0:
            return arr, TensorSpec(())
        out = sr.add_reduce(arr.astype(sr.dtype, copy=False), axis=tuple(range(arr.ndim)))
        return np.asarray(out), TensorSpec(())

    pos = in_spec.axis_pos()
    present = [k for k in keep_keys if k in pos]
    if not present:
        out = sr.add_reduce(arr.astype(sr.dtype, copy=False), axis=tuple(range(arr.ndim)))
        return np.asarray(out), TensorSpec(())

    keep_axes = [pos[k] for k in present]
    drop_axes = [i for i in range(arr.ndim) if i not in set(keep_axes)]
    perm = keep_axes + drop_axes
    x = np.transpose(arr, axes=perm) if perm != list(range(arr.ndim)) else arr
    if drop_axes:
        # (kept axes remain: an array, never numpy's scalar; asarray returns it as is)
        x = np.asarray(
            sr.add_reduce(x.astype(sr.dtype, copy=False), axis=tuple(range(len(keep_axes), x.ndim)))
        )
    else:
        x = x.astype(sr.dtype, copy=False)
    return x, TensorSpec(tuple(in_spec.axes[pos[k]] for k in present))


def keep_keys_from_drop(in_spec: TensorSpec, drop_ids: Sequence[int]) -> tuple[AxisKey, ...]:
    """The legacy `drop` argument (axis ids, of either kind) as keep_keys."""
    drop = set(drop_ids)
    return tuple(ax.key for ax in in_spec.axes if ax.id not in drop)
