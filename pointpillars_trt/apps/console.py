"""The ``pointpillars-trt`` script's entry: it imports the command line (NumPy, the commands' modules: a
quarter of a second) inside its own handling, so that Ctrl-C pressed while they load ends as it does
later, in one ``interrupted`` line and exit code 130, not a traceback."""

from __future__ import annotations

import sys

from .exit_codes import EXIT_INTERRUPTED


def main() -> int:
    try:
        from .cli import main as run
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    return run()
