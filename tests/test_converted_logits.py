"""After hf -> mcore conversion, megatron at TP=2 and PP=2 reproduces HF's logits (and ORM scores)."""

import pytest
import torch

from cli import convert_ckpt
from mindspeed_rl.demo.tiny_hf import build_hf_model
from mindspeed_rl.models.heads import last_token_values
from tests import parallel_worker
from tests.helpers import make_batch, tiny_model_config

LAYOUTS = [dict(name="tp2", tp=2, pp=1, world=2), dict(name="pp2", tp=1, pp=2, world=2)]


@pytest.mark.slow
def test_converted_megatron_matches_hf_at_tp2_and_pp2(tmp_path):
    model = tiny_model_config(num_layers=4)
    lm = build_hf_model(str(tmp_path / "hf_lm"), model, seed=1)
    rm = build_hf_model(str(tmp_path / "hf_rm"), model, seed=2, orm=True)
    batch = make_batch(4, 16, vocab=model.padded_vocab_size, seed=7, left_pad=False)
    torch.save(batch, tmp_path / "batch.pt")
    for spec in LAYOUTS:
        for kind, folder in (("lm", "hf_lm"), ("value", "hf_rm")):
            args = [
                "--load-model-type",
                "hf",
                "--save-model-type",
                "mg",
                "--load-dir",
                str(tmp_path / folder),
                "--save-dir",
                str(tmp_path / f"mg_{kind}_{spec['name']}"),
                "--add-qkv-bias",
                "--target-tensor-parallel-size",
                str(spec["tp"]),
                "--target-pipeline-parallel-size",
                str(spec["pp"]),
            ] + (["--orm"] if kind == "value" else [])
            assert convert_ckpt.main(args) == 0
    parallel_worker.spawn_layouts("run_converted", LAYOUTS, tmp_path)  # both layouts in one spawn
    with torch.no_grad():
        hf_logits = lm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        hf_scores = rm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.squeeze(-1)
    real = batch["attention_mask"].bool()
    for spec in LAYOUTS:
        got = torch.load(tmp_path / f"converted_{spec['name']}.pt")
        diff = (got["lm"]["logits"] - hf_logits)[real].abs().max().item()
        assert diff <= 1e-5, f"{spec['name']}: logits differ by {diff}"
        scores = last_token_values(got["value"]["raw_values"], batch["attention_mask"])
        assert (scores - hf_scores).abs().max().item() <= 1e-5, spec["name"]


@pytest.mark.slow
def test_reward_worker_scores_equal_hf_sequence_classification(tmp_path):
    model = tiny_model_config(num_layers=2)
    rm = build_hf_model(str(tmp_path / "hf_rm"), model, seed=4, orm=True)
    assert (
        convert_ckpt.main(
            [
                "--load-model-type",
                "hf",
                "--save-model-type",
                "mg",
                "--load-dir",
                str(tmp_path / "hf_rm"),
                "--save-dir",
                str(tmp_path / "rm_mg"),
                "--add-qkv-bias",
                "--orm",
            ]
        )
        == 0
    )
    batch = make_batch(4, 12, vocab=model.padded_vocab_size, seed=2, left_pad=False)
    torch.save(batch, tmp_path / "batch.pt")
    parallel_worker.spawn("run_reward_worker", 1, {}, tmp_path)
    with torch.no_grad():
        want = rm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.squeeze(-1)
    assert (torch.load(tmp_path / "rm_scores.pt") - want).abs().max().item() <= 1e-5
