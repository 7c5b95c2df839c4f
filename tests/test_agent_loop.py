"""The tool agent on a scripted policy, one trajectory at a time through the trajectory pool: token-in-token-out
trajectories, loss_mask 0 on tool results, one sandbox run per call, the turn / call / budget limits, malformed
and unknown calls, a prompt's own tools; a user's whole-batch rollout function through a synchronous source."""

import json

import pytest

from mindspeed_rl.datasets.prompt_dataset import PromptBatch
from mindspeed_rl.protocol import RolloutOutput, build_experience
from mindspeed_rl.rollout.source.agent_loop import (
    AgentBatch,
    AgentContext,
    SingleTurn,
    ToolAgent,
    WholeBatch,
    build_rollout_function,
    rollout_function,
    truncate,
)
from mindspeed_rl.rollout.source.group_filter import KeepAll
from mindspeed_rl.rollout.source.rollout_source import RolloutSource, average
from mindspeed_rl.rollout.source.rounds import TrajectoryPool
from mindspeed_rl.rollout.source.schedules import Synchronous
from mindspeed_rl.rollout.source.trajectory import CUT, FINISHED
from mindspeed_rl.tools import BUILTIN_TOOLS
from mindspeed_rl.utils.clock import Clock
from tests.rollout_fakes import TOK, InProcessSandbox, ScriptedService, call, score, tool_context

SEED, ROUND_STRIDE, VERSION = 100, 1000, 3  # round r's request j is seeded SEED + ROUND_STRIDE * r + j
CALCULATOR = BUILTIN_TOOLS["calculator"].function


class ScriptedPolicy(ScriptedService):
    """The scripted service with every log-prob -0.5."""

    def __init__(self, script):
        super().__init__(script, logprob=lambda token, version: -0.5)


def calculate_then_answer(context, seed):
    """Calls the calculator once, then answers with what it returned."""
    if "<tool_response>" not in context:
        return call(context.split("Q: ")[1].split("?")[0]) + "<eos>"
    return "#### " + context.rsplit("<tool_response>", 1)[1].split("</tool_response>")[0] + "<eos>"


def solve(request, context):
    """A user's whole-batch rollout function: one generation of the whole request, then a note the policy did
    not write (loss_mask 0, log-prob 0) after each response."""
    note = context.tokenizer.encode("<checked>")
    outputs = []
    for out in context.generate(request):
        mask = [1] * len(out.response_ids) + [0] * len(note)
        outputs.append(
            RolloutOutput(out.prompt_index, out.response_ids + note, out.logprobs + [0.0] * len(note),
                          out.finish_reason, None, mask)
        )  # fmt: skip
    return AgentBatch(outputs, {"solve/prompts": float(len(request.prompts)), "timing/solve": 0.25})


def roll(function, service, prompts=("Q: 6*7?",), n=2, max_tokens=400, budgets=None, tools=None):
    """Every trajectory of ``prompts`` (n each) to its end, round after round: the trajectories in uid order and
    the rollout function's metrics of them."""
    pool = TrajectoryPool(function, n, max_tokens)
    pool.add(PromptBatch([TOK.encode(p) for p in prompts], ["42"] * len(prompts), budgets, tools))
    clock, rounds = Clock(), 0
    while pool.unfinished():
        assert rounds < 20, "the trajectories never finish"
        pool.run_round(service, SEED + ROUND_STRIDE * rounds, VERSION, max_tokens, clock)
        rounds += 1
    pool.join_tools(VERSION, clock)
    pool.close()
    trajectories = sorted(pool.trajectories, key=lambda t: t.uid)
    return trajectories, function.metrics(trajectories)


def text_of(traj):
    return TOK.decode(traj.tokens)


def test_trajectory_is_the_generated_tokens_and_the_tool_turns_exactly():
    policy, sandbox = ScriptedPolicy(calculate_then_answer), InProcessSandbox()
    trajectories, metrics = roll(ToolAgent(tool_context(sandbox)), policy)
    turn1 = call("6*7") + "<eos>"
    observation = "\n<user><tool_response>42</tool_response></user>\n<assistant>"
    turn2 = "#### 42<eos>"
    assert len(trajectories) == 2 and sandbox.calls == [(CALCULATOR, {"expression": "6*7"})] * 2
    for traj in trajectories:
        assert text_of(traj) == turn1 + observation + turn2
        assert traj.loss_mask == [1] * len(turn1) + [0] * len(observation) + [1] * len(turn2)
        assert traj.logprobs == [-0.5] * len(turn1) + [0.0] * len(observation) + [-0.5] * len(turn2)
        assert traj.versions == [VERSION] * len(traj.tokens)
        assert traj.status == FINISHED and traj.finish_reason == "stop"
        assert traj.turns == 2 and traj.calls == 1 and traj.tool_errors == {}
    # one request per round, one row per trajectory (the prompt repeated, n=1), seeded by the row's position
    first, second = policy.requests
    assert first.n == 1 and first.prompts == [TOK.encode("Q: 6*7?")] * 2 and first.seed == SEED
    assert first.max_new_tokens == [400, 400]
    # token in, token out: the second turn's input is the prompt plus every token so far, as generated
    assert second.n == 1 and second.prompts == [TOK.encode("Q: 6*7?" + turn1 + observation)] * 2
    assert second.max_new_tokens == [400 - len(turn1) - len(observation)] * 2
    assert second.seed == SEED + ROUND_STRIDE
    assert metrics["tool_calls/mean"] == 1.0 and metrics["multi_turn/num_turns/mean"] == 2.0
    assert metrics["tool_calls/errors"] == 0.0 and metrics["tool_calls/rate"] == 1.0
    assert metrics["multi_turn/observation_tokens/mean"] == len(observation)
    assert metrics["multi_turn/generated_tokens/mean"] == len(turn1) + len(turn2)


def test_experience_trains_on_generated_tokens_only():
    trajectories, _ = roll(ToolAgent(tool_context()), ScriptedPolicy(calculate_then_answer))
    outputs = [t.output(t.uid // 2) for t in trajectories]
    exp = build_experience([TOK.encode("Q: 6*7?")], outputs, 2, pad_id=0, labels=["42"])
    mask = trajectories[0].loss_mask
    assert exp.loss_mask[0, : len(mask)].tolist() == mask
    assert exp.response_mask[0, : len(mask)].tolist() == [1] * len(mask)
    assert int(exp.loss_mask.sum()) < int(exp.response_mask.sum())


def test_single_turn_and_a_users_rollout_function_by_path():
    trajectories, metrics = roll(SingleTurn(AgentContext(None, TOK)), ScriptedPolicy(lambda ctx, seed: "#### 7<eos>"))
    assert [text_of(t) for t in trajectories] == ["#### 7<eos>"] * 2 and metrics == {}
    assert [t.loss_mask for t in trajectories] == [[1] * len("#### 7<eos>")] * 2
    assert all(t.status == FINISHED and t.turns == 0 for t in trajectories)
    assert rollout_function("single_turn") is SingleTurn and rollout_function("tool_agent") is ToolAgent
    assert rollout_function("tests.test_agent_loop:solve") is solve
    with pytest.raises(ValueError, match="unknown rollout_function 'agent'"):
        rollout_function("agent")


def test_a_users_whole_batch_function_runs_in_a_synchronous_source():
    """The whole-batch function gets a round's new prompt groups as one request (n per prompt, not repeated),
    can generate with the service, and its outputs become the batch: its loss_mask, its metrics, its timings
    on the clock."""
    n, want, max_tokens = 2, 2, 128
    function = build_rollout_function("tests.test_agent_loop:solve", AgentContext(None, TOK))
    assert isinstance(function, WholeBatch) and function.fn is solve and function.name == "solve"
    policy = ScriptedPolicy(calculate_then_answer)
    policy.update_weights(VERSION)
    draws = []

    def draw():
        draws.append(len(draws))
        return PromptBatch([TOK.encode("Q: 6*7?"), TOK.encode("Q: 2*3?")], ["42", "6"])

    source = RolloutSource(policy, function, KeepAll(want), Synchronous(max_tokens), draw, score, n, max_tokens, 7, 0)
    batch = source.next_batch(0)
    (request,) = policy.requests
    assert request.n == n and request.prompts == [TOK.encode("Q: 6*7?"), TOK.encode("Q: 2*3?")]
    assert request.max_new_tokens == [max_tokens, max_tokens] and len(draws) == 1
    exp = batch.experience
    assert exp.num_rows == want * n and exp.group.tolist() == [0, 0, 1, 1]
    turn = [call("6*7") + "<eos>"] * 2 + [call("2*3") + "<eos>"] * 2
    for row in range(exp.num_rows):
        shown = exp.response_mask[row].bool()
        assert TOK.decode(exp.response_ids[row][shown].tolist()) == turn[row] + "<checked>"
        assert exp.loss_mask[row][shown].tolist() == [1] * len(turn[row]) + [0] * len("<checked>")
        assert set(exp.policy_version[row][shown].tolist()) == {VERSION}
    assert exp.scores.tolist() == [0.0] * 4  # a tool call is not the answer
    assert batch.metrics["solve/prompts"] == 2.0 and "timing/solve" not in batch.metrics
    assert batch.clock.timing["timing/solve"] == 0.25
    assert source.pool.trajectories == []  # a synchronous batch leaves nothing behind


def test_max_tool_calls_and_max_turns_end_the_trajectory():
    always = ScriptedPolicy(lambda ctx, seed: call("1+1") + "<eos>")
    sandbox = InProcessSandbox()
    (traj,), metrics = roll(ToolAgent(tool_context(sandbox, max_tool_calls=2, max_turns=10)), always, n=1)
    assert len(sandbox.calls) == 2 and traj.calls == 2 and metrics["multi_turn/num_turns/mean"] == 3.0
    assert traj.status == FINISHED
    sandbox = InProcessSandbox()
    (traj,), metrics = roll(ToolAgent(tool_context(sandbox, max_tool_calls=10, max_turns=2)), always, n=1)
    assert len(sandbox.calls) == 1 and traj.calls == 1 and metrics["multi_turn/num_turns/mean"] == 2.0
    assert traj.loss_mask[-1] == 1 and traj.status == FINISHED  # the last turn's unanswered call is the end


def test_parallel_calls_beyond_the_limit_are_refused_with_a_message():
    two = ScriptedPolicy(lambda ctx, seed: "#### done" if "<tool_response>" in ctx else call("1+1") + call("2+2"))
    sandbox = InProcessSandbox()
    (traj,), metrics = roll(ToolAgent(tool_context(sandbox, max_parallel_calls=1)), two, n=1)
    text = text_of(traj)
    assert len(sandbox.calls) == 1 and "<tool_response>2</tool_response>" in text
    assert "at most 1 tool call(s) allowed here; calculator was not run" in text
    assert traj.calls == 1 and traj.tool_errors == {"error": 1}
    assert metrics["tool_calls/errors"] == 1.0


def test_malformed_and_unknown_calls_answer_with_errors_and_are_counted():
    script = {
        0: '<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>',
        1: '<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>',
        2: '<tool_call>{"name": "calculator", "arguments": {}}</tool_call>',
        3: call("2 ** 0.5"),
    }

    def policy(ctx, seed):
        return "#### x" if "<tool_response>" in ctx else script[seed - SEED]

    sandbox = InProcessSandbox()
    agent = ToolAgent(tool_context(sandbox))
    trajectories, metrics = roll(agent, ScriptedPolicy(policy), ("Q: a?", "Q: b?", "Q: c?", "Q: d?"), n=1)
    texts = [text_of(t) for t in trajectories]
    assert "malformed tool call: not JSON" in texts[0]
    assert "unknown tool 'search'; available: calculator" in texts[1]
    assert "calculator needs argument(s) expression" in texts[2]
    assert "Error: only whole-number exponents" in texts[3]
    assert len(sandbox.calls) == 1 and [t.calls for t in trajectories] == [0, 0, 0, 1]
    assert [t.tool_errors for t in trajectories] == [{"malformed": 1}, {"error": 1}, {"error": 1}, {"error": 1}]
    assert metrics["tool_calls/errors"] == 4.0 and metrics["tool_calls/malformed"] == 1.0
    assert agent.metrics(trajectories[:1])["tool_calls/errors"] == 1.0  # counted per trajectory


def test_prompts_may_call_only_their_own_tools():
    trajectories, _ = roll(
        ToolAgent(tool_context()), ScriptedPolicy(calculate_then_answer), ("Q: 6*7?", "Q: 2*3?"), n=1,
        tools=[["python"], None],
    )  # fmt: skip
    assert [t.tools for t in trajectories] == [["python"], None]
    texts = [text_of(t) for t in trajectories]
    assert "unknown tool 'calculator'; available: python" in texts[0] and texts[1].endswith("#### 6<eos>")


def test_the_budget_cuts_a_tool_result_and_ends_the_trajectory():
    """A prompt's own budget (max_new_tokens) below max_tokens: its tool result is cut to what is left and the
    trajectory is cut; the other prompt's full budget lets it answer."""
    first = len(call("6*7") + "<eos>")
    trajectories, _ = roll(
        ToolAgent(tool_context()), ScriptedPolicy(calculate_then_answer), ("Q: 6*7?", "Q: 6*7?"), n=1,
        budgets=[first + 10, 400],
    )  # fmt: skip
    cut, whole = trajectories
    assert cut.budget == first + 10 and len(cut.tokens) == first + 10
    assert cut.status == CUT and cut.finish_reason == "length" and cut.output(0).finish_reason == "length"
    assert cut.loss_mask == [1] * first + [0] * 10
    assert whole.status == FINISHED and text_of(whole).endswith("#### 42<eos>")


def test_truncate_keeps_the_chosen_side():
    assert truncate("abcdefghij", 4, "left") == "...(truncated)...ghij"
    assert truncate("abcdefghij", 4, "right") == "abcd...(truncated)..."
    assert truncate("abcdefghij", 4, "middle") == "ab...(truncated)...ij"
    assert truncate("abc", 4, "middle") == "abc"


def test_preprocessing_lists_the_tools_in_the_system_turn(tmp_path):
    """The dataset config's tools go into every prompt (the template's tools_format); a row's own 'tools'
    narrows them and is stored for the agent; an unknown name skips the row."""
    from mindspeed_rl.datasets.dataset_config import DatasetConfig
    from mindspeed_rl.datasets.handlers import AlpacaStyleInstructionHandler
    from mindspeed_rl.datasets.templates import apply_template, tools_block
    from mindspeed_rl.trainer.startup.config_names import check_dataset_names

    cfg = DatasetConfig(
        input="x",
        tokenizer_name_or_path="x",
        output_prefix="x",
        prompt_type="qwen",
        tools=["calculator", "python"],
        dataset_additional_keys=["labels", "tools"],
    )
    cfg.check()
    handler = AlpacaStyleInstructionHandler(cfg, TOK, check_dataset_names(cfg))
    sample, why = handler.process({"question": "6*7?", "answer": "42"})
    text = TOK.decode(sample["input_ids"])
    assert why is None and '"name": "calculator"' in text and '"name": "python"' in text
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools") and "<tools>" in text
    assert json.loads(sample["tools"]) == ["calculator", "python"]
    narrowed, _ = handler.process({"question": "6*7?", "answer": "42", "tools": ["calculator"]})
    assert '"name": "python"' not in TOK.decode(narrowed["input_ids"])
    assert json.loads(narrowed["tools"]) == ["calculator"]
    assert handler.process({"question": "q", "answer": "1", "tools": ["search"]}) == (None, "unknown_tool:search")
    compact = apply_template("chatml_tools_compact", "6*7=?", tools=[BUILTIN_TOOLS["calculator"]])
    assert (
        compact
        == "<|im_start|>system\ntools: calculator<|im_end|>\n<|im_start|>user\n6*7=?<|im_end|>\n<|im_start|>assistant\n"
    )
    with pytest.raises(ValueError, match="no tools_format"):
        tools_block("empty", [BUILTIN_TOOLS["calculator"]])


def test_reward_metrics_of_several_scoring_calls_are_averaged_by_rows():
    """A batch scores its groups in several calls (dynamic sampling draws again, partial rollout offers groups
    as they finish): each metric is the mean over the rows of the calls that report it."""
    merged = average([(8, {"acc/mean": 0.5, "overlong/penalty_mean": -1.0}), (24, {"acc/mean": 0.25})])
    assert merged == {"acc/mean": (8 * 0.5 + 24 * 0.25) / 32, "overlong/penalty_mean": -1.0}
    assert average([]) == {}
