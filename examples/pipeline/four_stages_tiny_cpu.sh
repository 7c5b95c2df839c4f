#!/usr/bin/env bash
# The four stages of the PPO walkthrough on this CPU, each reading the previous stage's output folder by path:
#   1. SFT of a randomly initialised model on the lucky-number task's worked answers, a quarter of them right
#      (the rest end in 8 or another digit: the SFT model answers 8 when greedy)
#   2. a reward model trained from the SFT model (its HF folder converted with --orm) on preference pairs of worked
#      answers (the chosen says 7; the rejected another digit, or stops before any)
#   3. PPO: the actor from SFT, the critic from the reward model, the reward model as the reward
#   3'. DPO from the SFT model on the same pairs instead (compared in docs/stages.md)
# Held-out accuracy after each stage (greedy, the rule verifier on ./demo_assets/data/arith_test) is the PPO
# runs' val/acc_for_ppo/mean@1: at iteration 0 the model it loaded, at the end the trained one.
#   bash examples/pipeline/four_stages_tiny_cpu.sh          (about 5 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
OUT=./demo_assets/pipeline
rm -rf "$OUT"
$PY cli/prepare_demo.py --sft --pairs

# 1. SFT (20 steps x 32 examples)
$PY cli/train_sft.py --config-name sft_tiny_cpu actor_config.save=$OUT/sft rl_config.log_dir=$OUT/logs_sft \
    megatron_training.data_path=./demo_assets/data/lucky_sft_train_r25 \
    megatron_training.test_data_path=./demo_assets/data/lucky_sft_test_r25

# 2. the reward model from the SFT model (20 steps x 32 pairs)
$PY cli/convert_ckpt.py --load-model-type hf --save-model-type mg --orm \
    --load-dir $OUT/sft/iter_0000020_hf --save-dir $OUT/sft_orm
PAIRS="megatron_training.data_path=./demo_assets/data/lucky_worked_pairs_train \
    megatron_training.test_data_path=./demo_assets/data/lucky_worked_pairs_test"
$PY cli/train_rm.py --config-name rm_tiny_cpu reward_config.load=$OUT/sft_orm reward_config.finetune=true \
    reward_config.save=$OUT/rm rl_config.log_dir=$OUT/logs_rm $PAIRS

# 3. PPO from both (20 iterations)
$PY cli/train_ppo.py --config-name ppo_tiny_cpu_stages

# 3'. DPO from the SFT model instead (20 steps x 32 pairs), then its accuracy: one PPO iteration's validation
#     before training (iteration 0) loads it
$PY cli/train_dpo.py --config-name dpo_tiny_cpu actor_config.load=$OUT/sft actor_config.save=$OUT/dpo \
    rl_config.log_dir=$OUT/logs_dpo $PAIRS
$PY cli/train_ppo.py --config-name ppo_tiny_cpu_stages actor_config.load=$OUT/dpo megatron_training.train_iters=1 \
    actor_config.save=$OUT/dpo_eval rl_config.log_dir=$OUT/logs_dpo_eval
