#!/usr/bin/env bash
# Reward-model training (Bradley-Terry) on Qwen2.5-7B (rm_qwen25_7b_A3.yaml, 1 node x 16 NPUs). Run the same command on
# every node:
#
#   NNODES=1 NPUS_PER_NODE=16 MASTER_ADDR=10.0.0.1 SOCKET_IFNAME=enp189s0f0 CURRENT_IP=<this node's IP> \
#       bash examples/rm/rm_trainer_qwen25_7b.sh [config name] [key=value ...]
#
# Before: the pairs preprocessed (cli/preprocess_data.py preference_pairs ...) and the SFT model converted with
# --orm (examples/ckpt/convert_qwen25_7b_orm_hf2mcore.sh). The plan without NPUs:
#   .venv/bin/python cli/train_rm.py --config-name rm_qwen25_7b_A3 dry_run=true
# On one machine, the CPU twin:  NNODES=1 bash examples/rm/rm_trainer_qwen25_7b.sh rm_tiny_cpu
DEFAULT_CONFIG=rm_qwen25_7b_A3 ENTRY=cli/train_rm.py exec bash "$(dirname "$0")/../launch_ray_job.sh" "$@"
