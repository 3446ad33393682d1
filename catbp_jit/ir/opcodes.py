"""The VM's opcodes and their numbers (CatBP's IR specification; docs/ir.md)."""

from enum import Enum


class OpCode(Enum):
    UNIT = 1
    LOAD_FACTOR = 2
    LOAD_SELECTOR = 3
    LOAD_SLOT = 4
    STORE_SLOT = 5
    CONTRACT = 6
    ELIMINATE = 7
    NORMALIZE = 8
    FREE = 9
