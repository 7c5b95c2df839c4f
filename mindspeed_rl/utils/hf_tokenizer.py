"""Loading a HF tokenizer folder the one way every command does: never its own code, errors naming the key."""

from __future__ import annotations

from .cli import UserError


def load_tokenizer(path: str, key: str):
    """The tokenizer in ``path``. A folder that holds none, or one that needs its own Python code
    (auto_map / trust_remote_code, never run here: no [y/N] prompt either), is a UserError naming ``key``."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except (OSError, ValueError) as exc:
        if "custom code" in str(exc):
            raise UserError(
                f"{key} {path}: the tokenizer needs its own Python code (auto_map / trust_remote_code), "
                "which is never run here: use a tokenizer folder without it"
            ) from None
        raise UserError(f"{key} {path}: cannot load a tokenizer ({exc})") from None
