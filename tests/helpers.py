"""Small builders shared by tests."""

import os
import pathlib
import time
from typing import Iterator, Optional, Sequence

from mindspeed_rl.config_cls import ModelConfig
from tests.conftest import ROOT


def source_files(tops: Sequence[str], outside: pathlib.Path) -> Iterator[pathlib.Path]:
    """The .py files under the repository folders ``tops``, except those inside ``outside`` (for AST floors)."""
    for top in tops:
        for path in sorted((pathlib.Path(ROOT) / top).rglob("*.py")):
            if outside not in path.parents:
                yield path


def tiny_model_config(**overrides) -> ModelConfig:
    values = dict(
        num_layers=2,
        hidden_size=64,
        ffn_hidden_size=160,
        num_attention_heads=4,
        max_position_embeddings=256,
        padded_vocab_size=256,
        group_query_attention=True,
        num_query_groups=2,
        add_qkv_bias=True,
        untie_embeddings_and_output_weights=True,
        rotary_base=10000.0,
        norm_epsilon=1e-6,
    )
    values.update(overrides)
    cfg = ModelConfig(**values)
    cfg.check()
    return cfg


def tiny_family_model(family: str, **overrides) -> ModelConfig:
    """A family's tiny model yaml (configs/model/tiny_<family>.yaml), read as the trainer reads it."""
    from mindspeed_rl.config_cls.ppo_config import model_section_data
    from mindspeed_rl.trainer.startup.config_names import build_checked_model

    name = f"tiny_{family}"
    data = {**model_section_data(name, {}, os.path.join(ROOT, "configs"), "model"), **overrides}
    return build_checked_model(data, f"model.{name}")


def skip_unless_transformers_builds(family: str) -> None:
    """Skip the calling test where the installed transformers has no model of the family's HF type (the maintained
    NPU set's transformers 4.57 predates Qwen3.5)."""
    import pytest
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    from mindspeed_rl.families import get_family

    model_type = get_family(family).hf_model_types[0]
    if model_type not in CONFIG_MAPPING_NAMES:
        pytest.skip(f"this transformers has no {model_type!r} model")


def tiny_role(name: str = "actor", tp: int = 1, pp: int = 1, num_devices: int = 1, model=None, **megatron):
    from mindspeed_rl.config_cls import MegatronConfig, RoleConfig

    values = dict(
        model="tiny",
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        lr=1e-3,
        weight_decay=0.0,
        clip_grad=1.0,
        seed=1,
    )
    values.update(megatron)
    return RoleConfig(
        name=name, megatron=MegatronConfig(**values), model=model or tiny_model_config(), num_devices=num_devices
    )


def make_batch(batch: int = 4, seq: int = 20, vocab: int = 256, seed: int = 0, left_pad: bool = True):
    """Left-padded prompts followed by responses, as rollouts produce them."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    for b in range(batch):
        pad = (b * 3) % 5 if left_pad else 0
        mask[b, :pad] = 0
        ids[b, :pad] = 0
        tail = (b * 2) % 4
        if tail:
            mask[b, seq - tail :] = 0
            ids[b, seq - tail :] = 0
    return {"input_ids": ids, "attention_mask": mask}


def sft_loss(outputs, mb):
    """Mean negative log-likelihood over real next tokens of the micro-batch."""
    mask = mb["attention_mask"][:, 1:].float() * mb["attention_mask"][:, :-1].float()
    nll = -(outputs["log_probs"][:, 1:] * mask).sum() / mask.sum().clamp(min=1)
    return nll, {}


def random_full_weights(model, seed: int = 0, scale: float = 0.05):
    """Random full (TP=1, PP=1) megatron weights for ``model``, with non-trivial norms and biases."""
    import torch

    torch.manual_seed(seed)
    h, f, v = model.hidden_size, model.ffn_hidden_size, model.padded_vocab_size
    qkv = (model.num_attention_heads + 2 * model.kv_heads) * model.head_dim
    full = {
        "embedding.word_embeddings.weight": torch.randn(v, h) * 2 * scale,
        "decoder.final_layernorm.weight": 1 + 0.1 * torch.randn(h),
        "output_layer.weight": torch.randn(v, h) * 2 * scale,
    }
    for i in range(model.num_layers):
        p = f"decoder.layers.{i}."
        full.update(
            {
                p + "input_layernorm.weight": 1 + 0.1 * torch.randn(h),
                p + "self_attention.linear_qkv.weight": torch.randn(qkv, h) * scale,
                p + "self_attention.linear_qkv.bias": torch.randn(qkv) * scale,
                p + "self_attention.linear_proj.weight": torch.randn(h, h) * scale,
                p + "pre_mlp_layernorm.weight": 1 + 0.1 * torch.randn(h),
                p + "mlp.linear_fc1.weight": torch.randn(2 * f, h) * scale,
                p + "mlp.linear_fc2.weight": torch.randn(h, f) * scale,
            }
        )
    return full


def demo_config(name: str, root: str, paths: dict, iterations: int, **extra):
    """A demo config (ppo_tiny_cpu, ppo_tiny_cpu_x4, distill_tiny_cpu) on the assets of ``demo.assets.prepare``,
    with its logs and checkpoints under ``root``; ``extra``: more key=value overrides."""
    from mindspeed_rl.features import load_ppo_config

    given = load_ppo_config(name)
    validates = given.actor.megatron.test_data_path is not None  # the demo's held-out set
    overrides = [
        f"megatron_training.tokenizer_name_or_path={paths['tokenizer']}",
        f"megatron_training.data_path={paths['data_prefix']}",
        f"rl_config.log_dir={root}/logs",
        f"megatron_training.train_iters={iterations}",
        f"actor_config.save={root}/ckpt/actor",
    ] + [f"{k}={v}" for k, v in extra.items()]
    if "critic_config" in given.raw:
        overrides.append(f"critic_config.save={root}/ckpt/critic")
    if validates:
        overrides.append(f"megatron_training.test_data_path={paths['test_prefix']}")
    return load_ppo_config(name, overrides)


def checkpoints_up_to(source: str, target: str, last: int, tracker: Optional[int] = None) -> None:
    """What a run stopped after iteration ``last`` leaves in ``target``: ``source``'s checkpoint folders up to
    ``last`` (its iterations after it left out) and the tracker at ``last`` (or at ``tracker``: a save that the
    stop cut short)."""
    import shutil

    from mindspeed_rl.checkpoint import megatron_layout as ml

    def later(folder, names):
        return [n for n in names if n.startswith("iter_") and int(n[5:12]) > last]

    shutil.copytree(source, target, ignore=later)
    with open(os.path.join(target, ml.TRACKER), "w") as fh:
        fh.write(f"{last if tracker is None else tracker}\n")


def single_process_world_fixture(seed: int = 11):
    """A module-scoped, autouse fixture: a one-rank torch.distributed world with megatron's model-parallel
    state (TP = PP = 1), destroyed after the module."""
    import pytest

    @pytest.fixture(scope="module", autouse=True)
    def single_process_world():
        from mindspeed_rl.utils import dist

        dist.init_distributed()
        dist.init_model_parallel(seed=seed)
        yield
        dist.destroy()

    return single_process_world


def assert_refused(argv, key: str, text: str, capsys) -> None:
    """``cli/train_ppo.py argv`` exits 2 with one message naming ``key`` and saying ``text``, no traceback."""
    from cli import train_ppo

    assert train_ppo.main(argv) == 2
    err = capsys.readouterr().err
    assert key in err and text in err and "Traceback" not in err, err


def wait_for(proc, text, timeout=240):
    """Read ``proc``'s output until a line holds ``text``; the lines read so far."""
    seen = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        if text in line:
            return seen
    raise AssertionError(f"{text!r} never appeared:\n" + "".join(seen[-40:]))


def hf_vl_logits(hf_model, ids, mask, pixels, grids, image_token: int):
    """transformers' own logits of a vision-language model on rows with images (the reference of the parity tests)."""
    return hf_model(
        input_ids=ids,
        attention_mask=mask,
        pixel_values=pixels,
        image_grid_thw=grids,
        mm_token_type_ids=(ids == image_token).int(),
    ).logits
