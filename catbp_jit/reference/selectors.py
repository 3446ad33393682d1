"""Mode selectors: σ_e(j, c) = 1 iff interface state j maps to mode c (VM spec §6)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from ..ir.schema import Axis, AxisType, TensorSpec


@dataclass(frozen=True)
class SelectorPayload:
    mode_axis_id: int
    interface_axis_ids: tuple[int, ...]
    quotient_map: np.ndarray  # flat interface state -> mode id (-1: infeasible)
    num_modes: int
    diag_mask: np.ndarray | None = None  # fixed-point feasibility per flat state


def vm_load_selector(
    payload: SelectorPayload,
    domains: dict[int, int],
    mode_sizes: dict[int, int],
    dtype: DTypeLike = np.float32,
    one_val: Any = None,
    zero_val: Any = None,
) -> tuple[np.ndarray, TensorSpec]:
    """The dense selector tensor: interface axes (GEOMETRIC) then the mode axis (TOPOLOGICAL)."""
    ids = tuple(payload.interface_axis_ids)
    geo_shape = tuple(domains[v] for v in ids)
    flat = int(np.prod(geo_shape, dtype=np.int64))
    q = int(payload.num_modes)
    one_val = 1 if one_val is None else one_val
    zero_val = 0 if zero_val is None else zero_val

    data: np.ndarray = np.full((flat, q), zero_val, dtype=dtype)
    labels = np.asarray(payload.quotient_map).astype(np.int64, copy=False)
    rows = np.arange(flat, dtype=np.int64)
    if payload.diag_mask is not None:
        ok = np.asarray(payload.diag_mask).astype(bool, copy=False)
        rows, labels = rows[ok], labels[ok]
    valid = labels >= 0
    data[rows[valid], labels[valid]] = one_val
    data = data.reshape(geo_shape + (q,))

    axes = [Axis(v, AxisType.GEOMETRIC, domains[v]) for v in ids]
    axes.append(Axis(payload.mode_axis_id, AxisType.TOPOLOGICAL, mode_sizes[payload.mode_axis_id]))
    return data, TensorSpec(tuple(axes))
