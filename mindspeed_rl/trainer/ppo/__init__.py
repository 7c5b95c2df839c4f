"""The PPO single controller (`ppo_trainer.py`) and the parts of its iteration: prompts, batches, scoring (verifiers,
reward model, judge)."""
