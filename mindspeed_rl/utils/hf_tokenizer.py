"""Loading a HF tokenizer folder the one way every command does (never its own code, errors naming the key), and
whether two tokenizers agree."""

from __future__ import annotations

from typing import List, Optional, Tuple

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


def tokenizer_difference(student, teacher) -> Optional[str]:
    """Why two tokenizers do not map text to the same ids (None when they do): the teacher scores the student's
    token ids, which must mean the same text to both."""
    for name in ("eos_token_id", "pad_token_id", "bos_token_id"):
        if getattr(student, name, None) != getattr(teacher, name, None):
            return f"{name} {getattr(teacher, name, None)} (the student's: {getattr(student, name, None)})"
    mine, theirs = student.get_vocab(), teacher.get_vocab()
    if mine != theirs:
        differing = sorted(set(mine.items()) ^ set(theirs.items()), key=lambda item: item[1])
        token, index = differing[0]
        return (
            f"vocabularies differ: {len(theirs)} tokens (the student's: {len(mine)}), "
            f"{len(differing)} (token, id) pairs in one but not the other, e.g. {token!r} -> {index}"
        )
    return None


def decode_known(tokenizer, ids: List[int]) -> Tuple[str, int]:
    """Text of ``ids`` without the ids at or above the tokenizer's length, and how many those were."""
    kept = [t for t in ids if t < len(tokenizer)]
    return tokenizer.decode(kept, skip_special_tokens=True), len(ids) - len(kept)
