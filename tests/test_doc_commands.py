"""The training commands the docs and the configs' comments give, run as written (with dry_run=true: the config,
its overrides and the batch plan, nothing started): a command a reader copies must not exit 2 for a key that moved
or a spelling that changed. Placeholders (``<keys>``, ``[key=value]``, ``...``) are left out."""

import pathlib
import re
import shlex
from typing import List, Tuple

import pytest

from tests.conftest import ROOT

ENTRY = re.compile(r"cli/(train_ppo|train_rm|train_sft|train_dpo)\.py\s+--config-name\s")
SOURCES = ["README.md", "docs/*.md", "configs/*.yaml", "examples/**/*.sh"]


def commands() -> List[Tuple[str, str, List[str]]]:
    """(where, entry point, argv) of every training command in the sources; continuation lines joined."""
    found = []
    for pattern in SOURCES:
        for path in sorted(pathlib.Path(ROOT).glob(pattern)):
            lines = path.read_text(encoding="utf-8").splitlines()
            for number, line in enumerate(lines):
                match = ENTRY.search(line)
                if not match:
                    continue
                text = line[match.start() :]
                k = number
                while text.rstrip().endswith("\\") and k + 1 < len(lines):
                    k += 1
                    text = text.rstrip()[:-1] + " " + lines[k].lstrip("# ").strip()
                text = re.split(r"\s#|`|\|", text)[0]  # a comment, the end of inline code or of a table cell
                try:
                    words = shlex.split(text)
                except ValueError:
                    continue
                argv = [w for w in words[1:] if not re.search(r"[<>\[\]]|\.\.\.|^\$|&&|;", w)]
                where = f"{path.relative_to(ROOT)}:{number + 1}"
                found.append((where, match.group(1), argv))
    return found


COMMANDS = commands()


def test_the_docs_give_commands_to_check():
    assert len(COMMANDS) > 20 and {entry for _, entry, _ in COMMANDS} == {
        "train_ppo",
        "train_rm",
        "train_sft",
        "train_dpo",
    }


@pytest.mark.parametrize("where, entry, argv", COMMANDS, ids=[w for w, _, _ in COMMANDS])
def test_a_documented_training_command_validates_as_written(where, entry, argv, capsys):
    import importlib

    main = importlib.import_module(f"cli.{entry}").main
    assert main(argv + ["dry_run=true"]) == 0, (where, argv, capsys.readouterr().err)
