#!/usr/bin/env bash
# On a CUDA machine, in one call: the GPU test suite (tests marked cuda / tensorrt), then the benchmark.
#
#   scripts/gpu_check.sh [OUT_DIR]
#
# PP_ASSETS      folder laid out like ../shared/assets (KITTI frames, checkpoints) for the tests and the
#                benchmark's KITTI frame sets; default ../shared/assets
# ORT_FERRY      folder holding onnxruntime-gpu wheel pieces ort.part? to install first (machines
#                without a package index); none by default
# BENCH_ARGS     extra arguments for `pointpillars-trt bench`
# SKIP_TESTS=1 / SKIP_BENCH=1 to run only one half
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-gpu_out}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
assets=${PP_ASSETS:-../shared/assets}

if [ -n "${ORT_FERRY:-}" ] && ls "$ORT_FERRY"/ort.part? >/dev/null 2>&1; then
  wheel="$ORT_FERRY/onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl"
  [ -f "$wheel" ] || cat "$ORT_FERRY"/ort.part? > "$wheel"
  python3 -m pip install -q --no-index --no-deps --target /tmp/ort-site "$wheel" || exit 1
  export PYTHONPATH="/tmp/ort-site:$PYTHONPATH"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import onnxruntime as o, cupy; print('onnxruntime', o.__version__, o.get_available_providers()); print('cupy', cupy.__version__)"

status=0
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  python3 -m pytest -v --tb=short -rs -m "cuda or tensorrt" -p no:cacheprovider tests 2>&1 | tee "$out/gpu_tests.log"
  status=${PIPESTATUS[0]}
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  frames=()
  for d in "$assets/kitti/training/velodyne_fov" "$assets/kitti/training/velodyne"; do
    [ -d "$d" ] && frames+=(--frames "$d")
  done
  model=()
  [ -f "$assets/checkpoints/pointpillar_openpcdet_synthetic.pth" ] && model=(--model "$assets/checkpoints/pointpillar_openpcdet_synthetic.pth")
  python3 -m pointpillars_trt bench "${model[@]}" "${frames[@]}" ${BENCH_ARGS:-} --out "$out/bench" 2>&1 | tee "$out/bench.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
exit "$status"
