"""hf -> mcore checks a HF folder's config.json against its tensors before anything is written: an impossible size,
or a tensor whose shape is not what the config makes it, exits 2 naming the key (and the tensor)."""

import json
import os

import pytest

from cli import convert_ckpt
from mindspeed_rl.checkpoint.convert import FamilyNames
from mindspeed_rl.checkpoint.hf_io import HFReader, read_hf_config, read_hf_model_config
from mindspeed_rl.checkpoint.shape_check import read_names, rule_for, tensor_rules
from mindspeed_rl.demo.tiny_hf import build_hf_model
from mindspeed_rl.families import get_family
from tests.helpers import skip_unless_transformers_builds
from tests.helpers import tiny_family_model as tiny


def hf_folder(tmp_path, family, **changes):
    """A tiny HF model of ``family`` whose config.json then gets ``changes`` (None: the key removed)."""
    skip_unless_transformers_builds(family)
    folder = tmp_path / "hf"
    build_hf_model(str(folder), tiny(family), seed=0)
    config = json.loads((folder / "config.json").read_text())
    section = config.get("text_config", config)
    for key, value in changes.items():
        section.pop(key) if value is None else section.__setitem__(key, value)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def to_mg(hf_dir, mg_dir):
    argv = ["--load-model-type", "hf", "--save-model-type", "mg", "--load-dir", hf_dir, "--save-dir", mg_dir]
    return convert_ckpt.main(argv)


def refusal(tmp_path, capsys, family, **changes):
    """The one-line error of converting the changed folder; nothing written."""
    folder = hf_folder(tmp_path, family, **changes)
    capsys.readouterr()
    assert to_mg(folder, str(tmp_path / "mg")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert not os.path.exists(tmp_path / "mg")
    return err[0]


@pytest.mark.parametrize(
    "family,changes,key,tensor",
    [
        ("qwen3", {"hidden_size": 128}, "hidden_size = 128", "model.embed_tokens.weight"),
        ("qwen3", {"vocab_size": 300}, "vocab_size = 300", "model.embed_tokens.weight"),
        ("qwen3", {"intermediate_size": 384}, "intermediate_size = 384", "model.layers.0.mlp.down_proj.weight"),
        ("qwen3", {"num_key_value_heads": 4}, "num_key_value_heads x head_dim = 256", "self_attn.k_proj.weight"),
        ("qwen3", {"head_dim": 32}, "num_attention_heads x head_dim = 128", "self_attn.o_proj.weight"),
        ("qwen3", {"num_hidden_layers": 1}, "num_hidden_layers = 1", "model.layers.1."),
        ("qwen3_moe", {"moe_intermediate_size": 96}, "moe_intermediate_size = 96", "mlp.experts.0.down_proj.weight"),
        ("qwen3_moe", {"num_experts": 8}, "num_experts = 8", "model.layers.0.mlp.gate.weight"),
        ("deepseek_v3", {"kv_lora_rank": 256}, "kv_lora_rank + qk_rope_head_dim", "self_attn.kv_a_proj_with_mqa"),
        ("qwen3_next", {"linear_num_value_heads": 8}, "linear_num_value_heads", "linear_attn.in_proj_qkvz.weight"),
    ],
)
def test_a_config_that_disagrees_with_the_tensors_exits_2_naming_key_and_tensor(
    family, changes, key, tensor, tmp_path, capsys
):
    err = refusal(tmp_path, capsys, family, **changes)
    assert key in err and tensor in err and "disagrees with tensor" in err, err


@pytest.mark.parametrize(
    "changes,key",
    [
        ({"num_attention_heads": 0}, "num_attention_heads is 0"),
        ({"hidden_size": -256}, "hidden_size is -256"),
        ({"intermediate_size": "512"}, "intermediate_size is '512'"),
        ({"num_key_value_heads": 3}, "num_key_value_heads 3 does not divide num_attention_heads 4"),
        ({"head_dim": None, "num_attention_heads": 3}, "num_attention_heads 3 does not divide hidden_size 256"),
    ],
)
def test_an_impossible_size_exits_2_naming_the_key(changes, key, tmp_path, capsys):
    assert key in refusal(tmp_path, capsys, "qwen3", **changes)


def test_a_moe_config_without_experts_is_impossible(tmp_path, capsys):
    assert "num_experts is 0" in refusal(tmp_path, capsys, "qwen3_moe", num_experts=0)


@pytest.mark.parametrize(
    "family",
    ["qwen25", "qwen3", "llama3", "qwen3_moe", "deepseek_v3", "qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_vl"],
)
def test_every_tensor_the_converter_reads_has_its_shape_checked(family, tmp_path):
    folder = hf_folder(tmp_path, family)
    cfg = read_hf_model_config(folder)
    raw = HFReader(folder)
    reader, shapes = FamilyNames(raw, get_family(family)), raw.shapes()
    rules = tensor_rules(cfg, read_hf_config(folder))
    names = read_names(get_family(family), cfg, lambda n: reader.stored(n) in shapes, orm=False)
    assert len(names) > 10 and [n for n in names if rule_for(n, rules) is None] == []
    read = {reader.stored(n) for n in names}
    assert [n for n in shapes if n not in read and "visual." not in n] == []  # the rest is the vision tower
