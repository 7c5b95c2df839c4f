"""Model families: the registry, hf <-> mcore per family (bit-identical round trips at TP / PP / EP), and,
per family at a parallel layout, HF logits == Megatron's and vLLM greedy == HF greedy after in-place
resharding; for Qwen3-MoE also one training step at EP 2 equal to EP 1."""

import glob
import json
import os

import pytest
import torch

from cli import convert_ckpt
from mindspeed_rl.accelerator.cpu import CpuAccelerator
from mindspeed_rl.checkpoint.convert import hf_to_mg, mg_to_hf
from mindspeed_rl.checkpoint.errors import ConversionError
from mindspeed_rl.checkpoint.hf_io import HFReader, read_hf_model_config
from mindspeed_rl.checkpoint.megatron_reader import read_mg_config
from mindspeed_rl.compat.megatron_core import gated_delta_net_unavailable
from mindspeed_rl.config_cls import ConfigError
from mindspeed_rl.config_cls.model_config import FAMILY_NAMES
from mindspeed_rl.datasets.templates import load_templates
from mindspeed_rl.demo.tiny_hf import build_hf_model
from mindspeed_rl.families import FAMILIES, FamilyError, family_names, get_family, resolve_family
from mindspeed_rl.families.fused_experts import FusedExperts
from mindspeed_rl.families.parameters import parameter_count
from tests import parallel_worker
from tests.helpers import make_batch, skip_unless_transformers_builds
from tests.helpers import tiny_family_model as tiny


def test_registry_names_match_the_config_choices_and_templates_exist():
    assert set(family_names()) == set(FAMILY_NAMES)
    templates = load_templates()
    for family in FAMILIES.values():
        assert family.chat_template in templates, family.name
    assert get_family("llama2") is FAMILIES["llama3"] and get_family("qwen2") is FAMILIES["qwen25"]
    with pytest.raises(FamilyError, match="unknown model family 'gpt2'"):
        get_family("gpt2")


def test_family_checks_name_the_key():
    with pytest.raises(ConfigError, match="qk_layernorm"):
        tiny("qwen3", qk_layernorm=False)
    with pytest.raises(ConfigError, match="num_experts"):
        tiny("qwen3", num_experts=4, moe_ffn_hidden_size=32)
    with pytest.raises(ConfigError, match="moe_router_topk"):
        tiny("qwen3_moe", moe_router_topk=8)


@pytest.mark.parametrize(
    "family", ["qwen25", "qwen3", "llama3", "qwen3_moe", "deepseek_v3", "qwen3_next", "qwen3_5", "qwen3_5_moe"]
)
def test_hf_config_read_back_gives_the_same_model_section(family, tmp_path):
    skip_unless_transformers_builds(family)
    model = tiny(family)
    build_hf_model(str(tmp_path), model, seed=0)
    hf = json.load(open(tmp_path / "config.json"))
    assert resolve_family(hf, None) is get_family(family)
    back = read_hf_model_config(str(tmp_path))
    for key in (
        "qk_layernorm",
        "add_qkv_bias",
        "num_experts",
        "moe_router_topk",
        "moe_ffn_hidden_size",
        "rope_scaling_type",
        "rope_scaling_factor",
        "rope_scaling_original_max_position_embeddings",
        "head_dim",
        "kv_heads",
        "untie_embeddings_and_output_weights",
        "multi_latent_attention",
        "q_lora_rank",
        "kv_lora_rank",
        "qk_head_dim",
        "qk_pos_emb_head_dim",
        "v_head_dim",
        "first_k_dense_replace",
        "n_shared_experts",
        "moe_router_score_function",
        "moe_router_enable_expert_bias",
        "moe_router_num_groups",
        "moe_router_group_topk",
        "moe_router_topk_scaling_factor",
        "beta_fast",
        "rope_scaling_mscale_all_dim",
        "rotary_percent",
        "attention_output_gate",
        "layernorm_zero_centered_gamma",
        "linear_attention_freq",
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_conv_kernel_dim",
        "moe_shared_expert_intermediate_size",
        "moe_shared_expert_gate",
    ):
        assert getattr(back, key) == getattr(model, key), key
    # the parameter count (the dry-run plan's) is the HF model's own, buffers such as the expert bias included
    hf_model = build_hf_model(str(tmp_path / "again"), model, seed=0)
    stored = sum(t.numel() for t in hf_model.state_dict().values())
    assert parameter_count(model) == stored


def test_llama3_rope_scaling_is_read_and_written(tmp_path):
    model = tiny("llama3")
    hf = get_family("llama3").hf_config(model, 0, 0)
    assert hf["rope_scaling"] == {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 128,
    }
    with pytest.raises(FamilyError, match="yarn"):
        get_family("llama3").model_config_from_hf({**hf, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})


def test_a_flag_that_contradicts_config_json_is_refused_naming_both(tmp_path, capsys):
    build_hf_model(str(tmp_path / "hf"), tiny("qwen3"), seed=0)
    args = [
        "--load-model-type",
        "hf",
        "--save-model-type",
        "mg",
        "--load-dir",
        str(tmp_path / "hf"),
        "--save-dir",
        str(tmp_path / "mg"),
    ]
    assert convert_ckpt.main(args + ["--model-type-hf", "qwen25"]) == 2
    err = capsys.readouterr().err
    assert "--model-type-hf qwen25" in err and "qwen3" in err and "config.json" in err and "Traceback" not in err
    assert convert_ckpt.main(args + ["--add-qkv-bias"]) == 2
    assert "--add-qkv-bias contradicts" in capsys.readouterr().err
    assert convert_ckpt.main(args + ["--target-expert-parallel-size", "2"]) == 2
    assert "dense" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "mg" / "latest_checkpointed_iteration.txt")
    assert convert_ckpt.main(args + ["--model-type-hf", "qwen3"]) == 0
    # MindSpeed-LLM's Qwen2.5 scripts say "llama2 --add-qkv-bias" for a Qwen2 folder
    build_hf_model(str(tmp_path / "qwen2"), tiny("qwen25"), seed=0)
    assert (
        convert_ckpt.main(
            [
                "--load-model-type",
                "hf",
                "--save-model-type",
                "mg",
                "--load-dir",
                str(tmp_path / "qwen2"),
                "--save-dir",
                str(tmp_path / "mg2"),
                "--model-type-hf",
                "llama2",
                "--add-qkv-bias",
            ]
        )
        == 0
    )
    assert read_mg_config(str(tmp_path / "mg2"))[0]["model"]["model_type_hf"] == "qwen25"


ROUND_TRIPS = [
    ("qwen3", 2, 1, 1),
    ("qwen3", 1, 2, 1),
    ("llama3", 2, 2, 1),
    ("qwen3_moe", 1, 1, 2),
    ("qwen3_moe", 2, 1, 2),
    ("qwen3_moe", 1, 2, 4),
    ("deepseek_v3", 2, 1, 2),
    ("deepseek_v3", 1, 3, 4),
    ("qwen3_next", 2, 1, 2),
    ("qwen3_next", 1, 2, 1),
    ("qwen3_5", 2, 2, 1),
    ("qwen3_5_moe", 2, 1, 2),
]


@pytest.mark.parametrize("family,tp,pp,ep", ROUND_TRIPS)
def test_hf_mg_hf_round_trip_is_bit_identical(family, tp, pp, ep, tmp_path):
    skip_unless_transformers_builds(family)
    build_hf_model(str(tmp_path / "hf"), tiny(family), seed=3)
    hf_to_mg(str(tmp_path / "hf"), str(tmp_path / "mg"), tp=tp, pp=pp, ep=ep)
    files = sorted(os.listdir(tmp_path / "mg" / "release"))
    assert len(files) == tp * pp * ep, files
    if ep > 1:  # each EP rank holds its own experts, numbered locally; Megatron's folder names
        assert files[-1] == (
            f"mp_rank_{tp - 1:02d}_{ep - 1:03d}" if pp == 1 else f"mp_rank_{tp - 1:02d}_{pp - 1:03d}_{ep - 1:03d}"
        )
        assert read_mg_config(str(tmp_path / "mg"))[2:] == (tp, pp)
        last = torch.load(tmp_path / "mg" / "release" / files[-1] / "model_optim_rng.pt", weights_only=True)
        experts = {n.split("local_experts.")[1].split(".")[0] for n in last["model"] if "local_experts" in n}
        assert experts == {str(e) for e in range(tiny(family).num_experts // ep)}
    mg_to_hf(str(tmp_path / "mg"), str(tmp_path / "hf"))
    if isinstance(get_family(family), FusedExperts):  # written fused as the Hub stores them: compared per expert
        assert_same_layers(tmp_path / "hf", tmp_path / "hf" / "mg2hf", tiny(family))
        return
    before, after = HFReader(str(tmp_path / "hf")), HFReader(str(tmp_path / "hf" / "mg2hf"))
    # transformers 5.5 saves Qwen3_5ForCausalLM under the vision-language model's "model.language_model." (5.19:
    # "model."); we write "model.", which both read
    spelled = {name.replace("model.language_model.", "model.", 1): name for name in before.weight_map}
    assert set(spelled) == set(after.weight_map)
    for name, stored in spelled.items():
        assert torch.equal(before.get(stored), after.get(name)), name
    assert json.load(open(tmp_path / "hf" / "mg2hf" / "config.json"))["architectures"] == [
        get_family(family).architecture
    ]


def assert_same_layers(before_dir, after_dir, cfg):
    """Two HF folders hold the same tensors, read per layer as the converter reads them (fused experts split)."""
    from mindspeed_rl.checkpoint.convert import FamilyNames
    from mindspeed_rl.families.base import EMBED, FINAL_NORM

    family = get_family(cfg.model_type_hf)
    before, after = (FamilyNames(HFReader(str(d)), family) for d in (before_dir, after_dir))
    for name in (EMBED[0], FINAL_NORM[0], "lm_head.weight"):
        assert torch.equal(before.get(name), after.get(name)), name
    for i in range(cfg.num_layers):
        want, got = family.read_hf_layer(i, cfg, before), family.read_hf_layer(i, cfg, after)
        assert want.keys() == got.keys() and all(torch.equal(want[n], got[n]) for n in want), i


def test_expert_parallel_reshard_and_refusals(tmp_path):
    build_hf_model(str(tmp_path / "hf"), tiny("qwen3_moe"), seed=3)
    hf_to_mg(str(tmp_path / "hf"), str(tmp_path / "ep2"), ep=2)
    convert_ckpt.main(
        [
            "--load-model-type",
            "mg",
            "--save-model-type",
            "mg",
            "--load-dir",
            str(tmp_path / "ep2"),
            "--save-dir",
            str(tmp_path / "ep4tp2"),
            "--target-expert-parallel-size",
            "4",
            "--target-tensor-parallel-size",
            "2",
        ]
    )
    mg_to_hf(str(tmp_path / "ep4tp2"), str(tmp_path / "hf"))
    before, after = HFReader(str(tmp_path / "hf")), HFReader(str(tmp_path / "hf" / "mg2hf"))
    assert all(torch.equal(before.get(n), after.get(n)) for n in before.weight_map)
    with pytest.raises(ConversionError, match="does not divide the 4 experts"):
        hf_to_mg(str(tmp_path / "hf"), str(tmp_path / "bad"), ep=3)


LAYOUTS = [
    dict(name="qwen3_tp2", family="qwen3", tp=2, pp=1, world=2),
    dict(name="llama3_pp2", family="llama3", tp=1, pp=2, world=2),
    # training EP 2 -> rollout TP 1 x DP 2 x EP 2: two engines whose MoE layers run together, each rank given only
    # its own experts at the update; and rollout TP 2 x EP 2 (one engine's experts split over its TP ranks)
    dict(name="qwen3_moe_ep2", family="qwen3_moe", tp=1, pp=1, ep=2, world=2, train=True, infer=dict(dp=2, ep=2)),
    dict(name="qwen3_moe_ep1", family="qwen3_moe", tp=1, pp=1, ep=1, world=1, train=True),
    dict(name="qwen3_moe_infer_tp2_ep2", family="qwen3_moe", tp=1, pp=1, ep=1, world=2, infer=dict(tp=2, ep=2)),
    # MLA split over TP 2 (vLLM's CPU MLA runs bf16 only: its rollout is the GRPO run's below)
    dict(name="deepseek_v3_tp2", family="deepseek_v3", tp=2, pp=1, world=2, rollout=False),
    # Gated DeltaNet's key-head groups split over TP 2 (vLLM's CPU Gated DeltaNet runs bf16 only: the GRPO run below)
    dict(name="qwen3_next_tp2", family="qwen3_next", tp=2, pp=1, world=2, rollout=False),
    # the dense layer and one MoE layer on stage 0, the other MoE layer on stage 1
    dict(
        name="deepseek_v3_pp2",
        family="deepseek_v3",
        tp=1,
        pp=2,
        world=2,
        rollout=False,
        num_layer_list="2,1",
        train=True,
    ),
]


@pytest.mark.slow
def test_each_family_matches_hf_after_conversion_and_in_place_resharding(tmp_path):
    from transformers import AutoModelForCausalLM

    batch = make_batch(4, 16, vocab=256, seed=7, left_pad=False)
    prompts = [[5, 6, 7, 8, 9], [17, 3, 99, 4], [200, 201, 13]]
    torch.save(batch, tmp_path / "batch.pt")
    torch.save(prompts, tmp_path / "prompts.pt")
    for spec in LAYOUTS:
        hf_dir = tmp_path / f"hf_{spec['family']}"
        if not hf_dir.exists():
            build_hf_model(str(hf_dir), tiny(spec["family"]), seed=11)
        assert (
            convert_ckpt.main(
                [
                    "--load-model-type",
                    "hf",
                    "--save-model-type",
                    "mg",
                    "--load-dir",
                    str(hf_dir),
                    "--save-dir",
                    str(tmp_path / f"mg_{spec['name']}"),
                    "--target-tensor-parallel-size",
                    str(spec["tp"]),
                    "--target-pipeline-parallel-size",
                    str(spec["pp"]),
                    "--target-expert-parallel-size",
                    str(spec.get("ep", 1)),
                ]
                + (["--num-layer-list", spec["num_layer_list"]] if "num_layer_list" in spec else [])
            )
            == 0
        )
    layouts = [spec for spec in LAYOUTS if not (spec["family"] == "qwen3_next" and gated_delta_net_unavailable())]
    no_rollout_ep = CpuAccelerator.vllm_expert_parallel_unavailable()  # the NPU sets' vLLM releases on CPU
    print("rollout expert parallelism:", no_rollout_ep or "runs")  # shown with -s
    if no_rollout_ep:
        layouts = [{**spec, "infer": {}} for spec in layouts if spec["name"] != "qwen3_moe_infer_tp2_ep2"]
    parallel_worker.spawn_layouts("run_family", layouts, tmp_path)  # one spawn per world size
    real = batch["attention_mask"].bool()
    for spec in layouts:
        hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / f"hf_{spec['family']}"), dtype=torch.float32).eval()
        got = torch.load(tmp_path / f"family_{spec['name']}.pt", weights_only=False)
        with torch.no_grad():
            want = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            greedy = [
                hf.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)[
                    0, len(p) :
                ].tolist()
                for p in prompts
            ]
        diff = (got["logits"] - want)[real].abs().max().item()
        print(spec["name"], "largest logit difference from transformers (fp32):", diff)  # shown with -s
        assert diff <= 2e-5, f"{spec['name']}: logits differ by {diff}"
        assert spec.get("rollout") is False or got["greedy"] == greedy, spec["name"]
        if spec["family"] == "qwen3_moe" and parallel_worker.route_replay_available():
            # router replay: vLLM's routes are the training forward's own (fp32)
            compared = sum(len(p) + len(g) - 1 for p, g in zip(prompts, greedy))  # the last token: no route
            assert got["route_counts"] == [[1, 0, compared], [2, 0, compared]], (spec["name"], got["route_counts"])
            # a rollout forced onto the runner-up experts: without replay training disagrees with it everywhere
            # (the routes and so the log-probs); replayed, the log-probs agree as a dense model's do (fp32 ~1e-6)
            forced = got["forced"]
            print(spec["name"], "routes forced onto the runners-up:", forced)  # shown with -s
            assert all(differ > 0.9 * tokens for _, differ, tokens in forced["counts"]), forced
            assert forced["own"] > 0.1 and forced["replayed"] < 1e-4, forced
    # DeepSeek-V3 trains at PP 2 with the expert bias frozen (moe_router_bias_update_rate 0) and saved with the weights
    deepseek = torch.load(tmp_path / "family_deepseek_v3_pp2.pt", weights_only=False)
    assert torch.isfinite(torch.tensor(deepseek["loss"])) and deepseek["reload_equal"]
    assert deepseek["ckpt_files"] == ["mp_rank_00_000", "mp_rank_00_001"]
    bias = HFReader(str(tmp_path / "hf_deepseek_v3")).get("model.layers.2.mlp.gate.e_score_correction_bias")
    assert torch.equal(deepseek["weights"]["decoder.layers.2.mlp.router.expert_bias"], bias)
    shared = deepseek["weights"]["decoder.layers.2.mlp.shared_experts.linear_fc2.weight"]  # every token's
    before = HFReader(str(tmp_path / "hf_deepseek_v3")).get("model.layers.2.mlp.shared_experts.down_proj.weight")
    assert shared.shape == before.shape and (shared - before).abs().max() > 1e-6
    ep2, ep1 = (torch.load(tmp_path / f"family_qwen3_moe_ep{e}.pt", weights_only=False) for e in (2, 1))
    if not no_rollout_ep:  # at rollout EP 2 each rank is sent the non-expert weights and half the experts (fp32)
        from mindspeed_rl.features.rollout_experts import expert_bytes_per_rank

        half = expert_bytes_per_rank(tiny("qwen3_moe"), 2, "float32")
        assert ep1["update_bytes"] - ep2["update_bytes"] == half > 0, (ep1["update_bytes"], ep2["update_bytes"])
    assert abs(ep2["loss"] - ep1["loss"]) <= 1e-6 and abs(ep2["grad_norm"] - ep1["grad_norm"]) <= 1e-5
    assert ep2["weights"].keys() == ep1["weights"].keys()
    moved = 0
    # EP 2 sums the gradients in another order than EP 1 (two data-parallel halves): up to 1.5e-6 measured
    # (megatron-core 0.12, and 0.16 on AMX Xeons), 4.6e-6 (0.16 on an AVX2-only AMD EPYC, fp32 products through
    # oneDNN); Adam's first step moves a weight by about lr (1e-4), so a wrong gather or reduction moves some by 1e-4
    # or more
    tolerance = 1e-5
    for name, tensor in ep1["weights"].items():
        assert (ep2["weights"][name] - tensor).abs().max().item() <= tolerance, name
        moved += "local_experts" in name
    assert moved == 2 * 4 * 2  # every expert's fc1 and fc2 in both layers, gathered from both EP ranks
    # a training checkpoint at EP 2: one file per EP rank (Megatron's names), and it loads back exactly
    assert ep2["ckpt_files"] == ["mp_rank_00_000", "mp_rank_00_001"] and ep2["reload_equal"]
    assert ep1["ckpt_files"] == ["mp_rank_00"] and ep1["reload_equal"]


# The MoE families whose training differs: DeepSeek-V3 (MLA, sigmoid routing with the bias, shared experts) and
# Qwen3-Next (Gated DeltaNet, gated attention; Qwen3-MoE's softmax router, whose EP 2 training step and vLLM routes
# the parity layouts above check, plus a gated shared expert). Dense families differ in the forward only (checked
# above at TP 2 / PP 2); a training run each costs ~12-25 s of CI.
TRAINED_FAMILIES = ["deepseek_v3", "qwen3_next"]


@pytest.mark.slow
def test_two_grpo_iterations_per_family(tmp_path, demo_assets):
    """The demo's GRPO (actor + rule reward, vLLM rollout) for 2 iterations on a family's tiny model with the
    actor at EP 2 and router replay, saving the actor in HF form at the end: it loads with transformers as that
    family. (The critic's engine is the actor's with a value head: test_ppo_e2e trains it.)"""
    from transformers import AutoConfig

    from mindspeed_rl.trainer.launch import train
    from tests.helpers import demo_config

    paths = demo_assets
    replay = parallel_worker.route_replay_available()
    results = {}
    # a family vLLM's CPU build cannot run here (DeepSeek-V3's MLA before vLLM 0.32) would roll out through the
    # megatron-core fallback, which holds all experts and so does not run at actor EP 2
    from mindspeed_rl.rollout.engines.vllm_engine import vllm_unusable_reason

    unusable = {f: vllm_unusable_reason(tiny(f), None, "cpu") for f in TRAINED_FAMILIES}
    if gated_delta_net_unavailable():  # megatron-core 0.12 (the NPU set's) cannot build Qwen3-Next's layers
        unusable["qwen3_next"] = gated_delta_net_unavailable()
    print("not run on this stack:", {f: why for f, why in unusable.items() if why})  # shown with -s
    # the rollout's experts split too (where this vLLM can): DeepSeek-V3 over two engines' ranks (TP 1 x DP 2),
    # Qwen3-Next over one engine's TP 2
    rollout_ep = {
        "deepseek_v3": {"generate_config.infer_expert_parallel_size": 2, "generate_config.infer_data_parallel_size": 2},
        "qwen3_next": {
            "generate_config.infer_expert_parallel_size": 2,
            "generate_config.infer_tensor_parallel_size": 2,
        },
    }
    if CpuAccelerator.vllm_expert_parallel_unavailable():
        rollout_ep = {}
    for family in [f for f in TRAINED_FAMILIES if not unusable[f]]:
        name = f"tiny_{family}"
        root = str(tmp_path / family)
        cfg = demo_config(
            "grpo_tiny_cpu",
            root,
            paths,
            2,
            **{
                "megatron_training.model": name,
                "actor_config.model": name,
                "actor_config.save_hf": "true",
                "rl_config.test_freq": 0,
                # vLLM in bf16 (its CPU MLA and Gated DeltaNet take nothing else), the actor in bf16 where this CPU
                # runs it natively, else fp32; routes differ without replay (~0.5% of tokens)
                "megatron_training.bf16": "auto",
                "generate_config.dtype": "bfloat16",
                # at EP 2: the actor's two ranks hold two experts each (and route as vLLM did, where the
                # libraries can replay routes: not the NPU sets')
                "rl_config.actor_resource.num_npus": 2,
                "actor_config.expert_model_parallel_size": 2,
                "rl_config.router_replay": "R3" if replay else "null",
                # EPLB's expert load, from the same captured routes
                "generate_config.eplb_token_collects": "true" if replay else "false",
                **rollout_ep.get(family, {}),
            },
        )  # validation once, before training
        results[family] = train(cfg)
    for family, metrics in results.items():
        trained = [m for m in metrics if m["iteration"] >= 1]
        assert [m["iteration"] for m in trained] == [1, 2], family
        last = trained[-1]
        print(family, {k: last[k] for k in sorted(last) if k.startswith(("rollout/logprob", "router_replay/"))})
        for key in ("actor/pg_loss", "grad_norm", "critic/score/mean"):
            assert torch.isfinite(torch.tensor(last[key])), (family, key)
        # vLLM (after in-place resharding) and megatron agree on the sampled tokens' log-probs (bf16 both sides;
        # the routes replayed: max 0.008 measured at EP 1, 0.063-0.074 without replay)
        limit = 0.03 if replay else 0.1
        assert last["rollout/logprob_diff_max"] < limit and last["rollout/logprob_diff_mean"] < 0.01, (family, last)
        if replay:  # how often megatron's own routers chose otherwise (bf16: ~0.5% of tokens measured)
            assert 0 <= last["router_replay/mismatch_share"] < 0.05 and "router_replay/layer_share_max" in last
        if replay:  # every routed token counted once per MoE layer and choice
            (path,) = glob.glob(str(tmp_path / family / "logs" / "*" / "expert_load.json"))
            load = json.load(open(path))
            counts = torch.tensor(load["load"])
            model = tiny(family)  # DeepSeek-V3's dense first layer has no routes
            assert load["num_moe_layers"] == model.moe_layers and load["iterations"] == 2 and load["tokens"] > 0
            assert counts.shape == (model.moe_layers, model.num_experts)
            assert (counts.sum(1) == load["tokens"] * load["top_k"]).all(), load
        hf_dir = tmp_path / family / "ckpt" / "actor" / "iter_0000002_hf"
        assert AutoConfig.from_pretrained(str(hf_dir)).model_type == get_family(family).hf_model_types[0]


DRY_RUNS = [
    ("qwen3_8b", [], "8.19B params"),
    ("qwen3_32b", [], "32.8B params"),
    ("llama31_8b", [], "8.03B params"),
    (
        "qwen3_30b_a3b",
        [
            "actor_config.tensor_model_parallel_size=4",
            "critic_config.tensor_model_parallel_size=4",
            "actor_config.expert_model_parallel_size=8",
            "critic_config.expert_model_parallel_size=8",
            "generate_config.infer_tensor_parallel_size=4",
        ],
        "30.5B params, 3.35B active; 128 experts over EP 8",
    ),
]


@pytest.mark.parametrize("name,extra,expected", DRY_RUNS)
def test_real_size_model_yamls_plan_on_the_32b_layout(name, extra, expected, capsys):
    from cli import train_ppo

    models = [f"megatron_training.model={name}", f"actor_config.model={name}", f"critic_config.model={name}"]
    assert train_ppo.main(["--config-name", "ppo_qwen25_32b_A3", "dry_run=true"] + models + extra) == 0
    out = capsys.readouterr().out
    assert f"model {name} ({expected})" in out, out


def test_qwen3_30b_a3b_at_tp8_is_refused_naming_the_key(capsys):
    from cli import train_ppo

    models = [f"{k}=qwen3_30b_a3b" for k in ("megatron_training.model", "actor_config.model", "critic_config.model")]
    assert train_ppo.main(["--config-name", "ppo_qwen25_32b_A3", "dry_run=true"] + models) == 2
    assert "tensor_model_parallel_size: TP 8 does not divide num_query_groups 4" in capsys.readouterr().err


def test_llama3_rope_frequencies_equal_transformers_for_the_yamls_context():
    """megatron-core scales RoPE with a fixed 8192 context; the family recomputes the frequencies from the
    yaml (here a 128 context), as transformers' llama3 rope does."""
    from types import SimpleNamespace

    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    model = tiny("llama3")
    hf = LlamaConfig(
        **{
            k: v
            for k, v in get_family("llama3").hf_config(model, 0, 0).items()
            if k not in ("architectures", "model_type", "torch_dtype")
        }
    )
    want, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
    gpt = SimpleNamespace(
        rotary_pos_emb=RotaryEmbedding(
            kv_channels=model.head_dim,
            rotary_percent=1.0,
            rotary_base=int(model.rotary_base),
            use_cpu_initialization=True,
        )
    )
    assert (gpt.rotary_pos_emb.inv_freq - want).abs().max() > 1e-3  # unscaled: far off
    get_family("llama3").post_build(gpt, model)
    assert torch.allclose(gpt.rotary_pos_emb.inv_freq, want.to(gpt.rotary_pos_emb.inv_freq.dtype), rtol=1e-6, atol=0)
