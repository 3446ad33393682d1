"""What a schedule is made of: a step (a segment, its kernel pattern, its parameters) and
the pattern a kernel is specialized on. Shared by the loop lowering (schedule.py) and the
GEMM lowering (gemm.py), which the schedule tries first."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .. import abi
from ..ir.schema import TensorSpec
from ..semiring import SEMIRINGS
from .fusion import Segment
from .loops import ACROSS_OUTPUTS, ACROSS_REDUCED


@dataclass(frozen=True)
class KernelPattern:
    """What a kernel is specialized on: not sizes, and not its number of leaves, which
    the kernel reads from its row of the table like the sizes (abi.LEAVES)."""

    semiring: str
    dtype: str
    reduce: bool
    normalize: bool
    # the kernel shares its work among the threads itself (prange): GEMM kernels only. A
    # loop step's parallelism is its chunks, which the dispatcher's threads share (abi.py)
    parallel: bool
    # the axes of its vector (plan/loops.py): ACROSS_OUTPUTS (always, if it does not
    # reduce), ACROSS_REDUCED or ACROSS_BOTH
    vector: str = ACROSS_OUTPUTS
    template: str = "contract_reduce"
    # a PROB NORMALIZE's total summed in lanes and ranges, not in the elements' order
    # (reassociating mode: codegen/totals.py's parts_total; PlanOptions.lane_totals)
    total_in_lanes: bool = False
    # each output's terms summed in the lanes of a line (term v of each vector into lane
    # v % LANES, the lanes added pairwise at the end), not one after another: a float64
    # PROB sum across reduced axes in the reassociating mode (codegen/totals.py's LANES;
    # PlanOptions.lane_sums)
    terms_in_lanes: bool = False

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def sums_in_lanes(self) -> bool:
        """Whether its CPU kernel sums across reduced axes abi.LANES outputs side by side
        (codegen/cpu.py: _lanes_reduction): float sums only (PROB, in either mode). A
        float sum in order is one chain of dependent additions, ~4 cycles each; a max, an
        any, an integer sum are not bound by theirs, and LOGPROB by its exp."""
        sr = SEMIRINGS[self.semiring]
        across_reduced = self.template == "contract_reduce" and self.reduce and self.vector == ACROSS_REDUCED
        return across_reduced and sr.reduction == "sum" and sr.accumulator(self.dtype) == "0.0"

    @property
    def sums_in_lines(self) -> bool:
        """Whether it is a reduction that the contract_lines template can compute (codegen/
        cpu_lines.py: each line of outputs' products in registers, added to its line of
        sums): across outputs, and ⊕ a line's + in the dtype itself (PROB float64, COUNT).
        Not float32 (its sums accumulate in float64), LOGPROB (an exp per term), SAT (it
        stops at the first true term) or MAXLOG (a max that propagates NaN)."""
        sr = SEMIRINGS[self.semiring]
        return (
            self.reduce
            and self.vector == ACROSS_OUTPUTS
            and sr.reduction == "sum"
            and self.dtype in ("float64", "int64")
        )

    @property
    def name(self) -> str:
        across = ""
        if self.reduce and self.template == "contract_reduce" and self.vector != ACROSS_REDUCED:
            across = "_across_" + self.vector
        flags = (
            ("_reduce" if self.reduce else "")
            + across
            + ("_norm" if self.normalize else "")
            + ("_lanetotal" if self.total_in_lanes else "")
            + ("_laneterms" if self.terms_in_lanes else "")
            + ("_par" if self.parallel else "")
        )
        return f"{self.template}_{self.semiring.lower()}_{self.dtype}{flags}"


@dataclass(frozen=True)
class Step:
    segment: Segment
    pattern: KernelPattern
    params: abi.StepParams | abi.GemmParams | abi.RepackParams  # by pattern.template
    work: int  # output elements x reduced elements x leaves


def c_strides(spec: TensorSpec) -> dict[tuple, int]:
    """Element strides of a C-contiguous tensor, by axis key."""
    strides, step = {}, 1
    for ax in reversed(spec.axes):
        strides[ax.key] = step
        step *= ax.size
    return strides


def normalize_groups(
    seg: Segment, layout: TensorSpec, batch_key: tuple | None, total: int = -1
) -> tuple[int, int, int, int]:
    """[groups, group stride, element stride, totals]: a NORMALIZE normalizes each of
    `groups` parts of its output alone, part g being the elements at g * group stride + i *
    element stride: one part per batch row (the batch axis is innermost), else [1, 0, 1].
    The rest of a row is walked in its memory order, the unbatched value's order. totals:
    where part g's total goes (at totals + g: seg.total's region, plan/totals.py), or -1."""
    if not seg.normalize or batch_key is None or not seg.out_spec.has_key(batch_key):
        return (1, 0, 1, total)
    if layout.axes[-1].key != batch_key:  # ir/batch.py and layout.py keep it innermost
        raise AssertionError(f"segment v{seg.out}: batch axis not innermost in {layout}")
    rows = layout.axes[-1].size
    return (rows, 1, rows, total)


def total_offset(seg: Segment, regions) -> int:
    """The arena offset of the segment's totals, or -1 (normalize_groups)."""
    return -1 if seg.total is None else regions[seg.total].offset
