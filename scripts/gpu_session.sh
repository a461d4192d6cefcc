#!/usr/bin/env bash
# Every GPU check of the CUDA fast path (tests and figures), in one unattended command on a lent H100/H200.
#
#   bash scripts/gpu_session.sh --fetch-wheels   # here, once: what the GPU image lacks (gguf) -> .whl/
#   bash scripts/gpu_session.sh                  # there (carry .whl): GPU tests, then every figure
#   bash scripts/gpu_session.sh tests|bench      # one half only (each fits one 10-minute device call)
#
# Writes gpu-tests.log, gpu-bench.json and gpu-bench.log to $OUT (the device tool's folder) or, without
# it, to /tmp/gpu-session. Copy gpu-bench.json to docs/results/ and run scripts/bench_report.py --write-docs.
set -uo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"  # the GPU image's python3 holds PyTorch

if [ "${1:-}" = "--fetch-wheels" ]; then
  grep -qxF '/.whl/' .git/info/exclude || echo '/.whl/' >> .git/info/exclude
  "$py" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl gguf==0.19.0
  exit
fi

if compgen -G ".whl/*.whl" > /dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
out="${OUT:-/tmp/gpu-session}"
mkdir -p "$out"
part="${1:-all}"
if [ "$part" = all ] || [ "$part" = tests ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$out/gpu-tests.log"
  # The kernels, graphs and end-to-end tests, on CUDA (the CPU suite runs them through the interpreter).
  "$py" -m pytest -q -p no:cacheprovider tests/attention/test_triton_backend.py tests/worker/test_cuda_graphs.py \
    tests/entrypoints/test_gpu_e2e.py tests/engine/test_overlap_scheduling.py 2>&1 | tee -a "$out/gpu-tests.log"
fi
if [ "$part" = all ] || [ "$part" = bench ]; then
  "$py" scripts/gpu_bench.py --output-json "$out/gpu-bench.json" 2>&1 | tee "$out/gpu-bench.log"
fi
