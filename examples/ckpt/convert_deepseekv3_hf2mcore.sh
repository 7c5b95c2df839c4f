#!/usr/bin/env bash
# DeepSeek-V3 / R1 (671B) HF -> Megatron-core at grpo_deepseek_r1_671b_A3's actor layout: TP 4, PP 6 (uneven stages
# 9,10,10,10,11,11), EP 16. The family (deepseek_v3: multi-latent attention, 3 dense layers, 256 experts + a shared
# one, sigmoid routing with the expert bias) is read from config.json; the multi-token-prediction layer (61) is read
# past and reported. The Hub's FP8 weights are dequantized on the way (each 128 x 128 block times its
# weight_scale_inv factor) and written in bf16.
# Usage: bash examples/ckpt/convert_deepseekv3_hf2mcore.sh [HF_DIR] [ACTOR_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
HF_DIR=${1:-./DeepSeek-V3-hf}
ACTOR_DIR=${2:-./ckpt}
PY=${PYTHON:-.venv/bin/python}

"$PY" cli/convert_ckpt.py --use-mcore-models --model-type GPT \
    --load-model-type hf --save-model-type mg \
    --target-tensor-parallel-size 4 --target-pipeline-parallel-size 6 --num-layer-list 9,10,10,10,11,11 \
    --target-expert-parallel-size 16 \
    --load-dir "$HF_DIR" --save-dir "$ACTOR_DIR" --tokenizer-model "$HF_DIR/tokenizer.json" --params-dtype bf16
