"""`python -m catbp_jit`: the catbp-jit command line."""

import sys

from .cli import main

sys.exit(main())
