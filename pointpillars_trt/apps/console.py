"""The ``pointpillars-trt`` script's entry: it imports the command line (NumPy, the commands' modules: a
quarter of a second) inside its own handling, so that Ctrl-C pressed while they load ends as it does
later, in one ``interrupted`` line and exit code 130, not a traceback."""

from __future__ import annotations

import sys

from ..stop_signals import stop_signals_blocked
from .exit_codes import EXIT_INTERRUPTED


def main() -> int:
    try:
        # held meanwhile, so that the threads these imports start (NumPy's BLAS pool) never take a Ctrl-C or
        # SIGTERM: the main thread does, or it waits for it (``stop_signals``)
        with stop_signals_blocked():
            from .cli import main as run
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    return run()
