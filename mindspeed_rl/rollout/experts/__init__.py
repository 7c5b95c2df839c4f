"""Mixture-of-experts rollout: the expert load the engines count (EPLB) and the expert placement map."""
