"""Where a trained batch comes from: the rollout source and its production loop, the schedules (in step, ahead, partial
rounds), the agent loop, dynamic sampling's group filter, scoring while generating, trajectories."""
