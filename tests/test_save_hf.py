"""save_hf: the HF folder written beside a checkpoint loads in transformers with Megatron's logits (actor)
and values (critic, the --orm form)."""

import json
import os

import pytest
import torch

from mindspeed_rl.checkpoint import megatron_layout as ml
from mindspeed_rl.checkpoint.engine_io import save_engine, save_hf_copy
from mindspeed_rl.demo.tiny_hf import build_tokenizer
from mindspeed_rl.models.engine import MegatronEngine
from tests.helpers import make_batch, single_process_world_fixture, tiny_role

single_process_world = single_process_world_fixture(seed=11)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("tok"))
    build_tokenizer(folder, ["1 + 2 = 3", "the answer is 42"], vocab_size=200)
    return folder


def perturb(engine):
    """Weights away from their init (norms and biases included), as after training."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for _, p in engine.named_weights():
            p.add_(0.05 * torch.randn(p.shape, generator=g).to(p.dtype))


def test_actor_save_hf_loads_in_transformers_with_megatron_logits(tmp_path, tokenizer_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    role = tiny_role(save=str(tmp_path / "actor"), save_hf=True, tokenizer_name_or_path=tokenizer_dir)
    engine = MegatronEngine(role, head="lm", trainable=True, total_steps=1)
    perturb(engine)
    save_engine(engine, role.megatron.save, 3)
    path = save_hf_copy(engine, role.megatron.save, 3)
    assert path == str(tmp_path / "actor" / "iter_0000003_hf")
    assert ml.read_tracker(role.megatron.save) == 3 and os.path.isdir(tmp_path / "actor" / "iter_0000003")
    assert not os.path.exists(path + ".tmp")
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(os.listdir(path))
    assert AutoTokenizer.from_pretrained(path).eos_token_id is not None

    hf = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    batch = make_batch(batch=3, seq=12, vocab=256, left_pad=False)
    ours = engine.forward(batch, micro_batch_size=3, with_logits=True)["logits"]
    with torch.no_grad():
        theirs = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    valid = batch["attention_mask"].bool()
    assert torch.allclose(ours[valid], theirs[valid], atol=1e-4), (ours[valid] - theirs[valid]).abs().max()


def test_critic_save_hf_is_the_orm_form_with_megatron_values(tmp_path, tokenizer_dir):
    from transformers import AutoModelForSequenceClassification

    role = tiny_role("critic", save=str(tmp_path / "critic"), save_hf=True, tokenizer_name_or_path=tokenizer_dir)
    engine = MegatronEngine(role, head="value", trainable=True, total_steps=1)
    perturb(engine)
    save_engine(engine, role.megatron.save, 2)
    path = save_hf_copy(engine, role.megatron.save, 2)
    config = json.load(open(os.path.join(path, "config.json")))
    assert config["architectures"] == ["Qwen2ForSequenceClassification"] and config["num_labels"] == 1
    hf = AutoModelForSequenceClassification.from_pretrained(path, torch_dtype=torch.float32).eval()
    batch = make_batch(batch=2, seq=10, vocab=256, left_pad=False)
    ours = engine.forward(batch, micro_batch_size=2)["raw_values"]
    with torch.no_grad():
        out = hf.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        theirs = hf.score(out).squeeze(-1)
    valid = batch["attention_mask"].bool()
    assert torch.allclose(ours[valid], theirs[valid], atol=1e-4)


def test_without_save_hf_nothing_is_written(tmp_path):
    role = tiny_role(save=str(tmp_path / "a"))
    engine = MegatronEngine(role, head="lm", trainable=False)
    save_engine(engine, role.megatron.save, 1)
    assert save_hf_copy(engine, role.megatron.save, 1) is None
    assert sorted(os.listdir(tmp_path / "a")) == ["iter_0000001", "latest_checkpointed_iteration.txt"]
