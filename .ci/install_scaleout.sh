#!/usr/bin/env bash
# Install what the scale-out tests need: Ray Data and tritonclient into this Python, and the
# tritonserver binary bundled in the nvidia-pytriton wheel unpacked into a folder of its own (its
# PyTriton API pins numpy<2, so it must stay off this Python's path; only its binary is used).
# Idempotent and quick on a second run. Prints the tritonserver path on stdout, for:
#   export PP_TRITONSERVER="$(bash .ci/install_scaleout.sh)"
# Env: PYTHON (default python3), PP_PYTRITON_DIR (default $HOME/.cache/pp-ci/pytriton).
set -euo pipefail
PY=${PYTHON:-python3}
DEST=${PP_PYTRITON_DIR:-$HOME/.cache/pp-ci/pytriton}
BIN="$DEST/pytriton/tritonserver/bin/tritonserver"

if ! "$PY" -c 'import ray.data, tritonclient.grpc, tritonclient.http' >/dev/null 2>&1; then
    "$PY" -m pip install -q "ray[data]==2.60.0" "tritonclient[http,grpc]" >&2
fi
"$PY" -c 'import numpy; assert int(numpy.__version__.split(".")[0]) >= 2, numpy.__version__' >&2
if [ ! -x "$BIN" ]; then
    rm -rf "$DEST"
    "$PY" -m pip install -q --no-deps --target "$DEST" "nvidia-pytriton==0.7.0" >&2
fi
test -x "$BIN"
echo "$BIN"
