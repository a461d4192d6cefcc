#!/usr/bin/env bash
# The whole GPU check in one unattended device call of at most 9 minutes, every step under a time limit:
#   wheels  the carried wheels (.whl/, for packages the GPU image lacks) into a target dir on PYTHONPATH
#   env     versions, the GPU, and whether CUDA works at all (stops here if not)
#   smoke   ~2 min: Triton attention at Qwen3 shapes, greedy = transformers on the GPU, the CUDA fast path
#           = the CPU torch backend; STOPS HERE IF IT FAILS (the rest would only spend the lease)
#   bench   scripts/gpu_bench.py under --time-limit (it saves its JSON after every section)
#   tests   the remaining GPU tests, in parallel
#
#   bash scripts/gpu_check.sh [all|smoke|bench|tests]   # on the device (the run tool; carry .whl if fetched)
#   bash scripts/gpu_check.sh --fetch-wheels            # here: wheels of benchmarks/gpu/carried-wheels.txt
#   bash scripts/gpu_check.sh --rehearse [PART]         # here: the same steps on CPU (make gpu-rehearsal)
#   bash scripts/gpu_check.sh --dry-run [PART]          # the plan only; GPU_CHECK_FAIL=STEP fakes a failure
#
# Everything goes to $OUT (the device tool's folder; else /tmp/gpu-check): STEP.log per step, summary.txt,
# gpu-bench.json. Exit status: 0 if every step passed, else the first failing step's.
set -uo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"  # the GPU image's python3 holds PyTorch
out="${OUT:-/tmp/gpu-check}"
mode=device part=all
for arg in "$@"; do
  case "$arg" in
    --fetch-wheels)
      grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
      exec "$py" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl \
        -r benchmarks/gpu/carried-wheels.txt ;;
    --rehearse) mode=rehearse ;;
    --dry-run) mode=dry ;;
    all|smoke|bench|tests) part=$arg ;;
    *) echo "unknown argument $arg (see the header of $0)" >&2; exit 2 ;;
  esac
done
# Seconds per step: with 5 s of kill grace each, under 9 minutes, so a 600 s device call returns every log.
LIMIT_WHEELS=20 LIMIT_ENV=30 LIMIT_SMOKE=150 LIMIT_BENCH=220 LIMIT_TESTS=80
SMOKE_TESTS=(tests/attention/test_triton_backend.py::test_qwen3_shapes_on_cuda
             tests/entrypoints/test_gpu_vs_transformers.py tests/entrypoints/test_gpu_e2e.py)
REST_TESTS=(tests/attention/test_triton_backend.py tests/worker/test_cuda_graphs.py tests/lora/test_lora_triton.py
            tests/platforms/test_cuda_invariant.py tests/engine/test_batch_invariance.py::test_on_cuda)
bench_args=(--time-limit $((LIMIT_BENCH - 30)) --output-json "$out/gpu-bench.json")
workers=4
device_check="import torch; assert torch.cuda.is_available(), 'CUDA is not available'; print(torch.cuda.get_device_name())"
if [ "$mode" = rehearse ]; then  # the CPU stands in for the GPU: tiny bench, CUDA tests skip
  bench_args=(--smoke "${bench_args[@]}")
  device_check="import torch; print('rehearsal on CPU: torch', torch.__version__)"
  LIMIT_ENV=90 LIMIT_SMOKE=300 LIMIT_TESTS=400 workers=2  # Triton's interpreter on a 2-core CPU, not kernels on a GPU
fi
mkdir -p "$out"
summary="$out/summary.txt"
: > "$summary"

# step NAME LIMIT CMD...: runs CMD under the limit, its output in $out/NAME.log; the result in summary.txt.
step() {
  local name=$1 limit=$2 status start=$SECONDS
  shift 2
  echo "== $name (limit ${limit} s): $*" | tee -a "$summary"
  if [ "$mode" = dry ]; then
    status=0
    [ "${GPU_CHECK_FAIL:-}" = "$name" ] && status=1
  else
    timeout -k 5 "$limit" bash -c '"$@"' "$name" "$@" > "$out/$name.log" 2>&1  # (bash: functions too)
    status=$?
    tail -n 15 "$out/$name.log"
  fi
  echo "== $name: $([ $status = 0 ] && echo passed || echo "FAILED (status $status)") in $((SECONDS - start)) s" \
    | tee -a "$summary"
  return $status
}

install_wheels() {
  if compgen -G ".whl/*.whl" > /dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --target /tmp/gpu-site .whl/*.whl
  else
    echo "no carried wheels in .whl/"
  fi
}
environment() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true
  echo "cores: $(nproc)"
  "$py" - <<PY
$device_check
from importlib.metadata import PackageNotFoundError, version
from folovllm.bench.gpu_runs import versions  # imports the engine: the import check
print(versions())
for name in ("numpy", "tokenizers", "safetensors", "huggingface_hub", "gguf"):
    try:
        print(name, version(name))
    except PackageNotFoundError:
        print(name, "not installed")
PY
}

export PYTHONPATH="$PWD:/tmp/gpu-site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export py device_check
export -f install_wheels environment
pytest=("$py" -m pytest -q -p no:cacheprovider --timeout 120)
status=0
step wheels "$LIMIT_WHEELS" install_wheels && step env "$LIMIT_ENV" environment || exit 1
if [ "$part" = all ] || [ "$part" = smoke ]; then
  step smoke "$LIMIT_SMOKE" "${pytest[@]}" -x "${SMOKE_TESTS[@]}" || exit 1
fi
if [ "$part" = all ] || [ "$part" = bench ]; then
  step bench "$LIMIT_BENCH" "$py" scripts/gpu_bench.py "${bench_args[@]}" || status=1
fi
if [ "$part" = all ] || [ "$part" = tests ]; then
  step tests "$LIMIT_TESTS" "${pytest[@]}" -n "$workers" "${REST_TESTS[@]}" || status=1
fi
exit $status
