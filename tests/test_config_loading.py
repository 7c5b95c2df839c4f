"""Hostile YAML files and overrides: each refused before a YAML library builds it, naming the file, exit 2."""

import glob
import os
import shutil
import subprocess
import time

import pytest

from cli import preprocess_data, train_ppo
from mindspeed_rl.config_cls.base import ConfigError
from mindspeed_rl.config_cls.yaml_guard import MAX_ALIAS_NODES, MAX_BYTES, MAX_DEPTH, check_yaml_file, load_yaml
from tests.conftest import PYTHON, ROOT

CONFIGS = os.path.join(ROOT, "configs")


def alias_bomb() -> str:
    """A 9-level "billion laughs": 700 bytes that expand to 9**9 strings."""
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    return "\n".join(lines) + "\n"


def nested(depth: int) -> str:
    """A mapping holding ``depth`` levels in all (the top-level mapping included)."""
    return "x: " + "[" * (depth - 1) + "]" * (depth - 1) + "\n"


HOSTILE = {
    "alias_bomb": (alias_bomb().encode(), f"aliases (*a3 and the ones before) expand to more than {MAX_ALIAS_NODES:,}"),
    "nested_brackets": (b"x: " + b"[" * 20000 + b"]" * 20000 + b"\n", "is nested more than 32 levels deep"),
    "not_utf8": (b"rl_config:\n  gamma: 1.0\n  name: \xff\xfe\n", "is not UTF-8 text (byte 0xff at line 3, column 9)"),
    "over_size": (b"# " + b"x" * MAX_BYTES + b"\n", "is 1,048,579 bytes, over the limit of 1,048,576 bytes (1 MiB)"),
    "top_level_string": (b'"a: &a [1]\\nb: [*a, *a]"\n', "must be a mapping of keys at the top level, not a single"),
}


def config_dir(tmp_path, content: bytes) -> str:
    """A config folder: ``bad.yaml`` with ``content`` and the shipped model group for the defaults."""
    folder = tmp_path / "conf"
    shutil.copytree(os.path.join(CONFIGS, "model"), folder / "model")
    (folder / "bad.yaml").write_bytes(content)
    return str(folder)


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_config_file_exits_2_naming_the_file(case, tmp_path, capsys):
    content, words = HOSTILE[case]
    folder = config_dir(tmp_path, content)
    start = time.perf_counter()
    rc = train_ppo.main(["--config-path", folder, "--config-name", "bad", "dry_run=true"])
    elapsed = time.perf_counter() - start
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith(f"config error: {folder}/bad.yaml")
    assert words in err and "Traceback" not in err
    assert elapsed < 5  # refused before any parser builds it


def test_an_alias_bomb_through_the_cli_process_exits_2_in_seconds_within_a_memory_cap(tmp_path):
    import resource

    folder = config_dir(tmp_path, alias_bomb().encode())
    cap = 4 * 1024**3  # a regression fails on this cap instead of taking the machine's memory

    start = time.perf_counter()
    proc = subprocess.run(
        [PYTHON, "cli/train_ppo.py", "--config-path", folder, "--config-name", "bad", "dry_run=true"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (cap, cap)),
    )
    elapsed = time.perf_counter() - start
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(f"config error: {folder}/bad.yaml, line 5, column ")
    assert "Traceback" not in proc.stderr
    assert elapsed < 30  # typically ~2 s, the interpreter's start-up


def test_mappings_nested_to_the_limit_load_without_a_recursion_error(tmp_path, capsys):
    nested_mappings = "extra: " + "{a: " * (MAX_DEPTH - 1) + "1" + "}" * (MAX_DEPTH - 1) + "\n"
    folder = config_dir(
        tmp_path, open(os.path.join(CONFIGS, "ppo_tiny_cpu.yaml"), "rb").read() + nested_mappings.encode()
    )
    assert train_ppo.main(["--config-path", folder, "--config-name", "bad", "dry_run=true"]) == 2
    assert capsys.readouterr().err.strip() == "config error: extra: unknown section"  # read in full, then judged


def test_a_hostile_file_in_the_defaults_list_is_named(tmp_path, capsys):
    folder = tmp_path / "conf"
    shutil.copytree(os.path.join(CONFIGS, "model"), folder / "model")
    shutil.copy(os.path.join(CONFIGS, "ppo_tiny_cpu.yaml"), folder)
    (folder / "model" / "tiny_qwen25.yaml").write_text(alias_bomb())
    assert train_ppo.main(["--config-path", str(folder), "--config-name", "ppo_tiny_cpu", "dry_run=true"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"config error: {folder}/model/tiny_qwen25.yaml, line 5, column ")


def test_a_hostile_model_file_outside_the_defaults_is_named(tmp_path, capsys):
    folder = tmp_path / "conf"
    shutil.copytree(os.path.join(CONFIGS, "model"), folder / "model")
    shutil.copy(os.path.join(CONFIGS, "ppo_tiny_cpu.yaml"), folder)
    (folder / "model" / "qwen25_7b.yaml").write_bytes(b"x: \xff\n")
    argv = [
        "--config-path",
        str(folder),
        "--config-name",
        "ppo_tiny_cpu",
        "dry_run=true",
        "actor_config.model=qwen25_7b",
    ]
    assert train_ppo.main(argv) == 2
    assert capsys.readouterr().err.startswith(f"config error: {folder}/model/qwen25_7b.yaml: is not UTF-8 text")


def test_a_deeply_nested_override_exits_2_naming_the_key(capsys):
    base = ["--config-name", "ppo_tiny_cpu", "dry_run=true"]
    assert train_ppo.main(base + ["rl_config.gamma=" + "[" * 20000 + "]" * 20000]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "config error: rl_config.gamma: the override's value is nested more than 32 levels deep"
    # at the limit the override is parsed and refused for its type, not for its depth
    assert train_ppo.main(base + ["rl_config.gamma=" + "[" * MAX_DEPTH + "]" * MAX_DEPTH]) == 2
    assert "expected a number" in capsys.readouterr().err
    quoted = "rl_config.gamma='" + "[" * 200 + "'"  # brackets in a quoted string do not nest
    assert train_ppo.main(base + [quoted]) == 2
    assert "nested" not in capsys.readouterr().err


def test_a_huge_override_exits_2_naming_the_key(capsys):
    assert train_ppo.main(["--config-name", "ppo_tiny_cpu", "dry_run=true", "rl_config.gamma=" + "1" * MAX_BYTES]) == 2
    assert capsys.readouterr().err.startswith("config error: rl_config.gamma: the override is 1,048,592 characters")


def test_a_hostile_dataset_config_or_override_exits_2_naming_it(tmp_path, capsys):
    bad = tmp_path / "data.yaml"
    bad.write_text(alias_bomb())
    assert preprocess_data.main([str(bad), "--quiet"]) == 2
    assert capsys.readouterr().err.startswith(f"config error: {bad}, line 5, column ")
    assert preprocess_data.main(["gsm8k", "input=" + "[" * 20000, "--quiet"]) == 2
    assert capsys.readouterr().err.startswith("config error: input, line 1, column 33: is nested more than 32")
    flow_bomb = "{" + alias_bomb().strip().replace("\n", ", ") + "}"  # the same bomb on one line
    assert preprocess_data.main(["gsm8k", "map_keys=" + flow_bomb, "--quiet"]) == 2
    assert capsys.readouterr().err.startswith("config error: map_keys, line 1, column 231: aliases (*a3")


def test_the_guard_passes_every_shipped_config_and_returns_its_text():
    files = sorted(glob.glob(os.path.join(CONFIGS, "**", "*.yaml"), recursive=True))
    assert len(files) > 20
    for path in files:
        assert check_yaml_file(path) == open(path, encoding="utf-8").read()


def test_the_guards_limits_are_where_it_says(tmp_path):
    def check(text: str) -> None:
        path = tmp_path / "c.yaml"
        path.write_text(text)
        check_yaml_file(str(path))

    check(nested(MAX_DEPTH))
    with pytest.raises(ConfigError, match=f"c.yaml, line 1, column {MAX_DEPTH + 3}: is nested more than 32"):
        check(nested(MAX_DEPTH + 1))
    # an anchor of 99 values and a list of 100 aliases to it: 100 x 100 nodes, the limit exactly
    anchor = "a: &a [" + ", ".join(["v"] * 99) + "]\n"
    check(anchor + "b: [" + ", ".join(["*a"] * 100) + "]\n")
    with pytest.raises(ConfigError, match="aliases \\(\\*a and the ones before\\) expand to more than 10,000 nodes"):
        check(anchor + "b: [" + ", ".join(["*a"] * 101) + "]\n")
    check("base: &base {lr: 1.0e-6, wd: 0.0}\nactor: {<<: *base, lr: 2.0e-6}\ncritic: *base\n")  # ordinary use
    check("")  # an empty file is an empty config
    (tmp_path / "c.yaml").write_bytes(b"x" * MAX_BYTES)
    with pytest.raises(ConfigError, match="must be a mapping"):  # at the size limit: read, then judged
        check_yaml_file(str(tmp_path / "c.yaml"))
    with pytest.raises(ConfigError, match="c.yaml, line 2, column 2: is not valid YAML"):
        check("a: [1\nb: 2\n")
    with pytest.raises(ConfigError, match="must be a mapping of keys at the top level, not a list"):
        check("- a\n- b\n")
    with pytest.raises(ConfigError, match="nope.yaml: cannot be read"):
        check_yaml_file(str(tmp_path / "nope.yaml"))


def test_load_yaml_reads_through_the_guard_and_names_the_file(tmp_path):
    path = tmp_path / "runtime_env.yaml"
    path.write_text("env_vars:\n  A: &a '1'\n  B: *a\n")
    assert load_yaml(str(path)) == {"env_vars": {"A": "1", "B": "1"}}
    path.write_text(alias_bomb())
    with pytest.raises(ConfigError, match=f"{path}, line 5, column 10: aliases"):
        load_yaml(str(path))
    path.write_text("a: ${nope}\n")
    with pytest.raises(ConfigError, match=f"{path}: cannot resolve: Interpolation key 'nope' not found"):
        load_yaml(str(path))


def test_composing_restores_hydras_file_source(tmp_path, capsys):
    from hydra._internal.core_plugins.file_config_source import FileConfigSource
    from hydra._internal.sources_registry import SourcesRegistry

    folder = config_dir(tmp_path, alias_bomb().encode())
    assert train_ppo.main(["--config-path", folder, "--config-name", "bad", "dry_run=true"]) == 2
    assert SourcesRegistry.instance().resolve("file") is FileConfigSource
    assert train_ppo.main(["--config-name", "ppo_tiny_cpu", "dry_run=true"]) == 0  # a shipped config still loads
    assert "model tiny_qwen25" in capsys.readouterr().out


# where the relative paths of a dataset config are read (examples/data/preprocess_data.sh)


def test_a_missing_input_is_named_with_the_folder_it_was_looked_for_in(tmp_path, monkeypatch):
    from mindspeed_rl.datasets.readers import InputError, input_files

    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError) as caught:
        input_files("raw/train.jsonl")
    assert str(caught.value) == f"input raw/train.jsonl ({tmp_path}/raw/train.jsonl): no such file or folder"
    with pytest.raises(InputError) as caught:
        input_files(f"{tmp_path}/train.jsonl")  # an absolute path is named once
    assert str(caught.value) == f"input {tmp_path}/train.jsonl: no such file or folder"


def test_the_preprocess_script_says_where_relative_paths_are_read_from(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    dataset = tmp_path / "my_data.yaml"
    shutil.copy(os.path.join(CONFIGS, "datasets", "gsm8k.yaml"), dataset)
    start = time.perf_counter()
    proc = subprocess.run(
        [
            "bash",
            os.path.join(ROOT, "examples", "data", "preprocess_data.sh"),
            str(dataset),
            "input=raw/train.jsonl",
            f"output_prefix={tmp_path}/out/train",
        ],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": PYTHON},
        timeout=60,
    )
    elapsed = time.perf_counter() - start
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout.splitlines()[0] == (
        f"[preprocess_data] running in {ROOT}: relative paths in the dataset config and the overrides are read "
        "from there"
    )
    assert proc.stderr.strip() == f"error: input raw/train.jsonl ({ROOT}/raw/train.jsonl): no such file or folder"
    assert not os.path.exists(tmp_path / "out")  # refused before the output folder is made
    assert elapsed < 30  # typically well under a second


def test_an_interpolation_bomb_or_cycle_is_refused_naming_the_key_before_resolving(tmp_path, capsys):
    """Aliases' twin: each level of ${...} references multiplies the resolved size; refused in milliseconds."""
    from mindspeed_rl.config_cls.base import ConfigError
    from mindspeed_rl.config_cls.yaml_guard import check_interpolations, load_yaml

    refs = ['"${a%d}"' % (i - 1) for i in range(1, 9)]
    levels = ["a0: xxxxxxxxxx"] + [f"a{i}: [" + ", ".join([refs[i - 1]] * 9) + "]" for i in range(1, 9)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(levels) + "\n")
    start = time.process_time()  # the work done, not the wall clock of a loaded host
    with pytest.raises(ConfigError, match=r"a7: .*resolve to more than 8,388,608"):
        load_yaml(str(bomb))
    assert time.process_time() - start < 2
    folder = config_dir(tmp_path, bomb.read_bytes())  # the composed config of a run, through the CLI
    assert train_ppo.main(["--config-path", folder, "--config-name", "bad", "dry_run=true"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("config error: a7: its interpolations") and "bad" in err and "Traceback" not in err
    with pytest.raises(ConfigError, match="interpolation cycle"):
        check_interpolations({"a": "${b}", "b": {"c": "${a}"}}, "cycle.yaml")
    check_interpolations({"a": {"b": 1, "c": "${.b}", "d": "${a.b}-${oc.env:HOME}"}, "e": ["${a}"]}, "fine.yaml")
    chain = {"a0": 1, **{f"a{i}": f"${{a{i - 1}}}" for i in range(1, 3000)}}
    check_interpolations(chain, "chain.yaml")  # long chains resolve to little: accepted, without recursion
