#!/usr/bin/env bash
# DPO of the Qwen2.5-7B SFT model (dpo_qwen25_7b_A3.yaml, 1 node x 16 NPUs). Run the same command on every node:
#
#   NNODES=1 NPUS_PER_NODE=16 MASTER_ADDR=10.0.0.1 SOCKET_IFNAME=enp189s0f0 CURRENT_IP=<this node's IP> \
#       bash examples/dpo/dpo_trainer_qwen25_7b.sh [config name] [key=value ...]
#
# Before: the pairs preprocessed (cli/preprocess_data.py preference_pairs ...) and the SFT model saved by
# examples/sft/sft_trainer_qwen25_7b.sh (TP 4). The plan without NPUs:
#   .venv/bin/python cli/train_dpo.py --config-name dpo_qwen25_7b_A3 dry_run=true
# On one machine, the CPU twin:  NNODES=1 bash examples/dpo/dpo_trainer_qwen25_7b.sh dpo_tiny_cpu
DEFAULT_CONFIG=dpo_qwen25_7b_A3 ENTRY=cli/train_dpo.py exec bash "$(dirname "$0")/../launch_ray_job.sh" "$@"
