"""Tools: the hermes parser, the built-in calculator and Python executor, and the sandbox's limits with tools
that raise, hang, spin, return 10 MB, eat memory, die, write outside their folder, connect or spawn, under
both isolations (bubblewrap where it runs, and a plain child process). What a hostile tool cannot do under
bubblewrap is in test_tool_isolation.py."""

import os

import pytest

from mindspeed_rl.tools import (
    BUILTIN_TOOLS,
    Sandbox,
    SandboxLimits,
    ToolCall,
    ToolConfigError,
    parse_hermes,
    resolve_tools,
)
from mindspeed_rl.tools.builtin import calculator, python
from mindspeed_rl.tools.isolation import bwrap_unavailable

LIMITS = SandboxLimits(timeout_s=4.0, cpu_seconds=2, memory_mb=512, max_result_bytes=4096, max_file_mb=8)


@pytest.fixture(scope="module", params=["none", "bwrap"])
def sandbox(request, tmp_path_factory):
    if request.param == "bwrap" and bwrap_unavailable():
        pytest.skip(f"bubblewrap cannot run on this machine: {bwrap_unavailable()}")
    return Sandbox(LIMITS, request.param, scratch_root=str(tmp_path_factory.mktemp("scratch")))


def run(sandbox, name, **arguments):
    return sandbox.run(f"tests.tool_plugins:{name}", arguments)


# ----- parser ------------------------------------------------------------------------------------------------
def test_hermes_parses_calls_in_order_and_flags_malformed_ones():
    text = (
        'Let me compute.<tool_call>\n{"name": "calculator", "arguments": {"expression": "37 * 91"}}\n</tool_call>'
        '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}</tool_call>'
    )
    turn = parse_hermes(text)
    assert turn.calls == [ToolCall("calculator", {"expression": "37 * 91"}), ToolCall("python", {"code": "print(1)"})]
    assert not turn.errors and turn.wants_tools
    assert not parse_hermes("The answer is 3367.").wants_tools
    bad = parse_hermes('<tool_call>{"name": calculator}</tool_call><tool_call>["x"]</tool_call><tool_call>{"name"')
    assert bad.calls == [] and len(bad.errors) == 3
    assert "not JSON" in bad.errors[0] and "expected" in bad.errors[1] and "without </tool_call>" in bad.errors[2]


# ----- registry ----------------------------------------------------------------------------------------------
def test_tools_resolve_by_name_path_and_file(tmp_path):
    specs = resolve_tools(["calculator", "tests.tool_plugins:echo"])
    assert specs["calculator"] == BUILTIN_TOOLS["calculator"]
    assert specs["echo"].function == "tests.tool_plugins:echo" and specs["echo"].parameters["required"] == ["text"]
    path = tmp_path / "tools.yaml"
    path.write_text("tools:\n  - name: shout\n    function: tests.tool_plugins.echo\n    description: Echo.\n")
    assert resolve_tools([], str(path))["shout"].function == "tests.tool_plugins:echo"
    with pytest.raises(ToolConfigError, match=r"rl_config.tools\[0\]: unknown tool 'calc'"):
        resolve_tools(["calc"])
    with pytest.raises(ToolConfigError, match="not marked with @tool"):
        resolve_tools(["tests.tool_plugins:raises"])
    with pytest.raises(ToolConfigError, match="cannot be imported"):
        resolve_tools(["no_such_module:fn"])
    with pytest.raises(ToolConfigError, match="tools.yaml: No such file"):
        resolve_tools([], str(tmp_path / "missing" / "tools.yaml"))


# ----- built-in tools ----------------------------------------------------------------------------------------
def test_calculator_is_exact_and_refuses_what_is_not_arithmetic():
    assert calculator("37 * 91") == "3367"
    assert calculator("(2 + 3) ** 3 - 7 // 2 % 3") == "125"
    assert calculator("1 / 4 + 0.5") == "0.75"
    assert calculator("2 ** 100") == str(2**100)
    for bad in ("__import__('os')", "2 ** 1000", "2 ** 0.5", "x + 1", ""):
        with pytest.raises(ValueError):
            calculator(bad)


def test_python_tool_returns_output_and_the_programs_own_errors():
    assert python("print(sum(range(10)))") == "45\n"
    assert python("print('a'); 1 / 0").endswith("ZeroDivisionError: division by zero\n")
    assert "SyntaxError" in python("def f(:")


# ----- the sandbox -------------------------------------------------------------------------------------------
def test_sandbox_runs_tools_and_encodes_structured_results(sandbox):
    ok = sandbox.run("mindspeed_rl.tools.builtin:calculator", {"expression": "37 * 91"})
    assert (ok.status, ok.content) == ("ok", "3367")
    assert run(sandbox, "structured").content == '{"value": 3, "unit": "apples"}'
    results = sandbox.run_many([("tests.tool_plugins:echo", {"text": str(i)}) for i in range(5)], parallel=2)
    assert [r.content for r in results] == ["0", "1", "2", "3", "4"]


def test_a_raising_tool_is_an_error_message(sandbox):
    result = run(sandbox, "raises")
    assert result.status == "error" and result.content == "Error: RuntimeError: the tool broke"
    wrong = run(sandbox, "echo", wrong="argument")
    assert wrong.status == "error" and "unexpected keyword argument" in wrong.content


def test_a_hanging_tool_times_out_and_a_spinning_one_hits_the_cpu_limit(sandbox):
    # side by side (the spinning one takes a CPU, the hanging one none): the test waits for the timeout once
    hung, spun = sandbox.run_many([("tests.tool_plugins:hangs", {}), ("tests.tool_plugins:spins", {})], parallel=2)
    assert hung.status == "timeout" and "within 4 s" in hung.content
    assert hung.seconds < LIMITS.timeout_s + 2
    assert spun.status == "timeout" and spun.seconds < LIMITS.timeout_s + 2


def test_oversized_results_and_printed_floods_never_reach_the_model(sandbox):
    big = run(sandbox, "huge")
    assert big.status == "oversized" and f"{10 << 20} bytes" in big.content and len(big.content) < 200
    flood = run(sandbox, "prints_a_lot")  # printed output goes to a scratch file, not into the result
    assert (flood.status, flood.content) == ("ok", "small")


def test_a_tool_that_closes_its_output_and_hangs_is_ended_with_its_answer(sandbox):
    result = run(sandbox, "answers_then_hangs")
    assert (result.status, result.content) == ("ok", "early") and result.seconds < 3


def test_memory_limit_and_a_dying_tool(sandbox):
    eaten = run(sandbox, "eats_memory")
    assert eaten.status == "error" and "out of memory (limit 512 MB)" in eaten.content
    died = run(sandbox, "dies")
    assert died.status == "crash" and "signal" in died.content


def test_no_writes_outside_scratch_no_network_no_subprocesses(sandbox, tmp_path):
    outside = tmp_path / "escaped.txt"
    refused = run(sandbox, "writes", path=str(outside))
    assert refused.status == "error" and "outside the scratch folder" in refused.content and not outside.exists()
    inside = run(sandbox, "writes", path="notes.txt")
    assert inside.status == "ok" and not os.path.exists(inside.content)  # the scratch folder is removed after
    assert run(sandbox, "where").content.startswith(
        "/scratch" if sandbox.isolation == "bwrap" else sandbox.scratch_root
    )
    assert run(sandbox, "connects").status == "error"
    spawned = run(sandbox, "spawns")
    assert spawned.status == "error" and "subprocess.Popen is not allowed" in spawned.content
