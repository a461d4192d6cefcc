#!/usr/bin/env bash
# The reference serving experiments (L1, L2, Q3, Q4) at CPU scale, through HTTP against `folovllm serve`.
# Each experiment starts a server with its flags, runs `folovllm bench serve`, writes JSON and plots
# under docs/results/seed000/, and stops the server. Usage: bash scripts/reproduce_seed000.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin/folovllm
OUT=docs/results/seed000
mkdir -p "$OUT"
PORT=${PORT:-8123}

serve() {  # serve FLAGS... : start a server in the background and wait until it answers
  $BIN serve --port "$PORT" --max-model-len 1024 --log-level warning "$@" > /tmp/folovllm-serve.log 2>&1 &
  SERVER=$!
  for _ in $(seq 120); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && return 0
    sleep 1
  done
  echo "server did not start" >&2; cat /tmp/folovllm-serve.log >&2; exit 1
}
stop() { kill -TERM "$SERVER"; wait "$SERVER" || true; }
bench() { $BIN bench serve --base-url "http://127.0.0.1:$PORT" --no-progress --seed 0 "$@"; }

# L1: prefill-heavy vs decode-heavy (seed: 128 x 1024 x 16 vs 128 x 10 x 512), burst.
serve
bench --dataset prefill-heavy --num-prompts 16 --input-len 512 --output-len 16 --request-rate inf \
  --output-json "$OUT/l1-prefill-heavy.json"
bench --dataset decode-heavy --num-prompts 32 --input-len 10 --output-len 128 --request-rate inf \
  --output-json "$OUT/l1-decode-heavy.json"
# L2: the same short requests, burst vs Poisson (seed: 128 x ~19 x 256, Poisson 64/s).
bench --dataset l2 --num-prompts 32 --input-len 19 --output-len 64 --request-rate inf \
  --output-json "$OUT/l2-burst.json" --plot "$OUT/l2-burst"
bench --dataset l2 --num-prompts 32 --input-len 19 --output-len 64 --request-rate 4 \
  --output-json "$OUT/l2-poisson.json" --plot "$OUT/l2-poisson"
# Q3: long prompts under Poisson arrivals (seed: 128 x 1024 x 256, 64/s).
bench --dataset long-poisson --num-prompts 16 --input-len 512 --output-len 64 --request-rate 1 \
  --output-json "$OUT/q3-long-poisson.json"
stop

# Q4: mixed, 50 % long prompts, chunked prefill on (small chunks) vs off.
serve --max-num-batched-tokens 512 --long-prefill-token-threshold 128
bench --dataset mixed --num-prompts 32 --input-len 512 --output-len 32 --request-rate 2 \
  --output-json "$OUT/q4-mixed-chunked.json" --plot "$OUT/q4-mixed-chunked"
stop
serve --no-chunked-prefill
bench --dataset mixed --num-prompts 32 --input-len 512 --output-len 32 --request-rate 2 \
  --output-json "$OUT/q4-mixed-unchunked.json" --plot "$OUT/q4-mixed-unchunked"
stop
