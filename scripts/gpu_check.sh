#!/usr/bin/env bash
# On a CUDA machine, in one call: the GPU test suite (tests marked cuda / tensorrt), then the benchmark.
#
#   scripts/gpu_check.sh [OUT_DIR]
#
# Needs CuPy and a GPU engine backend: the CUDA extra (pip install '.[cuda13]': the cuDNN engine) and,
# for the ONNX Runtime rows, onnxruntime-gpu in place of onnxruntime.
#
# PP_ASSETS      folder with KITTI frames (kitti/training/velodyne*, label_2, calib) and checkpoints for
#                the tests' KITTI layer and the benchmark's KITTI frame sets (without it: simulated scans)
# BENCH_ARGS     extra arguments for `pointpillars-trt bench`
# SKIP_TESTS=1 / SKIP_BENCH=1 to run only one half
# PATHS=1        then scripts/bench_paths.py on PP_ASSETS' frames (the paths users run: infer, Ray,
#                Triton, resident memory); PATHS_ARGS: its extra arguments (e.g. --skip ray triton)
#
# Stops at once, with one error line, when CuPy sees no GPU or the cuDNN engine cannot run: every
# number after that would be the CPU path's.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-gpu_out}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
assets=${PP_ASSETS:-}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 - <<'PYEOF' || exit 2
import sys
try:
    import cupy
except ImportError as exc:
    sys.exit(f"error: CuPy cannot be imported ({exc}): install the CUDA extra (pip install '.[cuda13]') on a CUDA machine")
import onnxruntime as o
from pointpillars_trt.runtime.cudnn import cudnn_unavailable_reason
reason = cudnn_unavailable_reason()
print("cupy", cupy.__version__, "| onnxruntime", o.__version__, o.get_available_providers(),
      "| cudnn engine:", reason or "available")
try:
    gpus = cupy.cuda.runtime.getDeviceCount()
except cupy.cuda.runtime.CUDARuntimeError as exc:
    gpus, reason = 0, f"CuPy sees no GPU ({exc})"
if reason or not gpus:
    sys.exit(f"error: {reason or 'CuPy sees no GPU'}: install the CUDA extra (pip install '.[cuda13]') on a CUDA machine")
PYEOF

status=0
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  python3 -m pytest -v --tb=short -rs -m "cuda or tensorrt" -p no:cacheprovider tests 2>&1 | tee "$out/gpu_tests.log"
  status=${PIPESTATUS[0]}
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  frames=()
  for d in "$assets/kitti/training/velodyne_fov" "$assets/kitti/training/velodyne"; do
    [ -n "$assets" ] && [ -d "$d" ] && frames+=(--frames "$d")
  done
  model=()
  [ -f "$assets/checkpoints/pointpillar_openpcdet_synthetic.pth" ] && model=(--model "$assets/checkpoints/pointpillar_openpcdet_synthetic.pth")
  python3 -m pointpillars_trt bench "${model[@]}" "${frames[@]}" ${BENCH_ARGS:-} --out "$out/bench" 2>&1 | tee "$out/bench.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
if [ "${PATHS:-0}" = 1 ]; then
  python3 scripts/bench_paths.py --model "$assets/checkpoints/pointpillar_openpcdet_synthetic.pth" \
    --camera "$assets/kitti/training/velodyne_fov" --full "$assets/kitti/training/velodyne" ${PATHS_ARGS:-} \
    2>&1 | tee "$out/paths.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
exit "$status"
