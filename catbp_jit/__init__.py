"""catbp_jit: run CatBP belief-propagation programs, compiled.

The IR names and enum values are CatBP's; `catbp_jit.reference` is the numpy interpreter
of the CatBP VM specification, the oracle every fast path is checked against.
`compile(...)` plans and compiles programs into an Executable; `VirtualMachine` and
`run_program` are drop-in replacements for CatBP's, running on the JIT. `solve(...)` does
exact inference on a discrete factor graph (catbp_jit.frontend: junction tree → programs).
"""

import os as _os

# Parallel kernels run on Numba's threading layer (often OpenMP). OpenMP's default is to
# spin at barriers, which on a busy machine turns each parallel region into a wait for a
# scheduler time slice; passive waiting keeps those regions cheap. A user's own setting
# wins; it must be made before the first parallel kernel runs.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# OpenBLAS's threads spin after each call for 2^28 cycles by default: ~110 ms of a core
# after every GEMM step (measured on 2 cores), taken from the loop kernels that follow it
# (Grids_16's solve 547-644 ms against 474-515 ms with 2^12). 2^12 cycles (~1.4 us) still
# spans the gap between the BLAS calls of one step. Read when SciPy's BLAS is loaded (Numba
# calls it): a user's own setting, or a BLAS loaded before catbp_jit, wins.
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "12")

from . import errors, reference  # noqa: E402
from .batched import BatchedExecutable, BatchedSession
from .compiler import compile, load
from .dropin import VirtualMachine, run_program
from .errors import (
    AlignmentError,
    CatbpError,
    DoubleDefinitionError,
    MissingArgumentError,
    ProgramKeyError,
    ProgramValueError,
    SpecError,
    UnknownInputError,
    UnknownOpcodeError,
    UnknownRegisterFreeError,
    UnwrittenSlotError,
    UseBeforeDefinitionError,
)
from .executable import Executable, build
from .frontend import FactorGraph, Solution, compile_model, factor_graph, solve
from .ir import Axis, AxisKey, AxisType, Instruction, OpCode, Program, TensorSpec
from .ir.adapt import adapt_program, adapt_programs
from .ir.validate import validate_programs
from .plan.options import PlanOptions
from .semiring import (
    VMSemiringRuntime,
    adapt_semiring,
    logsumexp,
    make_semiring,
    vm_counting_semiring,
    vm_logprob_semiring,
    vm_maxlog_semiring,
    vm_prob_semiring,
    vm_sat_semiring,
)
from .session import Session

__version__ = "0.1.0"

__all__ = [
    "Executable",
    "PlanOptions",
    "Session",
    "VirtualMachine",
    "build",
    "compile",
    "load",
    "run_program",
    "BatchedExecutable",
    "BatchedSession",
    "FactorGraph",
    "Solution",
    "compile_model",
    "factor_graph",
    "solve",
    "AlignmentError",
    "Axis",
    "AxisKey",
    "AxisType",
    "CatbpError",
    "DoubleDefinitionError",
    "Instruction",
    "MissingArgumentError",
    "OpCode",
    "Program",
    "ProgramKeyError",
    "ProgramValueError",
    "SpecError",
    "TensorSpec",
    "UnknownInputError",
    "UnknownOpcodeError",
    "UnknownRegisterFreeError",
    "UnwrittenSlotError",
    "UseBeforeDefinitionError",
    "VMSemiringRuntime",
    "adapt_program",
    "adapt_programs",
    "adapt_semiring",
    "errors",
    "logsumexp",
    "make_semiring",
    "reference",
    "validate_programs",
    "vm_counting_semiring",
    "vm_logprob_semiring",
    "vm_maxlog_semiring",
    "vm_prob_semiring",
    "vm_sat_semiring",
]
