"""Rule rewards: verifier functions registered by name."""

from .registry import get_verifier, known_verifiers, register_verifier

__all__ = ["get_verifier", "known_verifiers", "register_verifier"]
