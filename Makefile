# Two commands work on a fresh machine: `make demo` and `make test`.
# Both create .venv through scripts/install.sh on first use.
VENV   ?= .venv
PYTHON := $(VENV)/bin/python
STAMP  := $(VENV)/.mindspeed_rl_installed
export PYTHONWARNINGS ?= ignore::UserWarning,ignore::DeprecationWarning,ignore::FutureWarning

.PHONY: setup demo test test-fast test-npu-versions test-npu-current lint docs clean-demo

$(STAMP): scripts/install.sh requirements/cpu.txt setup.py
	bash scripts/install.sh

setup: $(STAMP)

demo: $(STAMP)
	$(PYTHON) cli/prepare_demo.py
	$(PYTHON) cli/train_ppo.py --config-name ppo_tiny_cpu

# The outside agents' environment (requirements/agents.txt): a venv of its own, as a user's agent has.
AGENTS_STAMP := .venv-agents/.installed
$(AGENTS_STAMP): requirements/agents.txt $(STAMP)
	"$$($(PYTHON) -c 'import sys, os; print(os.path.join(sys.base_prefix, "bin", "python3"))')" -m venv .venv-agents
	.venv-agents/bin/python -m pip install -q --disable-pip-version-check -r requirements/agents.txt
	touch $(AGENTS_STAMP)

# Two streams of tests on the two cores (pytest-xdist; grouping and order in tests/conftest.py).
test: $(STAMP) $(AGENTS_STAMP)
	$(PYTHON) -m pytest -n 2 --dist loadgroup tests

# The edit-test loop: everything but the multi-process and end-to-end runs (pytest.ini's `slow` marker).
test-fast: $(STAMP)
	$(PYTHON) -m pytest -m "not slow" tests

# ruff (lint rules and the formatter, both only checking) and mypy on the typed layers; settings in
# pyproject.toml. .pre-commit-config.yaml runs the same before each commit.
lint: $(STAMP)
	@$(VENV)/bin/ruff --version >/dev/null 2>&1 && $(VENV)/bin/mypy --version >/dev/null 2>&1 || $(PYTHON) -m pip install -q --disable-pip-version-check -r requirements/lint.txt
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The compatibility stage: the same code on the NPU stack's megatron-core and vLLM releases (on CPU),
# in its own .venv-npu-versions.
test-npu-versions:
	bash scripts/test_npu_versions.sh

# The same on the current Ascend images' library versions (megatron-core 0.16.0, vLLM 0.23.0, transformers
# 5.5.4), in its own .venv-npu-current.
test-npu-current:
	NPU_SET=current bash scripts/test_npu_versions.sh

docs: $(STAMP)
	$(PYTHON) cli/config_docs.py > docs/config.md

clean-demo:
	rm -rf demo_assets
