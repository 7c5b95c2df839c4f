"""hf <-> mcore converters and the Megatron checkpoint layout."""

import json
import os

import pytest
import torch

from cli import convert_ckpt
from mindspeed_rl.checkpoint import megatron_layout as ml
from mindspeed_rl.checkpoint.hf_io import HFReader
from mindspeed_rl.demo.tiny_hf import build_hf_model
from tests.helpers import tiny_model_config


def hf_tensors(folder):
    reader = HFReader(folder)
    return {k: reader.get(k) for k in reader.weight_map}


def to_mg(hf_dir, mg_dir, *extra):
    return convert_ckpt.main(
        [
            "--load-model-type",
            "hf",
            "--save-model-type",
            "mg",
            "--load-dir",
            hf_dir,
            "--save-dir",
            mg_dir,
            "--add-qkv-bias",
            *extra,
        ]
    )


def to_hf(mg_dir, hf_dir, *extra):
    return convert_ckpt.main(
        ["--load-model-type", "mg", "--save-model-type", "hf", "--load-dir", mg_dir, "--save-dir", hf_dir, *extra]
    )


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("hf"))
    build_hf_model(folder, tiny_model_config(num_layers=4), max_shard_size="150KB")
    return folder


@pytest.mark.parametrize(
    "tp,pp,layers", [(1, 1, None), (2, 1, None), (1, 2, "1,3"), (2, 2, "3,1"), (1, 2, "vpp1"), (2, 2, "vpp1")]
)
def test_hf_mg_hf_round_trip_is_bit_identical(hf_model, tmp_path, tp, pp, layers):
    """Also with an interleaved pipeline (vpp1: one layer per model chunk, rank 0 holding layers 0 and 2)."""
    assert os.path.isfile(os.path.join(hf_model, "model.safetensors.index.json"))  # sharded input
    extra = ["--target-tensor-parallel-size", str(tp), "--target-pipeline-parallel-size", str(pp)]
    if layers and layers.startswith("vpp"):
        extra += ["--num-layers-per-virtual-pipeline-stage", layers[3:]]
    elif layers:
        extra += ["--num-layer-list", layers]
    assert to_mg(hf_model, str(tmp_path / "mg"), *extra) == 0
    assert ml.read_tracker(str(tmp_path / "mg")) == "release"
    assert ml.layout_of(str(tmp_path / "mg" / "release")) == (tp, pp)
    stored = ml.load_rank(str(tmp_path / "mg"), 0, 0, expected=(tp, pp))["config"]
    assert stored.get("stage_layers") == ([[0, 2], [1, 3]] if layers == "vpp1" else None)
    out_cfg = tmp_path / "out"
    out_cfg.mkdir()
    (out_cfg / "config.json").write_text(open(os.path.join(hf_model, "config.json")).read())
    assert to_hf(str(tmp_path / "mg"), str(out_cfg), "--max-shard-size-gb", "0.0002") == 0
    got, want = hf_tensors(str(out_cfg / "mg2hf")), hf_tensors(hf_model)
    assert set(got) == set(want)
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert os.path.isfile(out_cfg / "mg2hf" / "model.safetensors.index.json")  # sharded output


def test_bin_input_and_bf16_equal_hf_cast(tmp_path):
    folder = str(tmp_path / "hfbin")
    hf = build_hf_model(folder, tiny_model_config(num_layers=2), safe_serialization=False)
    assert os.path.isfile(os.path.join(folder, "pytorch_model.bin"))
    assert to_mg(folder, str(tmp_path / "mg"), "--params-dtype", "bf16") == 0
    assert to_hf(str(tmp_path / "mg"), folder) == 0
    got = hf_tensors(os.path.join(folder, "mg2hf"))
    want = hf.to(torch.bfloat16).state_dict()
    assert all(got[k].dtype == torch.bfloat16 and torch.equal(got[k], want[k]) for k in want)
    config = json.load(open(os.path.join(folder, "mg2hf", "config.json")))
    assert config["architectures"] == ["Qwen2ForCausalLM"]


def test_orm_round_trip_keeps_the_score_head(tmp_path):
    folder = str(tmp_path / "rm")
    build_hf_model(folder, tiny_model_config(num_layers=2), orm=True)
    assert to_mg(folder, str(tmp_path / "mg"), "--orm") == 0
    shard = ml.load_rank(str(tmp_path / "mg"), 0, 0)
    assert shard["model"]["output_layer.weight"].shape == (1, 64)
    assert shard["config"]["orm"] is True
    assert to_hf(str(tmp_path / "mg"), folder) == 0
    got, want = hf_tensors(os.path.join(folder, "mg2hf")), hf_tensors(folder)
    assert set(got) == set(want) and "score.weight" in got
    assert all(torch.equal(got[k], want[k]) for k in want)
    config = json.load(open(os.path.join(folder, "mg2hf", "config.json")))
    assert config["architectures"] == ["Qwen2ForSequenceClassification"] and config["num_labels"] == 1


def test_orm_from_a_causal_lm_initialises_the_head(hf_model, tmp_path, caplog):
    with caplog.at_level("WARNING"):
        assert to_mg(hf_model, str(tmp_path / "critic"), "--orm") == 0
    assert "value head is initialised" in caplog.text
    head = ml.load_rank(str(tmp_path / "critic"), 0, 0)["model"]["output_layer.weight"]
    assert head.shape == (1, 64) and head.abs().sum() > 0


def test_converter_user_errors_exit_2(hf_model, tmp_path, capsys):
    assert to_mg(str(tmp_path / "nope"), str(tmp_path / "mg")) == 2
    assert to_mg(hf_model, str(tmp_path / "mg"), "--target-tensor-parallel-size", "3") == 2
    assert "does not divide" in capsys.readouterr().err
    assert to_mg(hf_model, str(tmp_path / "mg"), "--target-pipeline-parallel-size", "3") == 2
    assert "--num-layer-list" in capsys.readouterr().err
    assert to_hf(str(tmp_path / "empty"), str(tmp_path)) == 2
    (tmp_path / "empty").mkdir()
    assert to_hf(str(tmp_path / "empty"), hf_model) == 2
    assert "latest_checkpointed_iteration.txt" in capsys.readouterr().err


def test_layout_refuses_other_tp_pp_naming_both_and_the_fix(hf_model, tmp_path):
    assert to_mg(hf_model, str(tmp_path / "mg"), "--target-tensor-parallel-size", "2") == 0
    with pytest.raises(ml.CheckpointError) as err:
        ml.load_rank(str(tmp_path / "mg"), 0, 0, expected=(1, 2))
    text = str(err.value)
    assert "TP=2, PP=1" in text and "TP=1, PP=2" in text and "cli/convert_ckpt.py" in text
    # the suggested command works
    assert (
        convert_ckpt.main(
            [
                "--load-model-type",
                "mg",
                "--save-model-type",
                "mg",
                "--load-dir",
                str(tmp_path / "mg"),
                "--save-dir",
                str(tmp_path / "mg2"),
                "--target-tensor-parallel-size",
                "1",
                "--target-pipeline-parallel-size",
                "2",
            ]
        )
        == 0
    )
    a = ml.load_rank(str(tmp_path / "mg2"), 0, 1, expected=(1, 2))["model"]
    assert "decoder.layers.0.mlp.linear_fc1.weight" in a and "output_layer.weight" in a


def test_save_is_atomic_and_tracker_written_last(tmp_path):
    d = str(tmp_path / "ckpt")
    ml.begin_save(d, 10)
    ml.write_rank(d, 10, 0, 0, 1, {"model": {"w": torch.ones(2)}, "iteration": 10})
    assert ml.read_tracker(d) is None and not os.path.isdir(os.path.join(d, "iter_0000010"))
    ml.commit_save(d, 10, expected_files=1)
    assert ml.read_tracker(d) == 10 and ml.load_rank(d, 0, 0)["iteration"] == 10
    # an interrupted save of iteration 20 (one of two ranks written) is never published
    ml.begin_save(d, 20)
    ml.write_rank(d, 20, 0, 0, 1, {"model": {}, "iteration": 20})
    with pytest.raises(ml.CheckpointError, match="1 rank files written, 2 expected"):
        ml.commit_save(d, 20, expected_files=2)
    assert ml.read_tracker(d) == 10 and ml.list_iterations(d) == [10]
