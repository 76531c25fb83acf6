"""``python -m pointpillars_trt``: the command line, as the ``pointpillars-trt`` script runs it."""

import sys

from .apps.console import main

sys.exit(main())
