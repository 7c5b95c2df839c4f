"""Evaluation on benchmark suites: suites from local files or generators, their samples scored by the training
verifiers, pass@k / maj@k per suite (cli/evaluate.py on a checkpoint; eval_config during training)."""
