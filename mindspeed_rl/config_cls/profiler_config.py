"""profiler_config: where a slow iteration goes, per role (MindSpeed-RL's section and key names).

    profiler_config:
      integrated:            # MindSpeed-RL's name for the actor (its generation, log-probs and update); or actor
        profile: true
        stage: actor_update  # all, one stage, or a list
        profile_step_start: 2
        profile_step_end: 3  # iterations [start, end): iteration 2
      critic:
        profile: true

A profiled stage's calls are traced by the device's profiler (torch.profiler on CPU and CUDA, torch_npu's on NPU)
into ``profile_save_path`` (default: the run folder's ``profiler/``) per role, rank, stage and iteration; the run
report lists each stage's top operators. ``mstx`` alone marks our phases with named ranges (mstx on NPU, NVTX on
CUDA, record_function on CPU), for a lightweight timeline in any profiler.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from .base import ConfigError, build_section, opt

ROLE_STAGES: Dict[str, Tuple[str, ...]] = {
    "actor": (
        "actor_generate",
        "actor_compute_log_prob",
        "reference_compute_log_prob",
        "actor_update",
        "actor_resharding",
    ),
    "critic": ("critic_compute_values", "critic_update"),
}
ROLE_NAMES = {"integrated": "actor", "actor": "actor", "critic": "critic"}  # section key -> role


@dataclass
class RoleProfilerConfig:
    """How one role's stages are profiled."""

    profile: bool = opt(False, "Profile this role's chosen stages (every other key depends on it, but mstx).")
    mstx: bool = opt(False, "Mark our phases with named ranges (mstx on NPU, NVTX on CUDA, record_function on CPU).")
    stage: Union[str, List[str]] = opt("all", "all, one stage of the role, or a list of them.")
    profile_save_path: str = opt("", "Where the traces go (default: the run folder's profiler/).")
    profile_export_type: str = opt(
        "text", "text (a Chrome trace) or db (NPU: the profiler's database).", choices=("text", "db")
    )
    profile_step_start: int = opt(1, "The first iteration profiled (1 = the run's first).", ge=1)
    profile_step_end: int = opt(2, "The iteration profiling stops before (exclusive).", ge=2)
    profile_level: str = opt(
        "level0",
        "NPU: the profiler's level; on CPU and CUDA level_none traces nothing (ranges only).",
        choices=("level_none", "level0", "level1", "level2"),
    )
    profile_with_memory: bool = opt(False, "Record tensor memory.")
    profile_record_shapes: bool = opt(False, "Record operator input shapes.")
    profile_with_cpu: bool = opt(True, "Trace host-side operators.")
    profile_with_npu: bool = opt(True, "Trace device-side kernels (NPU, CUDA).")
    profile_with_module: bool = opt(False, "Record Python call stacks.")
    profile_analysis: bool = opt(False, "NPU: parse the trace when it is written.")
    profile_ranks: Union[str, List[int]] = opt("all", "all, or a list of the role's ranks to profile.")

    def check_role(self, path: str, role: str) -> None:
        """The rules across keys, and the stage names of ``role``."""
        if self.profile_step_end <= self.profile_step_start:
            raise ConfigError(
                f"{path}.profile_step_end",
                f"{self.profile_step_end} must be after profile_step_start {self.profile_step_start} (it is exclusive)",
            )
        known = ROLE_STAGES[role]
        for name in self.stages_given():
            if name != "all" and name not in known:
                raise ConfigError(f"{path}.stage", f"unknown stage {name!r}; the {role}'s are all, {', '.join(known)}")
        ranks = self.profile_ranks
        if ranks != "all" and not (
            isinstance(ranks, list)
            and ranks
            and all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks)
        ):
            raise ConfigError(f"{path}.profile_ranks", f"got {ranks!r}, expected all or a list of ranks (0, 1, ...)")

    def stages_given(self) -> List[str]:
        return [self.stage] if isinstance(self.stage, str) else list(self.stage)

    def stages(self, role: str) -> Tuple[str, ...]:
        given = self.stages_given()
        return ROLE_STAGES[role] if "all" in given else tuple(given)

    def traces(self) -> bool:
        """A profiler runs (else at most ranges)."""
        return self.profile and self.profile_level != "level_none"

    def profiles_rank(self, rank: int) -> bool:
        return self.profile_ranks == "all" or rank in self.profile_ranks

    def profiles_iteration(self, iteration: int) -> bool:
        return self.profile_step_start <= iteration < self.profile_step_end


@dataclass
class ProfilerConfig:
    """The roles' profiler settings (a role left out is not profiled)."""

    roles: Dict[str, RoleProfilerConfig] = field(default_factory=dict)
    keys: Dict[str, str] = field(default_factory=dict, repr=False)  # role -> the section key it came from

    def of(self, role: str) -> Optional[RoleProfilerConfig]:
        return self.roles.get(role)

    def check_ranks(self, devices: Mapping[str, int], path: str = "profiler_config") -> None:
        """Each role's profile_ranks within its world (``devices``: role -> its ranks)."""
        for role, key in self.keys.items():
            ranks = self.roles[role].profile_ranks
            world = devices.get(role, 0)
            if not world:
                raise ConfigError(f"{path}.{key}", f"profiles the {role}, which this run does not start")
            beyond = [r for r in ranks if isinstance(r, int) and r >= world] if isinstance(ranks, list) else []
            if beyond:
                raise ConfigError(
                    f"{path}.{key}.profile_ranks", f"rank {beyond[0]} is beyond the {role}'s {world} ranks"
                )


def build_profiler_config(data: Any, path: str = "profiler_config") -> ProfilerConfig:
    """The section: role keys (integrated or actor, critic) mapping to RoleProfilerConfig keys."""
    if data is None:
        return ProfilerConfig()
    if not isinstance(data, Mapping):
        raise ConfigError(path, f"must map roles ({', '.join(ROLE_NAMES)}) to their profiler keys, got {data!r}")
    out = ProfilerConfig()
    for key, section in data.items():
        if key not in ROLE_NAMES:
            raise ConfigError(f"{path}.{key}", f"unknown role; profiled roles are {', '.join(ROLE_NAMES)}")
        role = ROLE_NAMES[key]
        if role in out.roles:
            raise ConfigError(f"{path}.{key}", f"the {role} is given twice ({out.keys[role]} and {key})")
        settings = build_section(RoleProfilerConfig, section, f"{path}.{key}")
        settings.check_role(f"{path}.{key}", role)
        if settings.profile_save_path:  # the driver's working directory, not each worker's
            settings.profile_save_path = os.path.abspath(settings.profile_save_path)
        out.roles[role], out.keys[role] = settings, key
    return out
