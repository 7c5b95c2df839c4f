"""Path and environment probes: the files and folders a run needs, and the devices of one node."""

from __future__ import annotations

import glob
import os
from typing import TYPE_CHECKING, List, Mapping, Optional

from ...config_cls.base import ConfigError
from ...config_cls.run_config import role_key
from ...datasets.images import has_image_processor
from ...datasets.indexed_files import field_prefix, holds_images

DEMO_ASSETS = "demo_assets"

if TYPE_CHECKING:
    from ...config_cls.ppo_config import PPOConfig, RoleConfig
    from ...config_cls.stage_config import StageConfig


def missing_paths(cfg: "PPOConfig | StageConfig") -> List[ConfigError]:
    """Files and folders the run needs that do not exist (errors naming their keys)."""
    problems: List[ConfigError] = []
    seen = set()
    for role in cfg.roles:
        m = role.megatron
        checks = [("tokenizer_name_or_path", m.tokenizer_name_or_path, "folder"), ("load", m.load, "folder")]
        if role is cfg.roles[0]:  # the actor, or the reward model of reward-model training: the role that reads data
            checks.append(("data_path", m.data_path, "dataset prefix"))
            if m.test_data_path and cfg.rl.test_freq > 0:  # else it is not read
                checks.append(("test_data_path", m.test_data_path, "dataset prefix"))
        for key, value, what in checks:
            full = role_key(role, key) if key in _explicit(cfg, role) else f"megatron_training.{key}"
            if key == "load" and value and not m.finetune and not os.path.exists(value):
                resume = "finetune false resumes from it (a new run: finetune true)"
                problems.append(ConfigError(full, f"folder {value!r} does not exist, and {resume}"))
                continue
            if (full, value) in seen:
                continue
            seen.add((full, value))
            if value is None:
                if key in ("tokenizer_name_or_path", "data_path"):
                    problems.append(ConfigError(full, "required to run (not only for dry_run)"))
                continue
            exists = os.path.exists(value) or (what == "dataset prefix" and glob.glob(value + "*"))
            if not exists:
                problems.append(ConfigError(full, f"{what} {value!r} does not exist{_demo_hint(value)}"))
            elif key == "tokenizer_name_or_path" and role.model.vision_config and not has_image_processor(value):
                problems.append(
                    ConfigError(
                        full,
                        f"{value!r} has no preprocessor_config.json or processor_config.json: {m.model} takes images, "
                        "which vLLM and the trainer turn into pixel values with the model's image processor (a Hub "
                        f"folder holds it){_demo_hint(value)}",
                    )
                )
            elif what == "dataset prefix" and not role.model.vision_config and holds_images(value):
                problems.append(images_for_a_text_model(full, value, role))
    judge = getattr(cfg, "judge", None)
    if judge is not None and judge.serve == "engines" and judge.load and not os.path.exists(judge.load):
        problems.append(
            ConfigError("judge_config.load", f"folder {judge.load!r} does not exist{_demo_hint(judge.load)}")
        )
    if judge is not None and judge.template_file:
        if not os.path.isfile(judge.template_file):
            problems.append(ConfigError("judge_config.template_file", f"file {judge.template_file!r} does not exist"))
        elif "{response}" not in open(judge.template_file, encoding="utf-8", errors="replace").read():
            problems.append(
                ConfigError(
                    "judge_config.template_file",
                    f"{judge.template_file!r} has no {{response}}: the judge would not see what it grades",
                )
            )
    refs = [("rl_config.integrated_mode_config.ref_model_load_path", cfg.rl.integrated_mode_config.ref_model_load_path)]
    dpo = getattr(cfg, "dpo", None)
    refs.append(("dpo_config.ref_model", dpo.ref_model if dpo is not None else ""))
    for key, ref in refs:
        if ref and not os.path.exists(ref):
            problems.append(ConfigError(key, f"folder {ref!r} does not exist"))
    gen = getattr(cfg, "generate", None)
    if gen is not None and gen.expert_map_path:
        problem = expert_map_problem(gen.expert_map_path, cfg.roles[0], gen.infer_expert_parallel_size)
        if problem is not None:
            problems.append(problem)
    return problems


def images_for_a_text_model(key: str, prefix: str, role: "RoleConfig") -> ConfigError:
    """A dataset with images for a model without a vision tower (vLLM would refuse the first request). The reverse,
    a vision-language model on text rows, is legitimate: its prompts simply carry no images."""
    return ConfigError(
        key,
        f"{prefix!r} holds images ({field_prefix(prefix, 'images')}.bin) and the {role.name}'s model "
        f"{role.megatron.model} ({role.model.model_type_hf}) reads text only: use a vision-language model "
        "(docs/vision.md), or a dataset preprocessed without map_keys.image",
    )


def expert_map_problem(path: str, actor: "RoleConfig", infer_ep: int) -> Optional[ConfigError]:
    """generate_config.expert_map_path: what does not fit the actor's model (its MoE layers, its experts) or the
    rollout's expert parallelism (one device list per EP rank), else why the engines cannot load it; None when
    they can (vllm-ascend, with EP > 1)."""
    import json

    from ...compat.stack import expert_map_unavailable
    from ...rollout.experts.expert_placement import read_expert_map

    key, model = "generate_config.expert_map_path", actor.model
    if not model.num_experts:
        return ConfigError(key, f"the actor's model {actor.megatron.model} has no experts")
    try:
        with open(path, encoding="utf-8") as fh:
            placements = read_expert_map(json.load(fh), model.moe_layers, model.num_experts)
    except (OSError, ValueError) as exc:
        return ConfigError(key, f"{path}: {getattr(exc, 'strerror', None) or exc}")
    if infer_ep > 1 and len(placements[0]) != infer_ep:
        return ConfigError(
            key,
            f"{path} places the experts on {len(placements[0])} devices; the rollout's expert parallelism spans "
            f"{infer_ep} (generate_config.infer_expert_parallel_size): make it with --num-devices {infer_ep}",
        )
    unavailable = expert_map_unavailable(infer_ep)
    return ConfigError(key, unavailable) if unavailable else None


def _demo_hint(path: str) -> str:
    """How to make a missing path of the embedded demos (their configs point into ./demo_assets)."""
    if DEMO_ASSETS not in os.path.normpath(path).split(os.sep):
        return ""
    return (
        f" (the embedded demos' assets: `python cli/prepare_demo.py` makes them under ./{DEMO_ASSETS}, "
        "`python cli/prepare_demo.py --tools` also the tool-use task's, `--sft` the SFT examples, "
        "`python cli/prepare_demo.py --pairs` the "
        "preference pairs of reward-model training, `python cli/prepare_demo.py --judge` the judge model, "
        "`python cli/prepare_demo.py --vision` the vision task, `--vision-qwen3` its Qwen3-VL twin)"
    )


def _explicit(cfg: "PPOConfig | StageConfig", role: RoleConfig) -> set:
    section = cfg.raw.get(f"{role.name}_config") or {}
    return set(section) if isinstance(section, Mapping) else set()


def devices_per_node() -> int:
    """Devices of one node as the launcher says (NPUS_PER_NODE), 16 by default (an Atlas A3 node)."""
    value = os.environ.get("NPUS_PER_NODE", "16")
    try:
        return max(1, int(value))
    except ValueError:
        raise ConfigError("NPUS_PER_NODE", f"environment variable must be an integer, got {value!r}") from None
