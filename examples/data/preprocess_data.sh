#!/usr/bin/env bash
# Preprocess a dataset described by configs/datasets/<name>.yaml.
# Usage: bash examples/data/preprocess_data.sh gsm8k [key=value ...]
set -euo pipefail
cd "$(dirname "$0")/../.."
NAME=${1:?usage: bash examples/data/preprocess_data.sh <name> [key=value ...]}
shift
"${PYTHON:-.venv/bin/python}" cli/preprocess_data.py "$NAME" "$@"
