#!/usr/bin/env bash
# A trained Megatron-core actor -> HF safetensors in <HF_DIR>/mg2hf (config and tokenizer from HF_DIR).
# Usage: bash examples/ckpt/convert_qwen25_32b_mcore2hf.sh [ACTOR_DIR] [HF_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
ACTOR_DIR=${1:-./ckpt}
HF_DIR=${2:-./Qwen2.5-32B}
PY=${PYTHON:-.venv/bin/python}

"$PY" cli/convert_ckpt.py --use-mcore-models --model-type GPT \
    --load-model-type mg --save-model-type hf \
    --load-dir "$ACTOR_DIR" --save-dir "$HF_DIR" --model-type-hf qwen25 --params-dtype bf16
