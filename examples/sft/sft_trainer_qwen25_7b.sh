#!/usr/bin/env bash
# Supervised fine-tuning of Qwen2.5-7B (sft_qwen25_7b_A3.yaml, 1 node x 16 NPUs). Run the same command on every node:
#
#   NNODES=1 NPUS_PER_NODE=16 MASTER_ADDR=10.0.0.1 SOCKET_IFNAME=enp189s0f0 CURRENT_IP=<this node's IP> \
#       bash examples/sft/sft_trainer_qwen25_7b.sh [config name] [key=value ...]
#
# Before: the instruction data preprocessed (cli/preprocess_data.py alpaca_instruction ...) and the base model
# converted to mcore (cli/convert_ckpt.py hf2mcore, TP 4). The plan without NPUs:
#   .venv/bin/python cli/train_sft.py --config-name sft_qwen25_7b_A3 dry_run=true
# On one machine, the CPU twin:  NNODES=1 bash examples/sft/sft_trainer_qwen25_7b.sh sft_tiny_cpu
DEFAULT_CONFIG=sft_qwen25_7b_A3 ENTRY=cli/train_sft.py exec bash "$(dirname "$0")/../launch_ray_job.sh" "$@"
