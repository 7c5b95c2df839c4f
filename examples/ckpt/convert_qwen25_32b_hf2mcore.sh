#!/usr/bin/env bash
# Qwen2.5-32B HF -> Megatron-core, TP 8 / PP 1: the actor (and reference) and the critic (--orm).
# Usage: bash examples/ckpt/convert_qwen25_32b_hf2mcore.sh [HF_DIR] [ACTOR_DIR] [CRITIC_DIR] [RM_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
HF_DIR=${1:-./Qwen2.5-32B}
ACTOR_DIR=${2:-./ckpt}
CRITIC_DIR=${3:-./ckpt-critic}
RM_DIR=${4:-$HF_DIR}     # a reward model (ForSequenceClassification) to start the critic from, or the SFT model
PY=${PYTHON:-.venv/bin/python}

"$PY" cli/convert_ckpt.py --use-mcore-models --model-type GPT \
    --load-model-type hf --save-model-type mg \
    --target-tensor-parallel-size 8 --target-pipeline-parallel-size 1 \
    --add-qkv-bias --load-dir "$HF_DIR" --save-dir "$ACTOR_DIR" \
    --tokenizer-model "$HF_DIR/tokenizer.json" --model-type-hf qwen25 --params-dtype bf16

"$PY" cli/convert_ckpt.py --use-mcore-models --model-type GPT \
    --load-model-type hf --save-model-type mg \
    --target-tensor-parallel-size 8 --target-pipeline-parallel-size 1 \
    --add-qkv-bias --load-dir "$RM_DIR" --save-dir "$CRITIC_DIR" \
    --tokenizer-model "$HF_DIR/tokenizer.json" --model-type-hf qwen25 --params-dtype bf16 --orm
