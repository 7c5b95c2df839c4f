#!/usr/bin/env bash
# Qwen2.5-7B HF -> Megatron-core with a value head (--orm), TP 4 / PP 1: the start of reward-model training
# (rm_qwen25_7b_A3.yaml). An SFT causal LM gets a freshly initialised head (said in the log); a
# ForSequenceClassification model keeps its score.weight.
# Usage: bash examples/ckpt/convert_qwen25_7b_orm_hf2mcore.sh [HF_DIR] [SAVE_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
HF_DIR=${1:-./Qwen2.5-7B-Instruct}
SAVE_DIR=${2:-./ckpt/qwen25_7b_orm_tp4}
PY=${PYTHON:-.venv/bin/python}

"$PY" cli/convert_ckpt.py --use-mcore-models --model-type GPT \
    --load-model-type hf --save-model-type mg \
    --target-tensor-parallel-size 4 --target-pipeline-parallel-size 1 \
    --add-qkv-bias --load-dir "$HF_DIR" --save-dir "$SAVE_DIR" \
    --tokenizer-model "$HF_DIR/tokenizer.json" --model-type-hf qwen25 --params-dtype bf16 --orm
