"""The PPO single controller: iteration loop, experience, metrics and logging."""
