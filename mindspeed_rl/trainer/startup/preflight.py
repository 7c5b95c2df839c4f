"""Checks that take seconds and run before Ray starts: every path the run will write or read is usable.

A problem raises UserError naming the key and the path (exit 2): an unwritable save folder is found
before any training, a broken checkpoint before any worker starts.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import zipfile
from typing import List, Optional, Tuple

from ... import features
from ...accelerator import get_accelerator
from ...checkpoint import lora_base
from ...checkpoint import megatron_layout as ml
from ...compat import vllm as compat_vllm
from ...config_cls.ppo_config import PPOConfig, RoleConfig
from ...config_cls.stage_config import StageConfig
from ...utils.cli import UserError
from .rollout_checks import check_rollout_engine


def check_writable(key: str, folder: str) -> None:
    """``folder`` exists (created if needed) and a file can be written in it."""
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write_check_"):
            pass
    except OSError as exc:
        raise UserError(f"{key}: cannot write checkpoints to {folder} ({exc.strerror or exc})") from None


def checkpoint_files(iter_dir: str) -> List[str]:
    return sorted(
        os.path.join(root, name) for root, _, names in os.walk(iter_dir) for name in names if name.endswith(".pt")
    )


def first_rank_file(iter_dir: str) -> str:
    """The first rank's model file (the optimizer shard files beside it hold no config)."""
    return [p for p in checkpoint_files(iter_dir) if os.path.basename(p) == ml.FILE][0]


def check_checkpoint(
    key: str, folder: str, layout: Optional[Tuple[int, int]] = None, iteration: Optional[int] = None
) -> str:
    """The tracker is valid, the iteration it names (or ``iteration``) exists with the expected TP x PP
    layout, and every file in it is complete (a torch checkpoint is a zip: a truncated one has no central
    directory). Returns the iteration's folder."""
    try:
        _, iter_dir = ml.latest_iteration_dir(folder, iteration)
        ml.checked_layout(folder, iter_dir, layout)
    except ml.CheckpointError as exc:
        raise UserError(f"{key}: {exc}") from None
    for path in checkpoint_files(iter_dir):
        try:
            with zipfile.ZipFile(path) as archive:
                archive.infolist()
        except (zipfile.BadZipFile, OSError) as exc:
            raise UserError(f"{key}: {path} is truncated or corrupt ({exc})") from None
    return iter_dir


# what makes weights fit a model: a checkpoint of another shape would fail in the workers after start-up
SHAPE_KEYS = (
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "group_query_attention",
    "kv_channels",
    "padded_vocab_size",
    "num_experts",
    "moe_ffn_hidden_size",
    "untie_embeddings_and_output_weights",
    "add_qkv_bias",
    "swiglu",
)


def check_stored_model(key: str, iter_dir: str, role: RoleConfig) -> None:
    """The model config stored in the checkpoint has the run's shape (hidden size, layers, heads, vocab)."""
    first = first_rank_file(iter_dir)
    try:
        config = ml.safe_load(first, mmap=True).get("config") or {}
    except ml.CheckpointError as exc:
        raise UserError(f"{key}: {exc}") from None
    stored, run = config.get("model") or {}, dataclasses.asdict(role.model)
    differ = [
        f"{k} {stored[k]} (run: {run[k]})"
        for k in SHAPE_KEYS
        if k in stored and k in run and stored[k] is not None and run[k] is not None and stored[k] != run[k]
    ]
    if differ:
        raise UserError(
            f"{key}: {os.path.dirname(iter_dir)} holds another model than {role.name}_config.model: {', '.join(differ)}"
        )
    check_stored_layers(key, iter_dir, config, role)


def check_stored_layers(key: str, iter_dir: str, config: dict, role: RoleConfig) -> None:
    """Each pipeline rank's stored layers are the ones the run's layout gives it (num_layer_list, VPP): the same
    shapes in another order would load silently into the wrong layers."""
    from shlex import quote

    from ...checkpoint.sharding import stored_stage_layers

    if "num_layer_list" not in config:
        return
    m, layers = role.megatron, role.model.num_layers
    stored, run = stored_stage_layers(config), m.stage_layers(layers)
    if len(stored) != len(run) or stored == run:
        return
    vpp = m.virtual_stages(layers)
    folder = os.path.dirname(iter_dir.rstrip("/"))
    target = f"{folder}_vpp{vpp}" if vpp > 1 else f"{folder}_pp{role.pp}"
    split = (
        f" --num-layers-per-virtual-pipeline-stage {layers // (role.pp * vpp)}"
        if vpp > 1
        else (f" --num-layer-list {m.num_layer_list}" if m.num_layer_list else "")
    )
    raise UserError(
        f"{key}: {folder} stores the pipeline ranks' layers as {stored}; the run's layout (num_layer_list, "
        f"virtual_pipeline_model_parallel_size) gives {run}. Reshard it: python cli/convert_ckpt.py "
        f"--load-model-type mg --save-model-type mg --load-dir {quote(folder)} --save-dir {quote(target)} "
        f"--target-tensor-parallel-size {role.tp} --target-pipeline-parallel-size {role.pp}{split}"
        + (f" --target-expert-parallel-size {m.expert_model_parallel_size}" if m.expert_model_parallel_size > 1 else "")
    )


def check_lora_base(section: str, iter_dir: str, override: Optional[str]) -> None:
    """An adapter-only LoRA checkpoint needs the base checkpoint it records (or lora_base_load's)."""
    missing = lora_base.missing_base(ml.safe_load(first_rank_file(iter_dir), mmap=True), override)
    if missing:
        raise UserError(f"{section}.lora_base_load: {os.path.dirname(iter_dir)} {missing}")


def holds_named_optimizer(key: str, rank_file: str) -> bool:
    """The rank file holds its optimizer state by parameter name (written by the resharding converter): the
    plain and the distributed optimizer load it at any data-parallel size, without shard files."""
    try:
        optim = ml.safe_load(rank_file, mmap=True).get("optimizer") or {}
    except ml.CheckpointError as exc:
        raise UserError(f"{key}: {exc}") from None
    return "named" in optim


def check_optimizer_files(key: str, iter_dir: str, role: RoleConfig) -> None:
    """Resuming the distributed optimizer needs every data-parallel rank's shard in every rank folder, unless
    the folder's rank file holds the optimizer state by parameter name (a resharded checkpoint)."""
    if role.megatron.expert_model_parallel_size > 1:
        return  # the shards follow the expert-parallel grouping; the workers check those
    wanted = [f"distrib_optim_dp{r:03d}.pt" for r in range(role.dp * role.cp)]  # shards over DP x CP
    for rank_dir in sorted(d for d in os.listdir(iter_dir) if d.startswith("mp_rank_")):
        missing = [name for name in wanted if not os.path.isfile(os.path.join(iter_dir, rank_dir, name))]
        if missing and not holds_named_optimizer(key, os.path.join(iter_dir, rank_dir, ml.FILE)):
            path = os.path.join(iter_dir, rank_dir, missing[0])
            raise UserError(
                f"{key}: {path} is missing, so the optimizer state cannot be resumed (saved with "
                f"another data-parallel or context-parallel size or without the distributed optimizer?); reshard "
                f"it with "
                f"cli/convert_ckpt.py --load-model-type mg --save-model-type mg (it loads at any DP size), "
                f"or set {role.name}_config.no_load_optim=true to start the optimizer afresh"
            )


def found_instead(folder: str) -> str:
    """What a ``load`` folder without a checkpoint holds, in words."""
    if not os.path.isdir(folder):
        return "it does not exist" if not os.path.exists(folder) else "it is not a folder"
    names = sorted(os.listdir(folder))
    interrupted = [n for n in names if n.endswith((".tmp", ".part"))]
    if not names:
        return "it is empty"
    if interrupted:
        return f"it holds only interrupted saves ({', '.join(interrupted[:3])}), no completed one"
    return f"it holds no {ml.TRACKER} (found: {', '.join(names[:5])}{', ...' if len(names) > 5 else ''})"


def check_resumable(section: str, load: str) -> None:
    """finetune false resumes: ``load`` must hold a checkpoint. A run asked to resume never starts afresh."""
    if ml.read_tracker_or_none(load) is None:
        raise UserError(
            f"{section}.load: {section}.finetune is false (resume), but {load} holds no complete checkpoint: "
            f"{found_instead(load)}. To resume, point {section}.load at a save folder with {ml.TRACKER}; to "
            f"start a new run, set {section}.finetune=true (load: the initial weights)"
        )


def check_role(role: RoleConfig, iteration: Optional[int] = None, trains: bool = True) -> None:
    """``iteration``: the one a resume loads (None: the tracker's); ``trains``: the role resumes its training
    state (the reward model only loads weights)."""
    m, section = role.megatron, f"{role.name}_config"
    if m.save:
        check_writable(f"{section}.save", m.save)
    if m.load and not m.finetune:
        check_resumable(section, m.load)  # so from here every load holds a checkpoint
    if m.load:
        resuming = trains and not m.finetune
        iter_dir = check_checkpoint(
            f"{section}.load", m.load, (role.tp, role.pp, m.expert_model_parallel_size), iteration if resuming else None
        )
        check_stored_model(f"{section}.load", iter_dir, role)
        check_lora_base(section, iter_dir, m.lora_base_load)
        if resuming and not m.no_load_optim and m.use_distributed_optimizer:
            check_optimizer_files(f"{section}.load", iter_dir, role)


def resume_iteration(cfg: "PPOConfig | StageConfig") -> Optional[int]:
    """The iteration a resume (finetune false) loads in every training role: the last one all of them
    completed (a stop between two roles' saves leaves one ahead; it is said, not paired silently)."""
    folders = {
        role.name: role.megatron.load
        for role in cfg.training_roles
        if role.megatron.load and not role.megatron.finetune
    }
    try:
        iteration, note = ml.common_iteration(folders)
    except ml.CheckpointError as exc:
        raise UserError(str(exc)) from None
    if note:
        print(f"note: {note}", flush=True)
    return iteration


def check_environment() -> None:
    """Environment switches the workers read are valid (a typo would otherwise fail at the first rollout)."""
    try:
        compat_vllm.requested_weight_load()
    except ValueError as exc:
        raise UserError(str(exc)) from None


def check_tool_isolation(cfg: PPOConfig) -> None:
    """The tools can be isolated as rl_config.sandbox.isolation asks (bubblewrap runs here), or run without it
    because none of them runs model-written code; prints the note of a fallback or of isolation none."""
    from ...features.agent import agent_rollout_function
    from ...tools.isolation import IsolationUnavailable, choose
    from ...tools.registry import model_code_tools, resolve_tools

    rl = cfg.rl
    if agent_rollout_function(rl) != "tool_agent":
        return
    tools = resolve_tools(rl.tools, rl.tool_config_path)
    try:
        _, note = choose(rl.sandbox.isolation, model_code_tools(tools))
    except IsolationUnavailable as exc:
        raise UserError(f"rl_config.sandbox.isolation: bwrap: {exc}") from None
    if note:
        print(note if note.startswith("warning") else f"note: {note}", flush=True)


def check_teacher_tokenizer(cfg: PPOConfig) -> None:
    """The distillation teacher reads the student's token ids: its tokenizer must be the student's."""
    if cfg.teacher is None:
        return
    from ...utils.hf_tokenizer import load_tokenizer, tokenizer_difference

    mine, theirs = cfg.actor.megatron.tokenizer_name_or_path, cfg.teacher.megatron.tokenizer_name_or_path
    if os.path.abspath(mine) == os.path.abspath(theirs):
        return
    student = load_tokenizer(mine, "megatron_training.tokenizer_name_or_path")
    teacher = load_tokenizer(theirs, "teacher_config.tokenizer_name_or_path")
    reason = tokenizer_difference(student, teacher)
    if reason:
        raise UserError(
            f"teacher_config.tokenizer_name_or_path {theirs}: not the student's tokenizer ({mine}): {reason}; "
            "on-policy distillation scores the student's token ids, so teacher and student must share a tokenizer"
        )


def check_eval_suites(cfg: PPOConfig) -> None:
    """eval_config's suites read before any worker starts: a suite without usable rows is refused now."""
    if cfg.evaluation is None:
        return
    from ...evaluation.suites import run_suites
    from ...utils.hf_tokenizer import load_tokenizer

    tok_dir = cfg.actor.megatron.tokenizer_name_or_path
    run_suites(cfg, load_tokenizer(tok_dir, "megatron_training.tokenizer_name_or_path"))
    if cfg.evaluation.engines == "own":
        from ...rollout.engines.vllm_engine import vllm_unusable_reason

        why = vllm_unusable_reason(cfg.actor.model, cfg.generate, get_accelerator().kind)
        if why:
            raise UserError(f"eval_config.engines own runs vLLM: {why}; use engines rollout")


def preflight(cfg: PPOConfig) -> Optional[int]:
    """Every check above; returns the iteration a resume loads (None: the latest, or not a resume)."""
    check_environment()
    features.preflight(cfg, get_accelerator())  # what each feature needs of this device and its libraries
    check_tool_isolation(cfg)
    check_teacher_tokenizer(cfg)
    check_rollout_engine(cfg)
    check_eval_suites(cfg)
    iteration = resume_iteration(cfg)
    problems = []
    for role in cfg.roles:  # every role's problem at once: a resharded actor next to an unresharded critic
        try:
            check_role(role, iteration, role.trains)
        except UserError as exc:
            problems.append(str(exc))
    if problems:
        raise UserError("\n".join(problems))
    ref = cfg.rl.integrated_mode_config.ref_model_load_path
    layout = (cfg.actor.tp, cfg.actor.pp, cfg.actor.megatron.expert_model_parallel_size)
    if ref:
        iter_dir = check_checkpoint("rl_config.integrated_mode_config.ref_model_load_path", ref, layout)
        check_stored_model("rl_config.integrated_mode_config.ref_model_load_path", iter_dir, cfg.actor)
    else:
        check_recorded_reference(cfg, iteration, layout)
    return iteration


def check_recorded_reference(cfg: PPOConfig, iteration: Optional[int], layout: Tuple[int, int, int]) -> None:
    """A resume builds the reference from where the first run started (recorded in the actor's checkpoint):
    that folder must still fit the run, e.g. after the actor was resharded to another TP x PP."""
    am = cfg.actor.megatron
    if am.lora_r or not am.load or am.finetune or ml.read_tracker_or_none(am.load) in (None, "unreadable"):
        return  # (with LoRA the reference is the actor's base weights: no folder is read)
    try:
        _, iter_dir = ml.latest_iteration_dir(am.load, iteration)
        state = ml.safe_load(first_rank_file(iter_dir), mmap=True).get("trainer_state") or {}
    except (ml.CheckpointError, IndexError):
        return  # check_role has named the problem with this folder already
    origin = state.get("ref_from")
    if not origin:
        return
    key = f"the reference recorded in {am.load} (trainer_state.ref_from)"
    if not os.path.isdir(origin):
        raise UserError(
            f"{key}: {origin} no longer exists; set rl_config.integrated_mode_config."
            "ref_model_load_path to the reference weights"
        )
    try:
        check_checkpoint(key, origin, layout)
    except UserError as exc:
        raise UserError(
            f"{exc}\nthen set rl_config.integrated_mode_config.ref_model_load_path to the resharded folder"
        ) from None
