"""The Megatron checkpoint layout on disk.

    <dir>/latest_checkpointed_iteration.txt        "release" or an iteration number
    <dir>/iter_0000200/mp_rank_00/model_optim_rng.pt        (TP rank 00, PP = 1)
    <dir>/iter_0000200/mp_rank_01_002/model_optim_rng.pt    (TP rank 01, PP rank 002)
    <dir>/iter_0000200/mp_rank_01_001/model_optim_rng.pt    (TP rank 01, expert-parallel rank 001, PP = 1)
    <dir>/iter_0000200/mp_rank_01_002_001/model_optim_rng.pt (TP 01, PP 002, EP 001)
    <dir>/release/...                                      (converted weights, no training state)

With expert parallelism (EP > 1) Megatron appends the EP rank to the name, so at PP = 1 a name with two
numbers is TP and EP: the stored config's ``expert_model_parallel_size`` tells the two apart. Each EP
rank's file holds its own experts (numbered locally, as megatron-core holds them) and the replicated rest.
Each file holds the rank's model shard and, from training, its optimizer shard, RNG states,
iteration, consumed samples and the config. Saving writes into ``<iter>.tmp``, renames it to
``<iter>`` once every rank has written, then replaces the tracker file: a crash leaves either
the previous complete checkpoint or the new complete one, never a half-written one that looks
complete.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

TRACKER = "latest_checkpointed_iteration.txt"
FILE = "model_optim_rng.pt"
CHECKPOINT_VERSION = 3.0
_RANK_DIR = re.compile(r"^mp_rank_(\d+)(?:_(\d+))?(?:_(\d+))?$")


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, incomplete, or laid out differently from the run."""


def iteration_dir_name(iteration: Union[int, str]) -> str:
    return "release" if iteration == "release" else f"iter_{int(iteration):07d}"


def rank_dir_name(tp_rank: int, pp_rank: int, pp: int, ep_rank: int = 0, ep: int = 1) -> str:
    name = f"mp_rank_{tp_rank:02d}" if pp == 1 else f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"
    return name + f"_{ep_rank:03d}" if ep > 1 else name


def read_tracker(ckpt_dir: str) -> Optional[Union[int, str]]:
    """The tracker's iteration ('release' or int), or None when there is no checkpoint."""
    path = os.path.join(ckpt_dir, TRACKER)
    if not os.path.isfile(path):
        return None
    text = open(path, encoding="utf-8").read().strip()
    if text == "release":
        return "release"
    try:
        return int(text)
    except ValueError:
        raise CheckpointError(f"{path}: expected 'release' or an iteration number, found {text!r}") from None


def read_tracker_or_none(ckpt_dir: str) -> Optional[Union[int, str]]:
    """Like read_tracker, but a tracker that cannot be read counts as present (preflight then names it)."""
    try:
        return read_tracker(ckpt_dir)
    except CheckpointError:
        return "unreadable"


def latest_iteration_dir(ckpt_dir: str, iteration: Optional[int] = None) -> Tuple[Union[int, str], str]:
    """(iteration, folder) of the tracker's iteration, or of ``iteration`` when given (a resume that every
    role completed: see common_iteration)."""
    if iteration is not None:
        path = os.path.join(ckpt_dir, iteration_dir_name(iteration))
        if not os.path.isdir(path):
            raise CheckpointError(f"{ckpt_dir}: has no {iteration_dir_name(iteration)}")
        return iteration, path
    iteration = read_tracker(ckpt_dir)
    if iteration is None:
        raise CheckpointError(
            f"{ckpt_dir}: no {TRACKER}; not a Megatron checkpoint folder "
            f"(convert a HF model with cli/convert_ckpt.py --load-model-type hf)"
        )
    path = os.path.join(ckpt_dir, iteration_dir_name(iteration))
    if not os.path.isdir(path):
        raise CheckpointError(f"{ckpt_dir}: the tracker names {iteration_dir_name(iteration)}, which does not exist")
    return iteration, path


def layout_of(iter_dir: str) -> Tuple[int, int]:
    """(TP, PP) of the rank folders in an iteration folder."""
    return full_layout_of(iter_dir)[:2]


def full_layout_of(iter_dir: str) -> Tuple[int, int, int]:
    """(TP, PP, EP) of the rank folders in an iteration folder."""
    found = {}
    for name in os.listdir(iter_dir):
        m = _RANK_DIR.match(name)
        if m and os.path.isfile(os.path.join(iter_dir, name, FILE)):
            found[name] = tuple(int(g) if g is not None else 0 for g in m.groups())
    if not found:
        raise CheckpointError(f"{iter_dir}: no mp_rank_*/{FILE} files")
    ranks = set(found.values())
    two_numbers = [name for name, r in found.items() if name.count("_") == 3]
    if two_numbers and _saved_ep(os.path.join(iter_dir, two_numbers[0], FILE)) > 1:
        ranks = {(tp, 0, second) for tp, second, _ in ranks}  # mp_rank_TT_EEE: PP = 1
    tp, pp, ep = (max(r[k] for r in ranks) + 1 for k in range(3))
    if len(ranks) != tp * pp * ep:
        raise CheckpointError(f"{iter_dir}: rank folders are incomplete ({len(ranks)} of TP {tp} x PP {pp} x EP {ep})")
    return tp, pp, ep


def _saved_ep(path: str) -> int:
    """The expert-parallel size a rank file was saved with (1 when it does not say)."""
    config = safe_load(path, mmap=True).get("config") or {}
    return int(config.get("expert_model_parallel_size", 1))


def rank_file(iter_dir: str, tp_rank: int, pp_rank: int, pp: int, ep_rank: int = 0, ep: int = 1) -> str:
    return os.path.join(iter_dir, rank_dir_name(tp_rank, pp_rank, pp, ep_rank, ep), FILE)


def load_rank(
    ckpt_dir: str,
    tp_rank: int,
    pp_rank: int,
    expected: Optional[Tuple[int, ...]] = None,
    mmap: bool = True,
    ep_rank: int = 0,
    iteration: Optional[int] = None,
) -> Dict[str, Any]:
    """Load one rank's file of the latest checkpoint (or of ``iteration``), refusing a TP/PP(/EP) layout
    that differs."""
    _, iter_dir = latest_iteration_dir(ckpt_dir, iteration)
    _, pp, ep = checked_layout(ckpt_dir, iter_dir, expected)
    return safe_load(rank_file(iter_dir, tp_rank, pp_rank, pp, ep_rank, ep), mmap=mmap)


def checked_layout(ckpt_dir: str, iter_dir: str, expected: Optional[Tuple[int, ...]] = None) -> Tuple[int, int, int]:
    """(TP, PP, EP) of ``iter_dir``; a layout other than ``expected`` ((TP, PP) or (TP, PP, EP)) is refused
    with the command that reshards it."""
    tp, pp, ep = full_layout_of(iter_dir)
    want = tuple(expected) + (1,) * (3 - len(expected)) if expected is not None else None
    if want is not None and (tp, pp, ep) != want:
        from shlex import quote

        target = f"{ckpt_dir.rstrip('/')}_tp{want[0]}pp{want[1]}" + (f"ep{want[2]}" if want[2] > 1 else "")
        raise CheckpointError(
            f"{ckpt_dir} is saved with TP={tp}, PP={pp}, EP={ep} but the run uses TP={want[0]}, PP={want[1]}, "
            f"EP={want[2]}. Reshard it: python cli/convert_ckpt.py --load-model-type mg --save-model-type mg "
            f"--load-dir {quote(ckpt_dir)} --save-dir {quote(target)} "
            f"--target-tensor-parallel-size {want[0]} --target-pipeline-parallel-size {want[1]}"
            + (f" --target-expert-parallel-size {want[2]}" if want[2] > 1 or ep > 1 else "")
        )
    return tp, pp, ep


def write_extra(
    ckpt_dir: str,
    iteration: Union[int, str],
    tp_rank: int,
    pp_rank: int,
    pp: int,
    name: str,
    payload: Any,
    ep_rank: int = 0,
    ep: int = 1,
) -> str:
    """Write another file (e.g. a DP rank's optimizer shard) beside a rank's model file."""
    path = os.path.join(staging_dir(ckpt_dir, iteration), rank_dir_name(tp_rank, pp_rank, pp, ep_rank, ep), name)
    _save_staged(payload, path, ckpt_dir, iteration)
    return path


def load_extra(
    ckpt_dir: str, tp_rank: int, pp_rank: int, name: str, ep_rank: int = 0, iteration: Optional[int] = None
) -> Any:
    _, iter_dir = latest_iteration_dir(ckpt_dir, iteration)
    _, pp, ep = full_layout_of(iter_dir)
    path = os.path.join(iter_dir, rank_dir_name(tp_rank, pp_rank, pp, ep_rank, ep), name)
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: missing (saved with another data-parallel size?)")
    return safe_load(path)


def _numpy_array_globals() -> list:
    """What pickled numpy arrays need (RNG states of checkpoints written before they were saved as lists)."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        return []
    core = getattr(np, "_core", None) or np.core
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype("uint32"))]


def safe_load(path: str, mmap: bool = False) -> Any:
    """torch.load with ``weights_only=True`` (tensors and plain data only; a pickled object that would run
    code is refused). A truncated or corrupt file, or a refused one, is a CheckpointError naming ``path``."""
    import pickle

    try:
        with torch.serialization.safe_globals(_numpy_array_globals()):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()
        reason = next(
            (line.strip() for line in first if "Unsupported" in line or "GLOBAL" in line), first[0] if first else ""
        )
        raise CheckpointError(
            f"{path}: refused to load: it holds objects other than tensors and plain data "
            f"({reason}); only load checkpoints you trust"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: truncated or corrupt ({str(exc).strip().splitlines()[0][:200]})") from None


def staging_dir(ckpt_dir: str, iteration: Union[int, str]) -> str:
    return os.path.join(ckpt_dir, iteration_dir_name(iteration) + ".tmp")


def write_rank(
    ckpt_dir: str,
    iteration: Union[int, str],
    tp_rank: int,
    pp_rank: int,
    pp: int,
    payload: Dict[str, Any],
    ep_rank: int = 0,
    ep: int = 1,
) -> str:
    """Write one rank's file into the staging folder of ``iteration``."""
    path = os.path.join(staging_dir(ckpt_dir, iteration), rank_dir_name(tp_rank, pp_rank, pp, ep_rank, ep), FILE)
    _save_staged({"checkpoint_version": CHECKPOINT_VERSION, **payload}, path, ckpt_dir, iteration)
    return path


FULL_DISK_BYTES = 64 * 2**20  # torch's writer reports a full disk as "file write failed", not as ENOSPC


def _save_staged(payload: Any, path: str, ckpt_dir: str, iteration: Union[int, str]) -> None:
    """torch.save into the staging folder; a full disk removes the staging folder and says so."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.save(payload, path + ".part")
        os.replace(path + ".part", path)
    except (OSError, RuntimeError) as exc:
        if not _out_of_space(exc, ckpt_dir):
            raise
        shutil.rmtree(staging_dir(ckpt_dir, iteration), ignore_errors=True)
        latest = read_tracker_or_none(ckpt_dir)
        kept = (
            f"{iteration_dir_name(latest)} stays the latest checkpoint"
            if latest not in (None, "unreadable")
            else "no earlier checkpoint exists"
        )
        raise CheckpointError(
            f"no space left on {ckpt_dir} while saving {iteration_dir_name(iteration)}: its "
            f"staging files are removed and {kept}; free space and resume"
        ) from None


def _out_of_space(exc: BaseException, folder: str) -> bool:
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return True
    try:
        return shutil.disk_usage(folder).free < FULL_DISK_BYTES
    except OSError:
        return False


def begin_save(ckpt_dir: str, iteration: Union[int, str]) -> None:
    """Clear a staging folder left by an interrupted save (call on one rank, then barrier)."""
    os.makedirs(ckpt_dir, exist_ok=True)
    shutil.rmtree(staging_dir(ckpt_dir, iteration), ignore_errors=True)


def commit_save(ckpt_dir: str, iteration: Union[int, str], expected_files: int) -> str:
    """Publish the staged iteration (call on one rank after every rank has written)."""
    staged = staging_dir(ckpt_dir, iteration)
    found = sum(1 for root, _, files in os.walk(staged) for f in files if f.endswith(".pt"))
    if found != expected_files:
        raise CheckpointError(f"{staged}: {found} rank files written, {expected_files} expected; not published")
    final = os.path.join(ckpt_dir, iteration_dir_name(iteration))
    if os.path.isdir(final):
        shutil.rmtree(final)
    os.replace(staged, final)
    tracker = os.path.join(ckpt_dir, TRACKER)
    with open(tracker + ".part", "w", encoding="utf-8") as fh:
        fh.write(f"{iteration}\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tracker + ".part", tracker)
    return final


def list_iterations(ckpt_dir: str) -> List[int]:
    out = []
    for name in os.listdir(ckpt_dir) if os.path.isdir(ckpt_dir) else []:
        m = re.match(r"^iter_(\d{7})$", name)
        if m:
            out.append(int(m.group(1)))
    return sorted(out)


def common_iteration(folders: Dict[str, str]) -> Tuple[Optional[int], Optional[str]]:
    """The iteration every role's checkpoint folder completed, and a note when some role is ahead.

    Roles commit their checkpoints one after the other; a run stopped between two commits leaves, e.g., the
    actor at iteration 2 and the critic at 1. Resuming pairs them only at an iteration all of them hold:
    the oldest of the trackers, loaded from each folder's own ``iter_*`` (an older one is kept beside the
    newer). ``folders``: role name -> checkpoint folder. (None, None) when none holds a training iteration.
    """
    trackers = {role: read_tracker(folder) for role, folder in folders.items()}
    numbered = {role: it for role, it in trackers.items() if isinstance(it, int)}
    if not numbered:
        return None, None
    missing = [role for role in folders if role not in numbered]
    if missing:
        role = missing[0]
        raise CheckpointError(
            f"the {', '.join(sorted(numbered))} checkpoint is at iteration {max(numbered.values())} but the {role}'s "
            f"folder {folders[role]} holds {'no checkpoint' if trackers[role] is None else 'converted weights only'}: "
            f"resume every role from the same run, or set {role}_config.finetune=true to start the {role} afresh"
        )
    common = min(numbered.values())
    ahead = {role: it for role, it in numbered.items() if it > common}
    for role in ahead:
        if not os.path.isdir(os.path.join(folders[role], iteration_dir_name(common))):
            raise CheckpointError(
                f"the roles' checkpoints end at different iterations ({_listed(numbered)}: a save was interrupted) "
                f"and {folders[role]} no longer holds {iteration_dir_name(common)}: no iteration is complete for "
                "every role"
            )
    note = None
    if ahead:
        note = (
            f"the roles' checkpoints end at different iterations ({_listed(numbered)}: the last save was "
            f"interrupted); resuming every role from iteration {common}, the last one all of them completed"
        )
    return common, note


def _listed(numbered: Dict[str, int]) -> str:
    return ", ".join(f"{role} {it}" for role, it in numbered.items())
