"""The tool agent loop on a scripted policy: token-in-token-out trajectories, loss_mask 0 on tool results, one
sandbox run per call, the turn / call / budget limits, malformed and unknown calls."""

import json
from typing import List

import pytest

from mindspeed_rl.protocol import RolloutOutput, RolloutRequest, build_experience
from mindspeed_rl.rollout.agent_loop import (
    AgentContext,
    AgentSettings,
    ToolFormat,
    rollout_function,
    single_turn,
    tool_agent,
    truncate,
)
from mindspeed_rl.tools import BUILTIN_TOOLS, ToolResult

FORMAT = ToolFormat("\n<user>", "<tool_response>{content}</tool_response>", "</user>\n<assistant>")


class CharTokenizer:
    """One token per character: what is generated and what the loop appends can be read back exactly."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)


def call(expression):
    return '<tool_call>{"name": "calculator", "arguments": %s}</tool_call>' % json.dumps({"expression": expression})


class ScriptedPolicy:
    """Turn k of a trajectory answers script(context)[k]; records every request it gets."""

    def __init__(self, script):
        self.script, self.requests = script, []

    def __call__(self, request: RolloutRequest) -> List[RolloutOutput]:
        self.requests.append(request)
        tok, outputs = CharTokenizer(), []
        for i, prompt in enumerate(request.prompts):
            for k in range(request.n):
                context = tok.decode(prompt)
                text = self.script(context, request.seed + i * request.n + k)
                budget = request.max_new_tokens[i] if request.max_new_tokens else request.sampling.max_tokens
                ids = tok.encode(text)[:budget]
                outputs.append(
                    RolloutOutput(
                        i, ids, [-0.5] * len(ids), "stop" if len(ids) < budget or len(ids) == len(text) else "length"
                    )
                )
        return outputs


class CountingSandbox:
    """Runs the calculator in-process and counts the calls (the real sandbox is tested in test_tools)."""

    def __init__(self):
        self.calls = []

    def run_many(self, calls, parallel=2):
        from mindspeed_rl.tools.builtin import calculator

        self.calls += list(calls)
        out = []
        for function, arguments in calls:
            try:
                out.append(ToolResult(calculator(**arguments), "ok"))
            except ValueError as exc:
                out.append(ToolResult(f"Error: {exc}", "error"))
        return out


def context(policy, sandbox=None, **settings):
    return AgentContext(
        policy,
        CharTokenizer(),
        {"calculator": BUILTIN_TOOLS["calculator"]},
        sandbox or CountingSandbox(),
        AgentSettings(**settings),
        FORMAT,
    )


def request(prompts=("Q: 6*7?",), n=2, max_tokens=400):
    from mindspeed_rl.config_cls.generate_config import SamplingConfig

    tok = CharTokenizer()
    return RolloutRequest([tok.encode(p) for p in prompts], n, 100, SamplingConfig(max_tokens=max_tokens))


def solve(ctx, seed):
    """Calls the calculator once, then answers with what it returned."""
    if "<tool_response>" not in ctx:
        return call(ctx.split("Q: ")[1].split("?")[0]) + "<eos>"
    return "#### " + ctx.rsplit("<tool_response>", 1)[1].split("</tool_response>")[0] + "<eos>"


def test_trajectory_is_the_generated_tokens_and_the_tool_turns_exactly():
    policy, sandbox = ScriptedPolicy(solve), CountingSandbox()
    batch = tool_agent(request(), context(policy, sandbox))
    tok = CharTokenizer()
    turn1 = call("6*7") + "<eos>"
    observation = "\n<user><tool_response>42</tool_response></user>\n<assistant>"
    turn2 = "#### 42<eos>"
    assert (
        len(batch.outputs) == 2 and sandbox.calls == [(BUILTIN_TOOLS["calculator"].function, {"expression": "6*7"})] * 2
    )
    for out in batch.outputs:
        assert tok.decode(out.response_ids) == turn1 + observation + turn2
        assert out.loss_mask == [1] * len(turn1) + [0] * len(observation) + [1] * len(turn2)
        assert out.logprobs == [-0.5] * len(turn1) + [0.0] * len(observation) + [-0.5] * len(turn2)
        assert out.finish_reason == "stop" and out.prompt_index == 0
    # token in, token out: the second turn's input is the prompt plus every token so far, as generated
    second = policy.requests[1]
    assert second.n == 1 and second.prompts[0] == tok.encode("Q: 6*7?" + turn1 + observation)
    assert second.max_new_tokens == [400 - len(turn1) - len(observation)] * 2
    assert second.seed != policy.requests[0].seed
    assert batch.metrics["tool_calls/mean"] == 1.0 and batch.metrics["multi_turn/num_turns/mean"] == 2.0
    assert batch.metrics["tool_calls/errors"] == 0.0
    assert batch.metrics["multi_turn/observation_tokens/mean"] == len(observation)


def test_experience_trains_on_generated_tokens_only():
    batch = tool_agent(request(), context(ScriptedPolicy(solve)))
    exp = build_experience(request().prompts, batch.outputs, 2, pad_id=0, labels=["42"])
    out = batch.outputs[0]
    assert exp.loss_mask[0, : len(out.loss_mask)].tolist() == out.loss_mask
    assert exp.response_mask[0, : len(out.loss_mask)].tolist() == [1] * len(out.loss_mask)
    assert int(exp.loss_mask.sum()) < int(exp.response_mask.sum())


def test_single_turn_and_a_users_rollout_function_by_path():
    policy = ScriptedPolicy(lambda ctx, seed: "#### 7<eos>")
    assert [o.loss_mask for o in single_turn(request(), context(policy)).outputs] == [None, None]
    assert rollout_function("single_turn") is single_turn and rollout_function("tool_agent") is tool_agent
    assert rollout_function("tests.test_agent_loop:solve") is solve
    with pytest.raises(ValueError, match="unknown rollout_function 'agent'"):
        rollout_function("agent")


def test_max_tool_calls_and_max_turns_end_the_trajectory():
    always = ScriptedPolicy(lambda ctx, seed: call("1+1") + "<eos>")
    sandbox = CountingSandbox()
    batch = tool_agent(request(n=1), context(always, sandbox, max_tool_calls=2, max_turns=10))
    assert len(sandbox.calls) == 2 and batch.metrics["multi_turn/num_turns/mean"] == 3.0
    sandbox = CountingSandbox()
    batch = tool_agent(request(n=1), context(always, sandbox, max_tool_calls=10, max_turns=2))
    assert len(sandbox.calls) == 1 and batch.metrics["multi_turn/num_turns/mean"] == 2.0
    assert batch.outputs[0].loss_mask[-1] == 1  # the last turn's unanswered call is the end


def test_parallel_calls_beyond_the_limit_are_refused_with_a_message():
    two = ScriptedPolicy(lambda ctx, seed: "#### done" if "<tool_response>" in ctx else call("1+1") + call("2+2"))
    sandbox = CountingSandbox()
    batch = tool_agent(request(n=1), context(two, sandbox, max_parallel_calls=1))
    text = CharTokenizer().decode(batch.outputs[0].response_ids)
    assert len(sandbox.calls) == 1 and "<tool_response>2</tool_response>" in text
    assert "at most 1 tool call(s) allowed here; calculator was not run" in text
    assert batch.metrics["tool_calls/errors"] == 1.0


def test_malformed_and_unknown_calls_answer_with_errors_and_are_counted():
    script = {
        0: '<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>',
        1: '<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>',
        2: '<tool_call>{"name": "calculator", "arguments": {}}</tool_call>',
        3: call("2 ** 0.5"),
    }

    def policy(ctx, seed):
        return "#### x" if "<tool_response>" in ctx else script[seed - 100]

    sandbox = CountingSandbox()
    batch = tool_agent(request(("Q: a?", "Q: b?", "Q: c?", "Q: d?"), n=1), context(ScriptedPolicy(policy), sandbox))
    texts = [CharTokenizer().decode(o.response_ids) for o in batch.outputs]
    assert "malformed tool call: not JSON" in texts[0]
    assert "unknown tool 'search'; available: calculator" in texts[1]
    assert "calculator needs argument(s) expression" in texts[2]
    assert "Error: only whole-number exponents" in texts[3]
    assert len(sandbox.calls) == 1
    assert batch.metrics["tool_calls/errors"] == 4.0 and batch.metrics["tool_calls/malformed"] == 1.0


def test_prompts_may_call_only_their_own_tools():
    ctx = context(ScriptedPolicy(solve))
    ctx.prompt_tools = [["python"], None]
    batch = tool_agent(request(("Q: 6*7?", "Q: 2*3?"), n=1), ctx)
    texts = [CharTokenizer().decode(o.response_ids) for o in batch.outputs]
    assert "unknown tool 'calculator'; available: python" in texts[0] and texts[1].endswith("#### 6<eos>")


def test_the_budget_cuts_a_tool_result_and_ends_the_trajectory():
    first = len(call("6*7") + "<eos>")
    batch = tool_agent(request(n=1, max_tokens=first + 10), context(ScriptedPolicy(solve)))
    out = batch.outputs[0]
    assert len(out.response_ids) == first + 10 and out.finish_reason == "length"
    assert out.loss_mask == [1] * first + [0] * 10


def test_truncate_keeps_the_chosen_side():
    assert truncate("abcdefghij", 4, "left") == "...(truncated)...ghij"
    assert truncate("abcdefghij", 4, "right") == "abcd...(truncated)..."
    assert truncate("abcdefghij", 4, "middle") == "ab...(truncated)...ij"
    assert truncate("abc", 4, "middle") == "abc"


def test_preprocessing_lists_the_tools_in_the_system_turn(tmp_path):
    """The dataset config's tools go into every prompt (the template's tools_format); a row's own 'tools'
    narrows them and is stored for the agent; an unknown name skips the row."""
    from mindspeed_rl.config_cls.dataset_config import DatasetConfig
    from mindspeed_rl.datasets.handlers import AlpacaStyleInstructionHandler
    from mindspeed_rl.datasets.templates import apply_template, tools_block

    cfg = DatasetConfig(
        input="x",
        tokenizer_name_or_path="x",
        output_prefix="x",
        prompt_type="qwen",
        tools=["calculator", "python"],
        dataset_additional_keys=["labels", "tools"],
    )
    cfg.validate()
    handler = AlpacaStyleInstructionHandler(cfg, CharTokenizer())
    sample, why = handler.process({"question": "6*7?", "answer": "42"})
    text = CharTokenizer().decode(sample["input_ids"])
    assert why is None and '"name": "calculator"' in text and '"name": "python"' in text
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools") and "<tools>" in text
    assert json.loads(sample["tools"]) == ["calculator", "python"]
    narrowed, _ = handler.process({"question": "6*7?", "answer": "42", "tools": ["calculator"]})
    assert '"name": "python"' not in CharTokenizer().decode(narrowed["input_ids"])
    assert json.loads(narrowed["tools"]) == ["calculator"]
    assert handler.process({"question": "q", "answer": "1", "tools": ["search"]}) == (None, "unknown_tool:search")
    compact = apply_template("chatml_tools_compact", "6*7=?", tools=[BUILTIN_TOOLS["calculator"]])
    assert (
        compact
        == "<|im_start|>system\ntools: calculator<|im_end|>\n<|im_start|>user\n6*7=?<|im_end|>\n<|im_start|>assistant\n"
    )
    with pytest.raises(ValueError, match="no tools_format"):
        tools_block("empty", [BUILTIN_TOOLS["calculator"]])


def test_rollout_metrics_of_several_generation_batches_merge_by_kind():
    """Dynamic sampling generates several batches per iteration: times and counts add up, means and rates
    are averaged over the batches, maxima kept."""
    from mindspeed_rl.trainer.ppo_trainer import PPOTrainer

    trainer = PPOTrainer.__new__(PPOTrainer)
    trainer.timing, trainer.rollout_metrics = {"timing/rollout": 1.0}, {}
    first = {
        "tool_calls/rate": 0.5,
        "multi_turn/num_turns/mean": 1.0,
        "multi_turn/num_turns/max": 2.0,
        "tool_calls/errors": 1.0,
        "timing/tool": 0.25,
    }
    second = {
        "tool_calls/rate": 0.25,
        "multi_turn/num_turns/mean": 2.0,
        "multi_turn/num_turns/max": 1.0,
        "tool_calls/errors": 2.0,
        "timing/tool": 0.5,
    }
    trainer.add_rollout_metrics(first, 0)
    trainer.add_rollout_metrics(second, 1)
    assert trainer.rollout_metrics == {
        "tool_calls/rate": 0.375,
        "multi_turn/num_turns/mean": 1.5,
        "multi_turn/num_turns/max": 2.0,
        "tool_calls/errors": 3.0,
    }
    assert trainer.timing == {"timing/rollout": 1.0, "timing/tool": 0.75}
