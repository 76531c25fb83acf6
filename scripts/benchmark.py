"""Thin wrapper: ``python3 scripts/benchmark.py ARGS`` == ``pointpillars-trt bench ARGS``."""

import sys

from pointpillars_trt.apps.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
