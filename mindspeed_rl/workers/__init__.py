"""Ray actors: the integrated actor (train + rollout + reference), the critic; their launcher."""
