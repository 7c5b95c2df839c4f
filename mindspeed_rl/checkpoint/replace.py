"""A converter's new checkpoint taking the place of the one already in a folder: written into a staging folder
inside it, then swapped in by renames so that a crash leaves either checkpoint whole, never a mix of the two
layouts. HF copies and other files beside the checkpoint (``iter_*_hf``) are left alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from typing import Iterator, List

from .megatron_layout import TRACKER, CheckpointError

_CHECKPOINT_ENTRY = re.compile(r"^(iter_\d+|release)(\.tmp)?$")
CONVERT_STAGING = ".convert.tmp"  # a converter's whole new checkpoint, inside the folder it replaces
REPLACED = ".replaced.tmp"  # the old checkpoint while the new one takes its place


def checkpoint_entries(ckpt_dir: str) -> List[str]:
    """The names that make up the Megatron checkpoint in ``ckpt_dir``: the tracker and every iteration folder
    (staging folders of interrupted saves included). HF copies beside them (``iter_*_hf``) and other files
    are not part of it."""
    names = sorted(os.listdir(ckpt_dir)) if os.path.isdir(ckpt_dir) else []
    return [n for n in names if n in (TRACKER, TRACKER + ".part") or _CHECKPOINT_ENTRY.match(n)]


@contextlib.contextmanager
def replacing(ckpt_dir: str) -> Iterator[str]:
    """The folder a converter writes a whole checkpoint into: ``ckpt_dir`` itself when it holds none, else a
    staging folder inside it whose checkpoint, once complete, replaces the old one entirely (every iteration
    and the tracker; replace_checkpoint). A failed conversion removes the staging folder and leaves the old
    checkpoint as it was."""
    aside = os.path.join(ckpt_dir, REPLACED)
    if os.path.exists(aside):
        raise CheckpointError(
            f"{ckpt_dir}: an earlier replacement of this checkpoint was interrupted: the old checkpoint is in "
            f"{aside}, the rest of the new one in {os.path.join(ckpt_dir, CONVERT_STAGING)}; move back the one "
            "to keep and remove both folders"
        )
    if not checkpoint_entries(ckpt_dir):
        yield ckpt_dir
        return
    staged = os.path.join(ckpt_dir, CONVERT_STAGING)
    shutil.rmtree(staged, ignore_errors=True)  # an interrupted conversion's, never published
    try:
        yield staged
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    replace_checkpoint(ckpt_dir, staged)


def replace_checkpoint(ckpt_dir: str, staged: str) -> None:
    """Make the complete checkpoint in ``staged`` (a folder inside ``ckpt_dir``) the only one in ``ckpt_dir``,
    by renames: the old tracker leaves first (from then on no checkpoint is published), the old iteration
    folders follow it aside, the new ones come in and the new tracker last publishes them. A crash in between
    leaves no tracker and both checkpoints whole (aside and staged), never a mix of the two layouts."""
    aside = os.path.join(ckpt_dir, REPLACED)
    os.makedirs(aside)
    for name in sorted(checkpoint_entries(ckpt_dir), key=lambda n: n != TRACKER):
        os.replace(os.path.join(ckpt_dir, name), os.path.join(aside, name))
    for name in sorted(checkpoint_entries(staged), key=lambda n: n == TRACKER):
        os.replace(os.path.join(staged, name), os.path.join(ckpt_dir, name))
    shutil.rmtree(aside)
    shutil.rmtree(staged)
