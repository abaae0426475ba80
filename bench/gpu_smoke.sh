#!/usr/bin/env bash
# GPU smoke run: a random Qwen2-0.5B-shaped model, a few GRPO steps with the built-in engine and
# (when vllm is importable) with vLLM; the LAST line printed is one JSON object with, per
# engine, step time, tokens/s, MFU and peak GPU memory (see bench/gpu_smoke.py).
#
#   bench/gpu_smoke.sh                                  # on a GPU machine
#   SMOKE_SHAPE=tiny SMOKE_DEVICE=cpu bench/gpu_smoke.sh  # the mechanics, on a CPU, in seconds
#
# Settings (environment): SMOKE_SHAPE (qwen05b|tiny), SMOKE_DEVICE (cuda|cpu), SMOKE_PRECISION
# (default bf16 on cuda, fp32 on cpu), SMOKE_STEPS (4), SMOKE_PROMPTS (8), SMOKE_GROUP (8),
# SMOKE_NEW_TOKENS (64), SMOKE_DIR (a new temporary directory), PYTHON (python), SMOKE_FLAGS (the
# device flags given to `lmpo train`, default "--device $SMOKE_DEVICE --precision $SMOKE_PRECISION").
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}  # may hold words: "nice -n 10 python"
SHAPE=${SMOKE_SHAPE:-qwen05b}
DEVICE=${SMOKE_DEVICE:-cuda}
if [ "$DEVICE" = cpu ]; then PRECISION=${SMOKE_PRECISION:-fp32}; else PRECISION=${SMOKE_PRECISION:-bf16}; fi
STEPS=${SMOKE_STEPS:-4}
PROMPTS=${SMOKE_PROMPTS:-8}
GROUP=${SMOKE_GROUP:-8}
NEW_TOKENS=${SMOKE_NEW_TOKENS:-64}
FLAGS=${SMOKE_FLAGS---device $DEVICE --precision $PRECISION}
WORK=${SMOKE_DIR:-$(mktemp -d -t lmpo-gpu-smoke-XXXX)}
mkdir -p "$WORK"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TRANSFORMERS_VERBOSITY=error

echo "[smoke] $SHAPE on $DEVICE ($PRECISION), $STEPS steps of ${PROMPTS}x$GROUP, work dir $WORK" >&2
$PY bench/gpu_smoke.py build --shape "$SHAPE" --out "$WORK/model" --device "$DEVICE" >&2 || {
  echo '{"error": "building the smoke model failed"}'; exit 1; }

engines=local
if [ "$DEVICE" != cpu ] && $PY -c "import vllm" >/dev/null 2>&1; then engines="local vllm"; fi
runs=()
for engine in $engines; do
  run="$WORK/run-$engine"
  runs+=("$run")
  echo "[smoke] engine=$engine -> $run.log" >&2
  $PY -m lmpo train grpo --model "$WORK/model" $FLAGS --engine "$engine" \
    --out "$run" --steps "$STEPS" --prompts_per_step "$PROMPTS" --group_size "$GROUP" \
    --max_new_tokens "$NEW_TOKENS" --eval_problems 0 --save_every 0 --save_trajectories 0 --warmup_steps 0 \
    >"$run.log" 2>&1 || { echo "[smoke] engine=$engine failed; last lines of $run.log:" >&2; tail -n 5 "$run.log" >&2; }
done
$PY bench/gpu_smoke.py summarize --model "$WORK/model" --batch $((PROMPTS * GROUP)) "${runs[@]}"
