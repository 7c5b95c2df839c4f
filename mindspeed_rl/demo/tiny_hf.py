"""Tiny HF models and tokenizers built offline (no model hub): for tests, the demo and benches."""

from __future__ import annotations

import os
from typing import Iterable, Optional, Sequence, Tuple

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def build_tokenizer(
    out_dir: str,
    texts: Iterable[str],
    vocab_size: int = 1024,
    full_alphabet: bool = True,
    special_tokens: Sequence[str] = SPECIAL,
    eos_token: str = "<|endoftext|>",
    pad_token: str = "<|endoftext|>",
    individual_digits: bool = False,
    pad_to_vocab: bool = False,
):
    """Train a byte-level BPE on ``texts`` and save it as a HF fast tokenizer in ``out_dir``.

    ``full_alphabet=False`` keeps only the bytes seen in ``texts`` (a smaller vocab for tiny demos);
    ``individual_digits`` makes every digit a token of its own; ``pad_to_vocab`` fills the vocabulary up to
    ``vocab_size`` with unused special tokens, so that every row of a model's vocabulary decodes.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        if individual_digits
        else byte_level
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet() if full_alphabet else [],
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos_token, pad_token=pad_token)
    if pad_to_vocab and len(fast) < vocab_size:
        fast.add_tokens([f"<|extra_{i}|>" for i in range(vocab_size - len(fast))], special_tokens=True)
    os.makedirs(out_dir, exist_ok=True)
    fast.save_pretrained(out_dir)
    return fast


def hf_config_for(model, vocab_size: Optional[int] = None, orm: bool = False):
    """A transformers config matching a ModelConfig, of the model's family (Qwen2, Qwen3, Llama, Qwen3-MoE)."""
    from transformers import AutoConfig

    from ..families import get_family

    family = get_family(model.model_type_hf)
    values = family.hf_config(model, eos_token_id=0, pad_token_id=0)
    values.update(
        vocab_size=vocab_size or model.padded_vocab_size,
        num_labels=1,
        architectures=[
            family.architecture.replace("ForCausalLM", "ForSequenceClassification") if orm else family.architecture
        ],
    )
    for key in ("model_type", "torch_dtype"):
        values.pop(key)
    return AutoConfig.for_model(family.hf_model_types[0], **values)


def build_hf_model(
    out_dir: str,
    model,
    seed: int = 0,
    orm: bool = False,
    max_shard_size: str = "5GB",
    tokenizer_dir: Optional[str] = None,
    safe_serialization: bool = True,
):
    """A randomly initialised causal LM (or ORM) of ``model``'s family and shape, saved to ``out_dir``."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoModelForSequenceClassification

    torch.manual_seed(seed)
    cls = AutoModelForSequenceClassification if orm else AutoModelForCausalLM
    if model.vision_config and not orm:
        cls = AutoModelForImageTextToText
    hf = cls.from_config(hf_config_for(model, orm=orm)).float().eval()
    with torch.no_grad():  # non-trivial norms, biases and routers so conversions are really checked
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
            if name.endswith("bias"):
                p.normal_(0, 0.05)
            if name.endswith("mlp.gate.weight") and p.shape[0] == (model.num_experts or -1):
                p.normal_(0, 0.5)  # decisive routing: top-k ties would make comparisons flaky
        for name, buffer in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):  # DeepSeek-V3's expert bias: a weight to convert too
                buffer.normal_(0, 0.1)
    hf.save_pretrained(out_dir, max_shard_size=max_shard_size)
    if not safe_serialization:  # the legacy .bin layout (transformers 5 writes safetensors only)
        for f in os.listdir(out_dir):
            if f.startswith("model") and (f.endswith(".safetensors") or f.endswith(".index.json")):
                os.remove(os.path.join(out_dir, f))
        torch.save(hf.state_dict(), os.path.join(out_dir, "pytorch_model.bin"))
    if tokenizer_dir:
        for f in os.listdir(tokenizer_dir):
            shutil.copy2(os.path.join(tokenizer_dir, f), os.path.join(out_dir, f))
    return hf


def masked_lm_batch(examples: Sequence[Tuple[Sequence[int], Sequence[int]]], pad_id: int):
    """(input ids, labels, attention mask) of right-padded (ids, loss mask) examples (``sft_rows``): the labels are
    the ids where the mask is 1 and -100 (ignored) elsewhere. A cold-start SFT step's batch."""
    import torch

    from ..datasets.conversations import sft_rows

    rows = sft_rows([{"input_ids": ids, "loss_mask": mask} for ids, mask in examples], pad_id)
    labels = torch.where(rows["loss_mask"].bool(), rows["input_ids"], -100)
    return rows["input_ids"], labels, rows["attention_mask"]


def sft_step(model, optimizer, loss) -> None:
    """One optimizer step on ``loss``, the gradient norm clipped at 1."""
    import torch

    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
