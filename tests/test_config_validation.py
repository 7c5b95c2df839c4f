"""Config validation: malformed configs exit 2 with a message naming the key; plans print."""

import os
import subprocess
import time

import pytest

from cli import train_ppo
from tests.conftest import PYTHON, ROOT

A3 = ["--config-name", "ppo_qwen25_32b_A3", "dry_run=true"]

# (overrides, key the message must name, extra text the message must hold)
MALFORMED = [
    (["rl_config.gama=0.9"], "rl_config.gama", "did you mean 'rl_config.gamma'"),
    (["megatron_training.global_batch_size=0"], "megatron_training.global_batch_size", ">= 1"),
    (["megatron_training.global_batch_size=abc"], "megatron_training.global_batch_size", "integer"),
    (["rl_config.mini_batch_size=100"], "rl_config.mini_batch_size", "does not divide"),
    (["actor_config.micro_batch_size=3"], "actor_config.micro_batch_size", "micro_batch_size 3"),
    (["actor_config.tensor_model_parallel_size=3"], "actor_config.tensor_model_parallel_size", "does not divide"),
    (
        ["critic_config.tensor_model_parallel_size=16"],
        "critic_config.tensor_model_parallel_size",
        "num_attention_heads 40",
    ),
    (
        ["actor_config.context_parallel_size=2"],  # Qwen2.5-32B at TP 8: 5 heads and 1 query group per TP rank
        "actor_config.context_parallel_size",
        "5 attention heads per TP rank do not split over CP 2",
    ),
    (["actor_config.context_parallel_size=3"], "actor_config.context_parallel_size", "CP 3 = 24 does not divide"),
    (["actor_config.context_parallel_algo=ring"], "actor_config.context_parallel_algo", "ulysses_cp_algo"),
    (
        [
            "actor_config.lora_r=8",
            "actor_config.context_parallel_size=2",
            "actor_config.context_parallel_algo=megatron_cp_algo",
        ],
        "actor_config.context_parallel_algo",
        "use ulysses_cp_algo with lora_r",
    ),
    (
        ["generate_config.infer_tensor_parallel_size=3"],
        "generate_config.infer_tensor_parallel_size",
        "multiple nor a divisor",
    ),
    (["generate_config.sampling_config.top_p=1.5"], "generate_config.sampling_config.top_p", "<= 1"),
    (["generate_config.sampling_config.temperature=-1"], "generate_config.sampling_config.temperature", ">= 0"),
    (["generate_config.dtype=float64"], "generate_config.dtype", "bfloat16"),
    (["generate_config.weight_transfer=nccl"], "generate_config.weight_transfer", "vllm_native"),
    (["generate_config.weight_transfer=vllm_native"], "generate_config.weight_transfer", "rl_config.rollout_resource"),
    (["generate_config.rollout_quantization=int4"], "generate_config.rollout_quantization", "int8"),
    (
        ["generate_config.rollout_quantization=fp8", "generate_config.dtype=float32"],
        "generate_config.dtype",
        "fp8 runs an engine of dtype bfloat16 or float16",
    ),
    (
        ["generate_config.rollout_quantization=fp8", "generate_config.backend=fallback"],
        "generate_config.rollout_quantization",
        "backend fallback (megatron-core) runs the trained weights as they are",
    ),
    (["rl_config.policy_loss=cispo", "rl_config.clip_ratio_c=3"], "rl_config.clip_ratio_c", "cispo has none"),
    (["rl_config.tau_pos=2"], "rl_config.tau_pos", "is SAPO's gate temperature"),
    (["rl_config.kl_penalty=kll"], "rl_config.kl_penalty", "did you mean 'kl'"),
    (["rl_config.adv_estimator=grpoo"], "rl_config.adv_estimator", "did you mean 'grpo'"),
    (
        ["rl_config.adv_estimator=rloo", "rl_config.n_samples_per_prompt=1"],
        "rl_config.n_samples_per_prompt",
        "rloo compares the responses",
    ),
    (["rl_config.policy_loss=gspoo"], "rl_config.policy_loss", "did you mean 'gspo'"),
    (["rl_config.loss_agg_mode=seq-mean"], "rl_config.loss_agg_mode", "seq-mean-token-mean"),
    (
        ["rl_config.loss_agg_mode=token-mean", "rl_config.token_level_loss=false"],
        "rl_config.token_level_loss",
        "set only one",
    ),
    (["rl_config.clip_higher_enable=true"], "rl_config.clip_ratio_high", "required"),
    (
        ["rl_config.clip_higher_enable=false", "rl_config.clip_ratio_high=0.28"],
        "rl_config.clip_ratio_high",
        "clip_higher_enable is false",
    ),
    (["rl_config.use_kl_in_reward=true", "rl_config.init_kl_coef=0"], "rl_config.init_kl_coef", "would vanish"),
    (["rl_config.kl_penalty=k4"], "rl_config.kl_penalty", "k3"),
    (["rl_config.rollout_correction.rollout_is=tokens"], "rl_config.rollout_correction.rollout_is", "token"),
    (["rl_config.filter_groups_metric=score"], "rl_config.filter_groups_metric", "filter_groups_enable is false"),
    (
        ["rl_config.filter_groups_enable=true", "rl_config.filter_groups_metric=acc"],
        "rl_config.filter_groups_metric",
        "neither score nor a verifier",
    ),
    (
        ["rl_config.filter_groups_enable=true", "rl_config.filter_groups_max_batches=0"],
        "rl_config.filter_groups_max_batches",
        "-1 means no limit",
    ),
    (
        [
            "rl_config.filter_groups_enable=true",
            "rl_config.filter_groups_max_batches=3",
            "rl_config.filter_groups_train_batch_size=100000",
        ],
        "rl_config.filter_groups_train_batch_size",
        "can never be filled: at most filter_groups_max_batches 3 x megatron_training.global_batch_size",
    ),
    (["rl_config.test_freq=5"], "megatron_training.test_data_path", "required by rl_config.test_freq"),
    (["rl_config.val_kwargs.n=0"], "rl_config.val_kwargs.n", ">= 1"),
    (["rl_config.overlong_buffer_enable=true"], "rl_config.overlong_buffer", "between 1 and"),
    (
        ["rl_config.overlong_buffer_enable=true", "rl_config.overlong_buffer=64", "rl_config.rollout_max_tokens=9999"],
        "rl_config.rollout_max_tokens",
        "exceeds",
    ),
    (["rl_config.verifier_weight=[1.0,2.0]"], "rl_config.verifier_weight", "2 weights for 1"),
    (["rl_config.verifier_function=[acc_for_ppo_x]"], "rl_config.verifier_function[0]", "did you mean 'acc_for_ppo'"),
    (["critic_config.save=./ckpt"], "critic_config.save", "separate folders"),
    (["megatron_training.bf16=maybe"], "megatron_training.bf16", "allowed: false, true, auto"),
    (["actor_config.fp16=true"], "actor_config.fp16", "bf16 and fp16"),
    (["rl_config.kl_ctrl_type=adaptive"], "rl_config.kl_target", "adaptive"),
    (["generate_config.max_model_len=1024"], "generate_config.max_model_len", "4096"),
    (["rl_config.rollout_function=tool_agent"], "rl_config.tools", "needs tools"),
    (["rl_config.rollout_function=tool_agent", "rl_config.tools=[calc]"], "rl_config.tools", "unknown tool 'calc'"),
    (
        ["rl_config.multi_turn_enable=true", "rl_config.tools=[calculator]", "rl_config.prompt_type=empty"],
        "rl_config.prompt_type",
        "no tool role",
    ),
    (
        ["rl_config.rollout_function=tests.test_agent_loop:solve", "rl_config.partial_rollout_max_split=2"],
        "rl_config.partial_rollout_max_split",
        "whole-batch function",
    ),
    (["rl_config.rollout_function=my_agents"], "rl_config.rollout_function", "unknown rollout_function"),
    (["actor_config.model=qwen99"], "actor_config.model", "qwen99"),
    (["rl_config.critic_resource.num_npus=64"], "rl_config.critic_resource.num_npus", "shares the actor's devices"),
    (["model.qwen25_32b.num_query_groups=7"], "model.qwen25_32b.num_query_groups", "does not divide"),
    (["actor_config.lora_r=5121"], "actor_config.lora_r", "linear_qkv in model qwen25_32b (weight [out 7168, in 5120]"),
    (["actor_config.lr_decay_style=cosin"], "actor_config.lr_decay_style", "did you mean 'cosine'"),
    (
        [
            "actor_config.pipeline_model_parallel_size=2",
            "actor_config.tensor_model_parallel_size=4",
            "actor_config.num_layer_list='30,30'",
        ],
        "actor_config.num_layer_list",
        "summing to num_layers 64",
    ),
    (["rl_config.epochs=1,2"], "rl_config.epochs", "Hydra sweep"),
    (["rl_config.clip_ratio=1.5"], "rl_config.clip_ratio", "< 1"),
    (["foo.bar=1"], "foo", "unknown section"),
    (["rl_config.actor_resource=5"], "rl_config.actor_resource", "mapping"),
    (["megatron_training.dataset_additional_keys=labels"], "megatron_training.dataset_additional_keys", "list"),
    (
        ["rl_config.adv_estimator=group_norm", "rl_config.n_samples_per_prompt=1"],
        "rl_config.n_samples_per_prompt",
        "at least 2",
    ),
    (["critic_config.save_hf=true", "critic_config.save=null"], "critic_config.save_hf", "save is not set"),
    (
        ["actor_config.save_hf=true", "actor_config.no_shared_storage=true"],
        "actor_config.save_hf",
        "filesystem all ranks share",
    ),
    (["rl_config.library_logs=quiet"], "rl_config.library_logs", "console"),
    (
        ["rl_config.use_dynamic_bsz=true", "rl_config.update_max_packing_token_size=100"],
        "rl_config.update_max_packing_token_size",
        "cannot hold the longest sequence",
    ),
    (["rl_config.ref_max_packing_token_size=9000"], "rl_config.ref_max_packing_token_size", "use_dynamic_bsz is false"),
    (
        ["generate_config.sampling_config.min_tokens=99999"],
        "generate_config.sampling_config.min_tokens",
        "above max_tokens",
    ),
    (["dry_run=yes"], "dry_run", "true or false"),
    (["rl_config.gamma=[1,"], "rl_config.gamma", "cannot parse"),
    (["rl_config.rule_reward=false"], "rl_config.rule_reward", "reward_config"),
    (["generate_config.sampling_config.max_tokenz=5"], "generate_config.sampling_config.max_tokenz", "max_tokens"),
    (["model.qwen25_32b.hidden_size=5121"], "model.qwen25_32b.num_attention_heads", "not divisible"),
    (["rl_config.gamma=1.5"], "rl_config.gamma", "<= 1"),
    (["megatron_training.seed=-3"], "megatron_training.seed", ">= 0"),
]


@pytest.mark.parametrize("overrides,key,text", MALFORMED, ids=[m[1] + ":" + m[0][-1] for m in MALFORMED])
def test_malformed_config_exits_2_naming_the_key(overrides, key, text, capsys):
    rc = train_ppo.main(A3 + overrides)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert key in err, err
    assert text in err, err
    assert "Traceback" not in err


def test_at_least_25_distinct_malformed_configs():
    assert len({m[1] for m in MALFORMED}) >= 25


def test_unknown_config_name_suggests(capsys):
    assert train_ppo.main(["--config-name", "ppo_qwen25_32b_A4", "dry_run=true"]) == 2
    err = capsys.readouterr().err
    assert "--config-name" in err and "ppo_qwen25_32b_A3" in err


def test_missing_paths_refused_without_dry_run(tmp_path, capsys):
    rc = train_ppo.main(
        ["--config-name", "ppo_qwen25_32b_A3", f"megatron_training.tokenizer_name_or_path={tmp_path}/nope"]
    )
    err = capsys.readouterr().err
    assert rc == 2
    assert "megatron_training.tokenizer_name_or_path" in err and "does not exist" in err


def test_a3_dry_run_prints_plan_for_two_nodes_of_16(capsys):
    assert train_ppo.main(A3) == 0
    out = capsys.readouterr().out
    assert "128 prompts x 8 samples = 1024 responses" in out
    assert "32 (2 nodes x 16" in out
    assert "TP 8 x PP 1 x DP 4" in out
    assert "8 mini-batches per epoch" in out
    assert "32 micro-batch(es) of 1" in out
    assert "dry_run" in out


def test_overrides_of_keys_absent_from_yaml_are_applied(capsys):
    assert train_ppo.main(A3 + ["rl_config.kl_target=0.1", "rl_config.n_samples_per_prompt=4"]) == 0
    assert "128 prompts x 4 samples = 512 responses" in capsys.readouterr().out


def test_model_not_in_defaults_is_read_from_its_file(capsys):
    assert (
        train_ppo.main(
            A3
            + [
                "actor_config.model=qwen25_7b",
                "actor_config.tensor_model_parallel_size=4",
                "generate_config.infer_tensor_parallel_size=4",
            ]
        )
        == 0
    )
    assert "model qwen25_7b" in capsys.readouterr().out


def test_tiny_cpu_config_is_valid(capsys):
    assert train_ppo.main(["--config-name", "ppo_tiny_cpu", "dry_run=true"]) == 0
    out = capsys.readouterr().out
    assert "model tiny_qwen25" in out


def test_cli_subprocess_exit_code_message_and_speed():
    start = time.perf_counter()
    proc = subprocess.run(
        [PYTHON, "cli/train_ppo.py", "--config-name", "ppo_qwen25_32b_A3", "rl_config.gama=1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    elapsed = time.perf_counter() - start
    assert proc.returncode == 2
    assert (
        proc.stderr.strip().splitlines()[-1]
        == "config error: rl_config.gama: unknown key; did you mean 'rl_config.gamma'?"
    )
    assert "Traceback" not in proc.stderr
    assert elapsed < 10  # generous for a loaded CI box; typically well under a second


def test_a3_dry_run_subprocess():
    proc = subprocess.run(
        [PYTHON, "cli/train_ppo.py", "--config-name", "ppo_qwen25_32b_A3", "dry_run=true"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NPUS_PER_NODE": "16"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "2 nodes x 16" in proc.stdout


def test_config_docs_are_in_step_with_the_schema():
    from cli.config_docs import render

    with open(os.path.join(ROOT, "docs", "config.md"), encoding="utf-8") as fh:
        assert fh.read() == render(), "docs/config.md is stale: run `make docs`"


def test_reward_model_config_needs_load_and_resource(capsys, tmp_path):
    base = A3 + ["+reward_config.model=qwen25_32b", "+reward_config.tensor_model_parallel_size=8"]
    assert train_ppo.main(base) == 2
    assert "rl_config.reward_resource" in capsys.readouterr().err
    assert train_ppo.main(base + ["+rl_config.reward_resource.num_npus=32"]) == 2
    assert "reward_config.load" in capsys.readouterr().err
    assert train_ppo.main(base + ["+rl_config.reward_resource.num_npus=64", f"+reward_config.load={tmp_path}"]) == 2
    assert "rl_config.reward_resource.num_npus" in capsys.readouterr().err
    assert train_ppo.main(base + ["+rl_config.reward_resource.num_npus=32", f"+reward_config.load={tmp_path}"]) == 0
    assert "reward    : 32 devices" in capsys.readouterr().out


def test_a_quantized_rollout_turns_the_correction_on_unless_it_is_off(capsys):
    fp8 = ["--config-name", "grpo_tiny_cpu_async", "dry_run=true", "generate_config.rollout_quantization=fp8"]
    assert train_ppo.main(fp8 + ["generate_config.dtype=bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "rollout correction: token-level truncated IS" in out and "; fp8 weights and activations" in out
    assert train_ppo.main(fp8 + ["generate_config.dtype=bfloat16", "rl_config.rollout_correction.rollout_is=off"]) == 0
    assert "rollout correction" not in capsys.readouterr().out
    assert train_ppo.main(fp8 + ["generate_config.dtype=bfloat16", "generate_config.weight_transfer=vllm_native"]) == 2
    err = capsys.readouterr().err
    assert "generate_config.weight_transfer: vllm_native with rollout_quantization fp8 is not checked" in err, err


def test_native_weight_transfer_needs_the_vllm_engine(capsys):
    rc = train_ppo.main(
        ["--config-name", "grpo_tiny_cpu_async", "dry_run=true"]
        + ["generate_config.backend=fallback", "generate_config.weight_transfer=vllm_native"]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "generate_config.weight_transfer" in err and "backend is fallback" in err, err
    assert "Traceback" not in err
    assert train_ppo.main(["--config-name", "grpo_tiny_cpu_async", "dry_run=true",
                           "generate_config.weight_transfer=vllm_native"]) == 0  # fmt: skip


def test_a_missing_demo_asset_says_which_command_makes_it(tmp_path, capsys):
    missing = tmp_path / "demo_assets" / "tiny_tools_hf"
    rc = train_ppo.main(["--config-name", "grpo_tiny_cpu_tools", f"megatron_training.tokenizer_name_or_path={missing}"])
    err = capsys.readouterr().err
    assert rc == 2 and "megatron_training.tokenizer_name_or_path" in err and "does not exist" in err, err
    assert "python cli/prepare_demo.py --tools" in err and "Traceback" not in err


def test_the_one_slot_plan_does_not_quote_a_node_size_nobody_gave(monkeypatch, capsys):
    monkeypatch.delenv("NPUS_PER_NODE", raising=False)
    assert train_ppo.main(["--config-name", "grpo_tiny_cpu", "dry_run=true"]) == 0
    out = capsys.readouterr().out
    assert "devices   : 1 (one node)" in out and "NPUS_PER_NODE" not in out, out


@pytest.mark.parametrize(
    "name, cli", [("ppo_tiny_cpu", "train_ppo"), ("rm_tiny_cpu", "train_rm"), ("sft_tiny_cpu", "train_sft")]
)
def test_test_freq_0_alone_turns_validation_off_with_one_line(name, cli, capsys):
    """One key switches validation off: the configured test set (and val_before_train) is then unused, said once
    in the plan; the run starts (dry_run exits 0) and never reads the test set (a path that does not exist is
    no error)."""
    import importlib

    main = importlib.import_module(f"cli.{cli}").main
    argv = ["--config-name", name, "dry_run=true", "rl_config.test_freq=0", "megatron_training.test_data_path=./none"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if "rl_config.test_freq 0" in line]
    assert len(said) == 1 and "'./none' is not read" in said[0], out
    assert "test_data_path" not in out.replace(said[0], "")  # no warning about the missing, unread test set


def test_the_agents_and_sandboxs_flat_spellings_are_read_into_their_sections_with_one_note(capsys):
    """rl_config.max_turns, rl_config.tool_timeout, ... of the release before: read as rl_config.agent.* and
    rl_config.sandbox.*, said in one line; a flat key beside its nested one (a command-line override) wins."""
    from mindspeed_rl.config_cls import ConfigError
    from mindspeed_rl.features import load_ppo_config

    flat = ["rl_config.max_turns=3", "rl_config.tool_timeout=2.5", "rl_config.tool_isolation=none"]
    cfg = load_ppo_config("grpo_tiny_cpu_tools", flat)
    assert (cfg.rl.agent.max_turns, cfg.rl.sandbox.timeout, cfg.rl.sandbox.isolation) == (3, 2.5, "none")
    assert cfg.rl.agent.max_tool_calls == 1 and cfg.rl.sandbox.memory_mb == 512  # the YAML's nested keys stay
    notes = [line for line in capsys.readouterr().out.splitlines() if "old spelling" in line]
    assert len(notes) == 1 and "rl_config.tool_timeout" in notes[0] and "rl_config.sandbox.timeout" in notes[0]
    cfg = load_ppo_config("grpo_tiny_cpu_tools", ["rl_config.sandbox.timeout=7"])
    assert cfg.rl.sandbox.timeout == 7 and "old spelling" not in capsys.readouterr().out
    with pytest.raises(ConfigError, match=r"rl_config.agent.max_turnz: unknown key.*max_turns"):
        load_ppo_config("grpo_tiny_cpu_tools", ["+rl_config.agent.max_turnz=3"])
