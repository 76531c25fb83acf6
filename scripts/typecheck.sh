#!/usr/bin/env bash
# Type-check the package with mypy, the TensorRT engine against tensorrt-stubs.
#
# Why the detour: tensorrt-stubs installs tensorrt/__init__.pyi without a py.typed marker, so mypy
# skips it (and, with ignore_missing_imports, would quietly treat `tensorrt` as Any), and its
# tensorrt.pyi has syntax errors (a parameter named `in`, a required parameter after defaults). So
# we copy the stubs to a temporary folder, repair those lines, put the folder on MYPYPATH, and check
# that mypy really resolves `tensorrt.Builder` before trusting a clean result.
# Env: PYTHON (default python3), TRT_STUBS (pip requirement or wheel path, default tensorrt-stubs).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if ! "$PY" -m pip show tensorrt-stubs >/dev/null 2>&1; then
    "$PY" -m pip install --quiet --no-deps "${TRT_STUBS:-tensorrt-stubs}"
fi

stubs=$(mktemp -d)
trap 'rm -rf "$stubs"' EXIT
"$PY" - "$stubs" <<'PYEOF'
import re, shutil, sys
from importlib import metadata
from pathlib import Path

dest = Path(sys.argv[1])
for entry in metadata.files("tensorrt-stubs") or []:
    if entry.suffix == ".pyi":
        target = dest / entry
        target.parent.mkdir(parents=True, exist_ok=True)
        text = Path(entry.locate()).read_text()
        text = re.sub(r"\((self(?:: \w+)?), in: ", r"(\1, in_: ", text)  # `in` is a keyword
        text = re.sub(r"(channel_axis: int)\)", r"\1 = ...)", text)      # required after defaults
        target.write_text(text)
PYEOF

probe=$(MYPYPATH="$stubs" "$PY" -m mypy -c 'import tensorrt as trt; reveal_type(trt.Builder)' 2>&1 || true)
if ! grep -q "tensorrt_bindings.tensorrt.Builder" <<<"$probe"; then
    echo "typecheck: mypy does not see the TensorRT stubs:" >&2
    echo "$probe" >&2
    exit 1
fi
MYPYPATH="$stubs" "$PY" -m mypy "${@:-pointpillars_trt}"
