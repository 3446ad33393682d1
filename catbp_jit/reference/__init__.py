"""The reference interpreter: CatBP's VM semantics in numpy, the oracle for everything else."""

from .align import align_array_to
from .kernels import keep_keys_from_drop, vm_contract, vm_eliminate_keep, vm_unit
from .selectors import SelectorPayload, vm_load_selector
from .vm import RegisterBank, SlotStore, VirtualMachine, adapt_slots, run_program, run_programs

__all__ = [
    "RegisterBank",
    "SelectorPayload",
    "SlotStore",
    "VirtualMachine",
    "adapt_slots",
    "align_array_to",
    "keep_keys_from_drop",
    "run_program",
    "run_programs",
    "vm_contract",
    "vm_eliminate_keep",
    "vm_load_selector",
    "vm_unit",
]
