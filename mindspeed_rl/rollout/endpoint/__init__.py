"""The OpenAI-compatible policy endpoint outside agents talk to, its episodes and the harness run per episode."""
