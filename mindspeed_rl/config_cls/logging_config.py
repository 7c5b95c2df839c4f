"""The logging keys of ``rl_config`` (flat, as MindSpeed-RL spells them): console, library output, the run
folder, and the experiment trackers (TensorBoard, Weights & Biases, SwanLab)."""

from __future__ import annotations

from dataclasses import dataclass

from .base import opt

# rl_config.swanlab -> swanlab.init's mode
SWANLAB_MODES = {"local": "local", "offline": "offline", "cloud": "online"}


@dataclass
class LoggingKeys:
    """Where each iteration's metrics and the libraries' output go."""

    console_metrics: bool = opt(
        False,
        "Print every metric on the console each iteration, after the compact line "
        "(they always go to metrics.jsonl and the trackers switched on).",
    )
    library_logs: str = opt(
        "file",
        "Where vLLM, Ray, megatron-core and torch output goes: file (run_dir/logs/<role>_<rank>.log "
        "and driver.log; errors and warnings that matter still reach the console) or "
        "console (everything on the console, as the libraries print it).",
        choices=("file", "console"),
    )
    use_tensorboard: bool = opt(False, "Write every metric to tensorboard.")
    use_wandb: bool = opt(False, "Log to Weights & Biases (offline mode works without network).")
    wandb_project: str = opt("mindspeed_rl", "wandb project.")
    wandb_exp_name: str = opt("ppo", "wandb run name.")
    wandb_save_dir: str = opt("./wandb", "wandb files folder.")
    use_swanlab: bool = opt(False, "Log every metric to SwanLab (the local and offline modes need no network).")
    swanlab: str = opt(
        "local",
        "SwanLab's mode: local (saved under swanlab_save_dir, viewed with `swanlab watch <dir>`), offline "
        "(saved, uploaded later with `swanlab sync`) or cloud (uploaded as it runs: `swanlab login` first).",
        choices=tuple(SWANLAB_MODES),
    )
    swanlab_project: str = opt("mindspeed_rl", "SwanLab project.")
    swanlab_exp_name: str = opt("ppo", "SwanLab experiment name.")
    swanlab_save_dir: str = opt("./swanlog", "SwanLab's log folder.")
    log_dir: str = opt("./logs", "Run folder root: metrics.jsonl, tensorboard, curves.")
