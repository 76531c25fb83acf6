"""Thin wrapper: ``python3 scripts/build_engines.py ARGS`` == ``pointpillars-trt build ARGS``."""

import sys

from pointpillars_trt.apps.cli import main

if __name__ == "__main__":
    sys.exit(main(["build", *sys.argv[1:]]))
