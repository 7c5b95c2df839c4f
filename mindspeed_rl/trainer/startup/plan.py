"""The batch plan: a human-readable account of how one iteration's samples and devices are split."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, List

from ... import features
from ...features import precision
from ...features.dynamic_sampling import filter_metric_name
from ...features.validation import VALIDATION_OFF
from ...utils.units import readable_bytes, readable_count
from .layout import cp_groups, describe_blocks, dp_groups, engine_blocks, layout_diagram
from .probes import devices_per_node

if TYPE_CHECKING:
    from ...config_cls.ppo_config import PPOConfig
    from ...config_cls.stage_config import StageConfig


def batch_plan(cfg: PPOConfig) -> str:
    """A human-readable account of how one iteration's samples are split."""
    lines = iteration_lines(cfg) + features.plan_lines(cfg)
    lines += [role_split_line(role, cfg) for role in cfg.roles]
    lines += role_memory_lines(cfg)
    lines += parallel_group_lines(cfg.roles)
    lines += [pipeline_line(role, cfg.rl.mini_batch_size) for role in cfg.roles if role.pp > 1 and role.trains]
    lines.append(
        f"  forward   : actor_forward_micro_batch_size {cfg.rl.actor_forward_micro_batch_size}, "
        f"ref_forward_micro_batch_size {cfg.rl.ref_forward_micro_batch_size}"
    )
    lines += placement_lines(cfg)
    return "\n".join(lines)


def node_text(devices: int) -> str:
    """The nodes the actor's ``devices`` take: "2 nodes x 16, NPUS_PER_NODE=16", or "one node"."""
    per_node = devices_per_node()
    nodes = -(-devices // per_node)
    if nodes > 1 or devices == per_node or "NPUS_PER_NODE" in os.environ:
        return f"{nodes} node{'s' if nodes > 1 else ''} x {min(per_node, devices)}, NPUS_PER_NODE={per_node}"
    return "one node"  # part of one node, no node size given: the default of 16 says nothing about this machine


def iteration_lines(cfg: PPOConfig) -> List[str]:
    """The heading and the iteration as a whole: algorithm, samples, optimizer steps, devices, rollout engines."""
    gbs, n = cfg.prompts_per_iteration, cfg.rl.n_samples_per_prompt
    samples, mini = cfg.samples_per_iteration, cfg.rl.mini_batch_size
    devices = cfg.actor.num_devices
    gen = cfg.generate
    itp = gen.infer_tensor_parallel_size
    rollout_devices = cfg.rollout_devices
    infer_dp = (rollout_devices or devices) // itp
    return [
        "Batch plan",
        f"  algorithm : {cfg.algorithm.describe()}",
        f"  iteration : {gbs} prompts x {n} samples = {samples} responses"
        + (
            f" (dynamic sampling: batches of {cfg.megatron_training.global_batch_size} prompts until {gbs} groups "
            f"differ in {filter_metric_name(cfg.rl)}, "
            + (
                f"at most {cfg.rl.filter_groups_max_batches} batch(es))"
                if cfg.rl.filter_groups_max_batches > 0
                else "no batch limit)"
            )
            if cfg.rl.filter_groups_enable
            else ""
        ),
        f"  update    : {samples} / mini_batch_size {mini} = {samples // mini} mini-batches per epoch"
        f" x {cfg.rl.epochs} epoch(s) = {samples // mini * cfg.rl.epochs} optimizer steps per role",
        f"  devices   : {devices} ({node_text(devices)}), integrated="
        f"{cfg.rl.use_integrated_worker}, throughput world_size={cfg.world_size}",
        f"  rollout   : infer TP {itp} x PP {gen.infer_pipeline_parallel_size}, "
        f"{infer_dp} engine(s), {gbs / infer_dp:g} prompts = {samples / infer_dp:g} responses each, up to "
        f"{gen.sampling_config.max_tokens} new tokens"
        + ("" if gen.rollout_quantization == "none" else f"; {gen.rollout_quantization} weights and activations"),
        f"  engines   : {describe_blocks(engine_blocks(rollout_devices or devices, itp), 'engine')}"
        + (
            f" (rollout workers on {rollout_devices} devices of their own after the actor's {devices}: disaggregated, "
            "the actor's rank 0 pushes full weights to every rollout rank after each update)"
            if rollout_devices
            else " (actor ranks; every rank of an engine gets the same prompts)"
        ),
    ]


def role_split_line(role, cfg: PPOConfig) -> str:
    """A role's devices (TP x PP x CP x DP), model and share of the samples per DP rank."""
    from ...families.parameters import active_parameter_count, parameter_count  # deferred: the families import torch

    samples, mini = cfg.samples_per_iteration, cfg.rl.mini_batch_size
    m = role.megatron
    per_rank = mini // role.dp if role.trains else samples // role.dp
    micro = per_rank // m.micro_batch_size
    params = readable_count(parameter_count(role.model)) + " params"
    if role.model.num_experts:
        params += (
            f", {readable_count(active_parameter_count(role.model))} active; {role.model.num_experts} "
            f"experts over EP {m.expert_model_parallel_size}"
        )
    return (
        f"  {role.name:<10}: {role.num_devices} devices = TP {role.tp} x PP {role.pp}"
        + (f" x CP {role.cp}" if role.cp > 1 else "")
        + f" x DP {role.dp}; "
        f"model {m.model} ({params}); "
        + (
            f"{per_rank} samples per DP rank per mini-batch = {micro} micro-batch(es) of {m.micro_batch_size}; "
            f"lr {m.lr:g}"
            if role.trains
            else f"{per_rank} samples per DP rank to score"
            + ("" if role.name != "teacher" or cfg.rl.teacher_colocate else "; devices of its own")
        )
    )


def role_memory_lines(cfg: PPOConfig) -> List[str]:
    """Each role's optimizer state (trainable roles) and what its longest sequence costs a rank; for a
    vision-language role what its images cost."""
    longest = cfg.rl.max_prompt_length + cfg.generate.sampling_config.max_tokens
    lines = []
    for role in cfg.roles:
        if role.trains:
            lines.append(f"  {role.name + ' mem':<10}: " + trainable_memory(role))
        lines.append(f"  {role.name + ' seq':<10}: " + sequence_memory(role, longest))
        if role.model.vision_config:
            lines.append(f"  {role.name + ' img':<10}: " + image_memory(role, cfg.rl.max_prompt_length))
    return lines


def image_memory(role, prompt_tokens: int) -> str:
    """A vision-language role's images: at most ``prompt_tokens`` image tokens per prompt, each 2 x 2 (merge^2)
    patches of 1176 fp32 values in the batch (every response row holds its prompt's copy), and the tower's
    activations for them (kept for the backward only when the tower trains)."""
    from ...families.parameters import vision_parameter_count  # deferred: the families import torch

    m, model, v = role.megatron, role.model, role.model.vision_config
    patches = prompt_tokens * v.get("spatial_merge_size", 2) ** 2
    width = v.get("in_channels", 3) * v.get("temporal_patch_size", 2) * v.get("patch_size", 14) ** 2
    pixels = patches * width * 4 * m.micro_batch_size
    text = (
        f"up to {prompt_tokens} image tokens per prompt (max_prompt_length) = {patches} patches: pixel values "
        f"{readable_bytes(pixels)} per micro-batch of {m.micro_batch_size}; tower of "
        f"{readable_count(vision_parameter_count(model))} params on each TP rank"
    )
    if role.trains and not m.freeze_vision_tower:
        act = 34 / 2 * (2 if m.bf16 or m.fp16 else 4) * v["hidden_size"] * patches * v["depth"] * m.micro_batch_size
        return text + f", its activations about {readable_bytes(act)} per micro-batch (it trains)"
    return text + " (no activations kept: " + ("frozen)" if role.trains else "forward only)")


def parallel_group_lines(roles) -> List[str]:
    """The ranks of each role's data-parallel groups and, with CP, of its context-parallel groups."""
    lines = []
    for role in roles:
        lines.append(
            f"  {role.name + ' DP':<10}: "
            + describe_blocks(dp_groups(role.tp, role.dp, role.pp, role.cp), "DP")
            + f" (ranks of each {role.name} data-parallel group: TP x PP"
            + (" x CP)" if role.cp > 1 else ")")
        )
        if role.cp > 1:
            lines.append(
                f"  {role.name + ' CP':<10}: "
                + describe_blocks(cp_groups(role.tp, role.dp, role.pp, role.cp), "CP")
                + f" (ranks that split one sequence, {role.megatron.context_parallel_algo})"
            )
    return lines


def pipeline_line(role, mini_batch_size: int) -> str:
    """A pipelined role's stages (with VPP its virtual stages and the layers of each rank) and the 1F1B bubble of
    one update step: (PP - 1) / (VPP x M) idle time per unit of compute for M micro-batches per rank."""
    m, layers = role.megatron, role.model.num_layers
    vpp, micro = m.virtual_stages(layers), mini_batch_size // role.dp // m.micro_batch_size
    held = "; ".join(f"rank {r} layers {stage}" for r, stage in enumerate(m.stage_layers(layers)))
    bubble = (role.pp - 1) / (vpp * micro)
    text = f"  {role.name + ' PP':<10}: PP {role.pp}" + (
        f" x VPP {vpp} = {role.pp * vpp} virtual stages" if vpp > 1 else ""
    )
    text += (
        f" ({held}); bubble (PP-1)/(VPP x M) = {role.pp - 1}/({vpp} x {micro}) = {bubble:.1%} idle per unit of compute"
    )
    return text + (f" (1F1B without VPP: {(role.pp - 1) / micro:.1%})" if vpp > 1 else "")


def placement_lines(cfg: PPOConfig) -> List[str]:
    """The layout diagram of the placement group: the roles on the actor's devices and the rollout engines."""
    devices = cfg.actor.num_devices
    co_located = [(r.name, r.tp, r.dp, r.pp, r.cp) for r in cfg.colocated_roles if r.num_devices == devices]
    diagram = layout_diagram(devices, cfg.generate.infer_tensor_parallel_size, co_located)
    heading = "  layout (one placement group; roles share the bundles):"
    return [heading] + ["    " + line for line in diagram.splitlines()]


def trainable_memory(role) -> str:
    """What trains and the optimizer state it needs per rank: Adam's two moments (fp32) and, with bf16/fp16
    weights, the fp32 main copy; divided over the DP x CP ranks by the distributed optimizer (megatron's)."""
    from ...families.parameters import (
        parameter_count,
        parameters_per_rank,
        vision_parameter_count,
    )  # deferred: the families import torch

    m, model = role.megatron, role.model
    total, experts = parameter_count(model), 0
    if m.lora_r:
        stage = max(m.layers_per_stage(model.num_layers))
        trainable, per_rank = model.lora_parameter_count(
            m.lora_r, m.lora_target_modules, role.tp, m.expert_model_parallel_size, stage
        )
        what = f"LoRA r={m.lora_r} on {', '.join(m.lora_target_modules)}: {readable_count(trainable)} of "
        what += f"{readable_count(total)} params train ({trainable / total:.2%})"
    else:
        frozen = vision_parameter_count(model, "tower") if m.freeze_vision_tower else 0
        frozen += vision_parameter_count(model, "projector") if m.freeze_projector else 0
        trainable, per_rank = total - frozen, (total - frozen) // (role.tp * role.pp)
        if model.num_experts:  # the largest stage; the experts split over EP, their state over DP x CP / EP
            stage = max(m.layers_per_stage(model.num_layers))
            per_rank, experts = parameters_per_rank(model, role.tp, m.expert_model_parallel_size, stage)
        what = (
            f"all {readable_count(total)} params train"
            if not frozen
            else (
                f"{readable_count(trainable)} of {readable_count(total)} params train (the vision tower's "
                f"{readable_count(frozen)} frozen)"
            )
        )
    state = 8 + (4 if m.bf16 or m.fp16 else 0)
    shards = role.dp * role.cp if m.use_distributed_optimizer else 1
    state_bytes = per_rank * state // shards + experts * state // max(1, shards // m.expert_model_parallel_size)
    weights = (per_rank + experts if not m.lora_r else total // (role.tp * role.pp)) * (2 if m.bf16 or m.fp16 else 4)
    gib = 2**30
    return f"{what}; optimizer state about {state_bytes / gib:.2f} GiB per rank (weights about {weights / gib:.2f} GiB)"


def sequence_memory(role, tokens: int) -> str:
    """What one sequence of ``tokens`` costs a rank of this role: its share of the tokens (CP splits them,
    sequence parallelism splits them again inside the layers), the activations of a micro-batch of such
    sequences kept for the backward (about 34 x hidden bytes per token and layer with 16-bit activations and
    flash attention, Korthikanti et al. 2022; with full recomputation each layer's input and one layer's
    activations), and the LM head's logits chunk."""
    m, model = role.megatron, role.model
    per_rank = -(-tokens // role.cp)
    split = role.tp if m.sequence_parallel and role.tp > 1 else 1
    layers = max(m.layers_per_stage(model.num_layers))
    width = 2 if m.bf16 or m.fp16 else 4
    per_layer = 34 / 2 * width * model.hidden_size * per_rank * m.micro_batch_size / split
    if m.recompute_granularity == "full":  # each layer keeps its input; one layer's activations at a time
        activations = width * model.hidden_size * per_rank * m.micro_batch_size / split * layers + per_layer
    else:
        activations = per_layer * layers
    vocab = model.padded_vocab_size or model.vocab_size or 0
    text = (
        f"longest sequence {tokens} tokens -> {per_rank} per rank (CP {role.cp}); activations about "
        f"{readable_bytes(activations)} per micro-batch of {m.micro_batch_size}"
    )
    if vocab and role.name == "actor":
        chunk = m.log_prob_chunk_size or per_rank * m.micro_batch_size
        whole = per_rank * m.micro_batch_size * vocab / role.tp * 4
        text += (
            f"; log-prob head {min(chunk, per_rank * m.micro_batch_size)} tokens x V/TP {vocab // role.tp} fp32 = "
            f"{readable_bytes(min(chunk * vocab / role.tp * 4, whole))} at once (whole micro-batch: "
            f"{readable_bytes(whole)})"
        )
    return text


def stage_header(cfg: "StageConfig") -> str:
    """The stage's plan heading; a stage with a section of its own (dpo_config) describes it there."""
    options = cfg.dpo
    return cfg.stage.header.format(options=options.describe(cfg.role.megatron)) if options else cfg.stage.header


def stage_plan(cfg: "StageConfig") -> str:
    """How one optimizer step's examples (or pairs) are split over the devices."""
    role, m, spec = cfg.role, cfg.role.megatron, cfg.stage
    per_rank, unit = m.global_batch_size // role.dp, spec.unit
    sequences = f" = {2 * m.global_batch_size} sequences" if spec.unit == "pairs" else ""
    lines = [
        stage_header(cfg),
        f"  step      : {m.global_batch_size} {unit} (global_batch_size){sequences}; "
        f"{m.train_iters} steps (train_iters)",
        f"  {spec.role:<10}: {role.num_devices} device(s), TP {role.tp} x PP {role.pp}"
        + (f" x CP {role.cp}" if role.cp > 1 else "")
        + f" x DP {role.dp}; {per_rank} {unit} per DP rank in {per_rank // m.micro_batch_size} micro-batch(es) "
        f"of {m.micro_batch_size} {unit}",
        f"  sequences : up to seq_length {m.seq_length} tokens; "
        + ("packed (use_remove_padding)" if cfg.rl.use_remove_padding else "padded"),
    ] + precision.plan_lines(cfg)
    head_note = "; the value head trains with the adapters" if m.lora_r and spec.head == "value" else ""
    lines.append(f"  memory    : {trainable_memory(role)}{head_note}")
    measured = spec.measured
    if cfg.validates:
        before = " (and before the first with val_before_train)" if cfg.rl.val_before_train else ""
        lines.append(
            f"  held-out  : {measured} on {m.test_data_path} every {cfg.rl.test_freq} steps and at the end{before}"
        )
    elif m.test_data_path:
        lines.append(f"  held-out  : {VALIDATION_OFF.format(path=m.test_data_path)}")
    groups = dp_groups(role.tp, role.dp, role.pp, role.cp)
    lines.append(f"  DP groups : {groups[:4]}" + (" ..." if len(groups) > 4 else ""))
    return "\n".join(lines)
