#!/usr/bin/env bash
# Preprocess a dataset described by configs/datasets/<name>.yaml.
# Usage: bash examples/data/preprocess_data.sh gsm8k [key=value ...]
# It runs in the repository root, from wherever it is called: relative paths (a yaml path given as <name>,
# and input, tokenizer_name_or_path and output_prefix in the dataset config or the overrides) are read there.
set -euo pipefail
cd "$(dirname "$0")/../.."
NAME=${1:?usage: bash examples/data/preprocess_data.sh <name> [key=value ...]}
shift
echo "[preprocess_data] running in $PWD: relative paths in the dataset config and the overrides are read from there"
"${PYTHON:-.venv/bin/python}" cli/preprocess_data.py "$NAME" "$@"
