"""Models that live in other libraries, as FactorGraphs: pgmpy and pyAgrum objects.

Neither library is imported with catbp_jit: each converter imports its own when called.
"""

from .pgmpy import from_pgmpy
from .pyagrum import from_pyagrum, read_pyagrum_file

__all__ = ["from_pgmpy", "from_pyagrum", "read_pyagrum_file"]
