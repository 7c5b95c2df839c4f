#!/usr/bin/env bash
# Qwen3-30B-A3B (MoE) HF -> Megatron-core, TP 4 / PP 1 / EP 8: the actor (and reference) and the critic (--orm).
# The family (qwen3_moe: qk-layernorm, 128 experts, top-8 routing) is read from config.json. Train it with
# model qwen3_30b_a3b and, for the actor and critic, tensor_model_parallel_size: 4, expert_model_parallel_size: 8.
# Usage: bash examples/ckpt/convert_qwen3_30b_a3b_hf2mcore.sh [HF_DIR] [ACTOR_DIR] [CRITIC_DIR] [RM_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
HF_DIR=${1:-./Qwen3-30B-A3B}
ACTOR_DIR=${2:-./ckpt-qwen3-moe}
CRITIC_DIR=${3:-./ckpt-qwen3-moe-critic}
RM_DIR=${4:-$HF_DIR}
PY=${PYTHON:-.venv/bin/python}

for target in actor critic; do
    if [ "$target" = actor ]; then src=$HF_DIR; dst=$ACTOR_DIR; orm=(); else src=$RM_DIR; dst=$CRITIC_DIR; orm=(--orm); fi
    "$PY" cli/convert_ckpt.py --use-mcore-models --model-type GPT \
        --load-model-type hf --save-model-type mg \
        --target-tensor-parallel-size 4 --target-pipeline-parallel-size 1 --target-expert-parallel-size 8 \
        --load-dir "$src" --save-dir "$dst" --tokenizer-model "$HF_DIR/tokenizer.json" --params-dtype bf16 "${orm[@]}"
done
