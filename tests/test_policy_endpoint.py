"""The policy endpoint and the openai_agent rollout function without a model: a scripted engine behind the rollout
rounds, the real HTTP server, real `openai` clients as harnesses (entry points in threads and commands), token-exact
trajectories, and every kind of bad input answered with a 4xx or a counted drop."""

import json
import os
import sys
import threading

import httpx
import pytest

from mindspeed_rl.config_cls.agent_config import AgentConfig
from mindspeed_rl.config_cls.base import ConfigError
from mindspeed_rl.config_cls.endpoint_config import PolicyEndpointConfig
from mindspeed_rl.datasets.chat_messages import (
    MessageError,
    prompt_messages,
    render_conversation,
    render_follow_up,
)
from mindspeed_rl.datasets.prompt_dataset import PromptBatch
from mindspeed_rl.datasets.templates import apply_template
from mindspeed_rl.rollout.endpoint.episodes import Reply
from mindspeed_rl.rollout.source.agent_loop import AgentContext, build_rollout_function
from mindspeed_rl.rollout.source.external_agent import EndpointRun
from mindspeed_rl.rollout.source.rounds import TrajectoryPool
from mindspeed_rl.utils.clock import Clock
from tests.rollout_fakes import CharTokenizer, ScriptedService

END = "<|im_end|>"


class ChatTokenizer(CharTokenizer):
    eos_token = END

    def decode(self, ids, skip_special_tokens=False):
        text = super().decode(ids)
        return text.replace(END, "") if skip_special_tokens else text


TOK = ChatTokenizer()


def policy(context: str, seed: int) -> str:
    """Asks for the calculator on the first turn, answers with its result after a tool turn."""
    if "<tool_response>" in context:
        return "#### " + context.rsplit("<tool_response>\n", 1)[1].split("\n</tool_response>")[0] + END
    return f"CALL 6*7 (seed {seed % 10}){END}"


def chat_harness(task):
    """Two turns through the openai client: the model's call, the tool's answer, the model's answer; the reward
    returned."""
    client = task.client(max_retries=0)
    first = client.chat.completions.create(model=task.model, messages=task.messages, logprobs=True)
    assert first.choices[0].finish_reason == "stop"
    messages = task.messages + [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "tool", "content": "42"},
    ]
    second = client.chat.completions.create(model=task.model, messages=messages)
    return 1.0 if second.choices[0].message.content == "#### 42" else 0.0


def completion_harness(task):
    """Token ids in, token ids out; the reward posted to /v1/episodes/{id}/reward."""
    client = task.client(max_retries=0)
    answer = client.completions.create(model=task.model, prompt=task.prompt_token_ids, logprobs=1)
    ids = answer.model_extra.get("choices", [{}])[0].get("token_ids") if answer.model_extra else None
    ids = ids or answer.choices[0].model_extra["token_ids"]
    root = task.base_url.split("/episodes/")[0]
    httpx.post(f"{root}/v1/episodes/{task.episode_id}/reward", json={"reward": 0.5 + len(ids) * 0}).raise_for_status()


def silent_harness(task):
    """Never calls."""


def crashing_harness(task):
    raise RuntimeError("the environment broke")


def context(tmp_path=None, prompt_type="qwen", max_prompt=400, **keys) -> AgentContext:
    ctx = AgentContext(None, TOK, settings=AgentConfig(max_turns=4))
    ctx.endpoint = EndpointRun(PolicyEndpointConfig(**keys), prompt_type, max_prompt, 4096, str(tmp_path or ""))
    return ctx


def roll(function, prompts, n=2, max_tokens=300, service=None):
    service = service or ScriptedService(policy)
    pool = TrajectoryPool(function, n, max_tokens)
    ids = [TOK.encode(apply_template("qwen", p)) for p in prompts]
    pool.add(PromptBatch(ids, ["42"] * len(prompts)))
    clock, rounds = Clock(), 0
    while pool.unfinished():
        assert rounds < 20, "the episodes never finish"
        pool.run_round(service, 100 + 1000 * rounds, 3, max_tokens, clock)
        rounds += 1
    pool.join_tools(3, clock)
    pool.close()
    return sorted(pool.trajectories, key=lambda t: t.uid), service


@pytest.fixture
def agent():
    made = []

    def make(**keys):
        made.append(build_rollout_function("openai_agent", context(**keys)))
        return made[-1]

    yield make
    for function in made:
        function.close()


def test_an_openai_client_drives_a_token_exact_two_turn_episode(agent):
    function = agent(entry_point="tests.test_policy_endpoint:chat_harness")
    trajectories, service = roll(function, ["What is 6*7?"])
    prompt = apply_template("qwen", "What is 6*7?")
    tool_turn = "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    for traj in trajectories:
        assert traj.status == "finished" and traj.reward == 1.0 and not traj.dropped
        assert TOK.decode(traj.prompt) == prompt  # the task's messages render back to the dataset's prompt
        first = f"CALL 6*7 (seed {{}}){END}"
        text = TOK.decode(traj.tokens)
        assert text.endswith(tool_turn + "#### 42" + END) and text.startswith("CALL 6*7 (seed ")
        head = len(text) - len(tool_turn + "#### 42" + END)
        assert traj.loss_mask == [1] * head + [0] * len(tool_turn) + [1] * len("#### 42" + END)
        assert traj.logprobs[head : head + len(tool_turn)] == [0.0] * len(tool_turn)
        assert first  # the first turn is the engine's tokens as generated, its seed the round's
    assert TOK.decode(service.requests[1].prompts[0]).endswith(tool_turn)  # the engine read exactly those tokens
    metrics = function.metrics(trajectories)
    assert metrics["episodes/started"] == 2 and metrics["episodes/finished"] == 2 and metrics["episodes/dropped"] == 0
    assert metrics["episodes/turns/mean"] == 2


def test_token_ids_in_and_out_and_a_reward_posted_over_http(agent):
    function = agent(entry_point="tests.test_policy_endpoint:completion_harness")
    trajectories, _ = roll(function, ["What is 6*7?"], n=1)
    assert trajectories[0].reward == 0.5 and trajectories[0].status == "finished"
    assert TOK.decode(trajectories[0].tokens).startswith("CALL 6*7")


def test_a_command_harness_and_its_failures(agent, tmp_path):
    script = tmp_path / "agent.py"
    script.write_text(
        "import json, os, sys\nimport openai\ntask = json.load(sys.stdin)\n"
        "client = openai.OpenAI(max_retries=0)\n"  # OPENAI_BASE_URL / OPENAI_API_KEY from the environment
        "reply = client.chat.completions.create(model=task['model'], messages=task['messages'])\n"
        "print(os.environ['MINDSPEED_RL_EPISODE_ID'], reply.choices[0].message.content)\n"
        "sys.exit(0 if 'seed 0' in reply.choices[0].message.content else 3)\n"
    )
    function = agent(command=f"{sys.executable} {script}", harness_timeout_s=60)
    function.harness.log_path = str(tmp_path / "harness.log")
    trajectories, _ = roll(function, ["What is 6*7?"], n=2)
    # seeds 100 and 101: the first episode's harness exits 0 (scored by the verifiers), the second exits 3: dropped
    assert not trajectories[0].dropped and trajectories[0].reward is None
    assert trajectories[1].dropped == "the harness failed: exit code 3"
    assert "(seed 0)" in (tmp_path / "harness.log").read_text()


@pytest.mark.parametrize(
    "harness, reason",
    [
        ("silent_harness", "the harness ended before its first request"),
        ("crashing_harness", "the harness failed: RuntimeError: the environment broke"),
    ],
)
def test_a_harness_that_never_calls_or_crashes_drops_its_episode(agent, harness, reason):
    function = agent(entry_point=f"tests.test_policy_endpoint:{harness}")
    trajectories, service = roll(function, ["What is 6*7?"])
    assert [t.dropped for t in trajectories] == [reason] * 2 and not service.requests
    assert function.metrics([])["episodes/dropped"] == 2


def test_a_hanging_harness_is_dropped_after_its_timeout(agent):
    import time

    def hang(task):
        time.sleep(30)

    sys.modules[__name__].hang = hang
    function = agent(entry_point="tests.test_policy_endpoint:hang", harness_timeout_s=1.0)
    started = time.monotonic()
    trajectories, _ = roll(function, ["What is 6*7?"], n=4)
    assert all(t.dropped.startswith("no request, reward or exit within 1 s") for t in trajectories)
    assert time.monotonic() - started < 3.5  # one deadline for the batch: four silent harnesses would take 4 s


def wait_for_episode(function, timeout=10.0):
    import time

    deadline = time.monotonic() + timeout
    while not function.book.active() and time.monotonic() < deadline:
        time.sleep(0.01)
    return function.book.active()[0]


def test_bad_requests_get_a_4xx_with_a_message(agent):
    gate = threading.Event()

    def hold(task):
        gate.wait(20)

    sys.modules[__name__].hold = hold
    function = agent(entry_point="tests.test_policy_endpoint:hold", api_key="s3cret", max_body_bytes=2048)
    pool = TrajectoryPool(function, 1, 100)
    pool.add(PromptBatch([TOK.encode(apply_template("qwen", "Q"))], ["42"]))
    pool._start_tools(pool._opening)
    pool._opening = []
    episode = wait_for_episode(function)
    base, auth = function.server.base_url, {"Authorization": "Bearer s3cret"}
    url = function.server.episode_url(episode.id)
    chat = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}

    def post(path, body=None, headers=auth, raw=None):
        return httpx.post(base + path if path.startswith("/") else path, json=body, content=raw, headers=headers)

    cases = [
        (post(url + "/chat/completions", chat, headers={}), 401, "bearer token"),
        (post(url + "/chat/completions", raw=b"{not json", headers={**auth, "content-type": "application/json"}), 400,
         "not JSON"),
        (post("/chat/completions", chat), 400, "name the episode"),
        (post(base.replace("/v1", "/episodes/ep-9-x/v1/chat/completions"), chat), 404, "unknown"),
        (post(url + "/chat/completions", {**chat, "model": "gpt-4o"}), 404, "serves 'policy'"),
        (post(url + "/chat/completions", {**chat, "messages": [{"role": "user", "content": "x" * 4000}]}), 413,
         "max_body_bytes"),
        (post(url + "/chat/completions", {**chat, "messages": [{"role": "user", "content": "x" * 500}]}), 400,
         "max_prompt_length"),
        (post(url + "/chat/completions", {**chat, "messages": [{"role": "wizard", "content": "x"}]}), 400,
         "messages[0].role"),
        (post(url + "/chat/completions", {**chat, "messages": [{"role": "assistant", "content": "x"}]}), 400,
         "opens with an assistant"),
        (post(url + "/chat/completions", {**chat, "messages": chat["messages"] + [{"role": "assistant",
         "content": "y"}]}), 400, "nothing asks"),
        (post(url + "/chat/completions", {**chat, "n": 2}), 400, "one answer per request"),
        (post(url + "/completions", {"model": "policy", "prompt": [10**9]}), 400, "outside the vocabulary"),
        (post(f"/episodes/{episode.id}/reward", {"reward": "high"}), 400, "finite number"),
    ]  # fmt: skip
    for response, status, words in cases:
        assert response.status_code == status, (words, response.text)
        assert words in response.json()["error"]["message"], response.text
    # the endpoint lists its model; an episode takes one request at a time
    assert httpx.get(base + "/models", headers=auth).json()["data"][0]["id"] == "policy"
    first = function.book.request(episode, _turn(episode))
    second = post(url + "/chat/completions", chat)
    assert second.status_code == 409 and "in flight" in second.json()["error"]["message"]
    assert post(f"/episodes/{episode.id}/reward", {"reward": 1}).status_code == 200
    assert first.exception(timeout=5).status == 409  # the request in flight learns its episode ended
    again = post(f"/episodes/{episode.id}/reward", {"reward": 1})
    assert again.status_code == 409 and "already settled" in again.json()["error"]["message"]
    gate.set()
    pool.join_tools(0, Clock())
    pool.close()


def _turn(episode):
    from mindspeed_rl.rollout.endpoint.episodes import Turn

    return Turn("chat", [1, 2, 3], True, [{"role": "user", "content": "hi"}])


def test_chat_messages_render_once_and_follow_ups_alone():
    prompt = apply_template("qwen", "What is 6*7?")
    messages = prompt_messages("qwen", prompt)
    assert messages == [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 6*7?"},
    ]
    assert render_conversation("qwen", messages, END) == prompt
    assert render_conversation("qwen", messages[1:], END) == prompt  # no system message: the template's default
    follow = render_follow_up("qwen", [{"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}])
    assert follow.count("<tool_response>") == 2 and follow.endswith("<|im_start|>assistant\n")
    assert render_follow_up("qwen", [{"role": "user", "content": "and?"}]) == (
        "\n<|im_start|>user\nand?<|im_end|>\n<|im_start|>assistant\n"
    )
    for bad in ([], [{"role": "assistant", "content": "x"}], [{"role": "user", "content": {"x": 1}}]):
        with pytest.raises(MessageError):
            render_conversation("qwen", bad, END)
    with pytest.raises(MessageError, match="no tool role"):
        render_follow_up("llama3", [{"role": "tool", "content": "1"}])


def test_the_endpoint_keys_are_checked_before_anything_starts():
    from mindspeed_rl.features import agent
    from mindspeed_rl.features.load import load_ppo_config

    base = ["rl_config.rollout_function=openai_agent"]
    with pytest.raises(ConfigError, match="policy_endpoint.entry_point.*neither"):
        load_ppo_config("grpo_tiny_cpu", base)
    both = base + ["rl_config.policy_endpoint.entry_point=a:b", "rl_config.policy_endpoint.command=run"]
    with pytest.raises(ConfigError, match="not both"):
        load_ppo_config("grpo_tiny_cpu", both)
    open_host = base + ["rl_config.policy_endpoint.command=run", "rl_config.policy_endpoint.host=0.0.0.0"]
    with pytest.raises(ConfigError, match="policy_endpoint.api_key"):
        load_ppo_config("grpo_tiny_cpu", open_host)
    cfg = load_ppo_config("grpo_tiny_cpu", open_host + ["rl_config.policy_endpoint.api_key=k"])
    line = agent.plan_lines(cfg)[0]
    assert "openai_agent" in line and "0.0.0.0" in line and "bearer token" in line and "command 'run'" in line
    assert json.dumps(cfg.rl.policy_endpoint.__dict__)


ANSWER = f"The answer is 42.{END}"


def versioned_harness(task):
    """One turn; the reward is the number of policy versions that wrote it."""
    reply = task.client(max_retries=0).chat.completions.create(model=task.model, messages=task.messages)
    return float(len(reply.model_extra["policy_versions"]))


def test_an_episode_crossing_a_weight_update_keeps_each_tokens_version(agent):
    """Partial rollout: the turn is generated in chunks of 4 tokens, the weights change between rounds; the
    harness's one request waits across them and its answer says which versions wrote it, as the trajectory does."""
    function = agent(entry_point="tests.test_policy_endpoint:versioned_harness")
    pool = TrajectoryPool(function, 1, 300)
    pool.add(PromptBatch([TOK.encode(apply_template("qwen", "What is 6*7?"))], ["42"]))

    def continuing(context, seed):  # the turn's rest after what earlier chunks wrote
        return ANSWER[len(context.rsplit("<|im_start|>assistant\n", 1)[1]) :]

    service, clock, version = ScriptedService(continuing), Clock(), 3
    while pool.unfinished():
        pool.run_round(service, 100, version, 4, clock)
        version += 1  # a weight update between two rounds
    pool.join_tools(version, clock)
    pool.close()
    traj = pool.trajectories[0]
    turn = len(ANSWER)
    first = traj.versions[0]  # the round that opened the episode generated nothing
    assert traj.versions == [first + k // 4 for k in range(turn)] and traj.reward == float(len(set(traj.versions)))
    assert traj.reward == -(-turn // 4) > 1


def test_rows_carry_per_trajectory_prompts_and_the_agents_rewards():
    """A group whose episodes rendered different prompts keeps each one's; posted rewards join the score."""
    from types import SimpleNamespace

    from mindspeed_rl.protocol import build_experience
    from mindspeed_rl.rollout.source.trajectory import Trajectory, group_outputs
    from mindspeed_rl.trainer.ppo.scoring import Scorer

    group = [Trajectory(0, [5, 6, 7], "42", 10), Trajectory(1, [5, 8], "42", 10)]
    for k, traj in enumerate(group):
        traj.append([9, 9 + k], [-0.1, -0.2], 0, trained=True)
        traj.end("finished", "stop")
    prompts, labels, outputs = group_outputs([group])
    assert prompts == [[5, 6, 7], [5, 8]]
    exp = build_experience(prompts, outputs, 2, 0, labels)
    assert exp.input_ids.tolist() == [[5, 6, 7, 9, 9], [0, 5, 8, 9, 10]]
    exp.set("episode_rewards", __import__("torch").tensor([1.0, float("nan")]))
    rl = SimpleNamespace(rule_reward=False, overlong_buffer_enable=False)
    cfg = SimpleNamespace(rl=rl, generate=SimpleNamespace(sampling_config=SimpleNamespace(max_tokens=10)))
    metrics, _ = Scorer(cfg, None, None, TOK)(exp, Clock())
    assert exp.scores.tolist() == [1.0, 0.0] and metrics["episode/reward/mean"] == 1.0


CALCULATOR = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]


def tool_calling_policy(context: str, seed: int) -> str:
    if "<tool_response>" in context:
        return "#### 42" + END
    return '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>' + END


def streaming_harness(task):
    """Streams both turns (tools offered), as verifiers' and many agents' loops do; reads the call from the deltas."""
    client = task.client(max_retries=0)
    kwargs = dict(model=task.model, tools=CALCULATOR, stream=True, stream_options={"include_usage": True})
    chunks = list(client.chat.completions.create(messages=task.messages, **kwargs))
    calls = [c for chunk in chunks if chunk.choices for c in chunk.choices[0].delta.tool_calls or []]
    assert [c.index for c in calls] == [0] and chunks[-1].usage.completion_tokens > 0
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == "tool_calls"
    answer = {"role": "assistant", "content": None, "tool_calls": [c.model_dump(exclude={"index"}) for c in calls]}
    result = {
        "role": "tool",
        "tool_call_id": calls[0].id,
        "content": str(eval(json.loads(calls[0].function.arguments)["expression"])),
    }
    chunks = list(client.chat.completions.create(messages=task.messages + [answer, result], **kwargs))
    return 1.0 if "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "#### 42" else 0.0


def test_streamed_turns_with_tool_calls(agent):
    function = agent(entry_point="tests.test_policy_endpoint:streaming_harness")
    trajectories, _ = roll(function, ["What is 6*7?"], n=1, service=ScriptedService(tool_calling_policy))
    assert trajectories[0].reward == 1.0 and not trajectories[0].dropped
    assert TOK.decode(trajectories[0].tokens).endswith("<tool_response>\n42\n</tool_response><|im_end|>\n"
                                                      "<|im_start|>assistant\n#### 42" + END)  # fmt: skip


AGENTS_PYTHON = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".venv-agents", "bin", "python"
)


@pytest.mark.slow
@pytest.mark.skipif(
    not os.path.exists(AGENTS_PYTHON), reason="no .venv-agents: `make test` makes it (requirements/agents.txt)"
)
def test_a_verifiers_environment_plays_its_episodes_through_the_endpoint(agent, tmp_path):
    """A hub from PyPI in its own venv (verifiers 0.4.0, openai 2.x), one process for every episode
    (shared_harness): examples/agents/verifiers_shared_calculator_env.py runs the multiply task as a verifiers Task
    with a calculator Toolset served over MCP, through verifiers' own proxy, against the endpoint, scores with the
    task's reward and posts it. Four episodes, the tool's result masked. (Its learning run: docs/agents.md.)"""
    command = f"{AGENTS_PYTHON} examples/agents/verifiers_shared_calculator_env.py"
    function = agent(command=command, shared_harness=True, harness_timeout_s=180)
    function.harness.log_path = str(tmp_path / "harness.log")
    pool = TrajectoryPool(function, 4, 300)
    pool.add(PromptBatch([TOK.encode(apply_template("qwen", "6*7=?"))], ["#### 42"]))
    clock, rounds = Clock(), 0
    while pool.unfinished():
        assert rounds < 20, "the episodes never finish"
        pool.run_round(ScriptedService(tool_calling_policy), 100 + 1000 * rounds, 3, 300, clock)
        rounds += 1
    pool.join_tools(3, clock)
    pool.close()
    log = (tmp_path / "harness.log").read_text()
    for traj in pool.trajectories:
        assert traj.reward == 1.0 and not traj.dropped, (traj.dropped, log)
        text = TOK.decode(traj.tokens)
        assert text.endswith("<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n#### 42" + END)
        observation = text.index("\n<|im_start|>user")
        assert traj.loss_mask[observation] == 0 and traj.loss_mask[-1] == 1


def over_budget_harness(task):
    """A tool result longer than what is left of the budget: 400 context_length_exceeded; the episode ends cut."""
    import openai

    client = task.client(max_retries=0)
    first = client.chat.completions.create(model=task.model, messages=task.messages)
    answer = {"role": "assistant", "content": first.choices[0].message.content}
    try:
        client.chat.completions.create(
            model=task.model, messages=task.messages + [answer, {"role": "tool", "content": "9" * 500}]
        )
    except openai.BadRequestError as exc:
        assert exc.code == "context_length_exceeded" or "response budget" in str(exc), exc
        return 0.5
    return 0.0


def test_a_follow_up_over_the_budget_ends_the_episode_cut_not_dropped(agent, capsys):
    function = agent(entry_point="tests.test_policy_endpoint:over_budget_harness")
    trajectories, _ = roll(function, ["What is 6*7?"], n=1, max_tokens=100)
    traj = trajectories[0]
    assert (traj.status, traj.finish_reason, traj.reward, traj.dropped) == ("cut", "length", 0.5, "")
    assert function.metrics(trajectories)["episodes/dropped"] == 0 and "dropped" not in capsys.readouterr().out


def test_dropped_episodes_are_explained_on_the_console(agent, capsys):
    function = agent(entry_point="tests.test_policy_endpoint:crashing_harness")
    roll(function, ["What is 6*7?"], n=2)
    function.metrics([])
    assert (
        "episodes: 2 of 2 dropped: the harness failed: RuntimeError: the environment broke (x2)"
        in capsys.readouterr().out
    )


def text_completion_harness(task):
    """Text in, text out, over two turns: the second prompt is the first's, its answer's text, and a new line."""
    client = task.client(max_retries=0)
    first = client.completions.create(model=task.model, prompt=task.prompt)
    more = task.prompt + first.choices[0].text + "\n<|im_start|>user\n<tool_response>\n42\n</tool_response>"
    second = client.completions.create(model=task.model, prompt=more + END + "\n<|im_start|>assistant\n")
    return 1.0 if second.choices[0].text == "#### 42" else 0.0


def test_text_completions_continue_after_the_answers_end_of_turn(agent):
    function = agent(entry_point="tests.test_policy_endpoint:text_completion_harness")
    trajectories, _ = roll(function, ["What is 6*7?"], n=1)
    traj = trajectories[0]
    assert traj.reward == 1.0, traj.dropped
    text = TOK.decode(traj.tokens)  # the first answer's end-of-turn token stays, as the engine wrote it
    assert text.startswith("CALL 6*7 (seed 0)" + END + "\n<|im_start|>user\n<tool_response>") and text.endswith(
        "#### 42" + END
    )


def test_a_regenerated_group_plays_new_episodes_from_the_datasets_prompt(agent):
    """A stale group generated again (stale_trajectories: regenerate) or a parked one restored by a resume starts
    new episodes, whose task is the dataset's prompt, not the previous harness's rendering."""
    function = agent(entry_point="tests.test_policy_endpoint:chat_harness")
    pool = TrajectoryPool(function, 2, 300)
    dataset_prompt = TOK.encode(apply_template("qwen", "What is 6*7?"))
    pool.add(PromptBatch([dataset_prompt], ["42"]))
    service, clock = ScriptedService(policy), Clock()
    for _ in range(2):
        while pool.unfinished():
            pool.run_round(service, 100, 3, 300, clock)
        pool.join_tools(3, clock)
        assert all(t.reward == 1.0 and t.status == "finished" for t in pool.trajectories)
        group = pool.take([0])[0]
        for traj in group:
            traj.prompt = traj.prompt[:-1] + traj.prompt[-1:]  # (the rendering equals the dataset's here)
            traj.restart()
            assert traj.prompt == dataset_prompt and not traj.tokens
        pool.put_back([group], restarted=True)
    pool.close()


def test_a_clients_retry_joins_the_request_in_flight():
    from mindspeed_rl.rollout.endpoint.episodes import EndpointError, EpisodeBook, Turn

    book = EpisodeBook(require_reward=False)
    episode = book.open(0, 100, 50, 200)
    first = book.request(episode, Turn("chat", [1, 2], True, body=b'{"messages": 1}'))
    assert book.request(episode, Turn("chat", [1, 2], True, body=b'{"messages": 1}')) is first  # a retry: one answer
    with pytest.raises(EndpointError, match="in flight"):
        book.request(episode, Turn("chat", [1, 3], True, body=b'{"messages": 2}'))
    turn = book.wait(episode, float("inf"), 1.0)
    book.answer(episode, Reply([7], [-0.1], "stop", [0], 2), "")
    assert first.result(timeout=1).tokens == [7]
    late = Turn("chat", [4], False, body=b"x", after_turns=0)  # read before that answer: stale
    with pytest.raises(EndpointError, match="answered a turn while this request was read"):
        book.request(episode, late)
    assert turn.tokens == [1, 2]


def hold_after_answer(task):
    task.client(max_retries=0).chat.completions.create(model=task.model, messages=task.messages)
    import time

    time.sleep(30)


def test_closing_the_run_ends_the_open_episodes_at_once(agent):
    import time

    function = agent(entry_point="tests.test_policy_endpoint:hold_after_answer")
    pool = TrajectoryPool(function, 1, 300)
    pool.add(PromptBatch([TOK.encode(apply_template("qwen", "Q"))], ["42"]))
    clock = Clock()
    pool.run_round(ScriptedService(policy), 100, 3, 300, clock)  # opens, generates, answers; the harness holds on
    started = time.monotonic()
    function.close()  # the episode still open: ended at once, the tool thread's wait woken
    pool.join_tools(3, clock)
    assert time.monotonic() - started < 5 and pool.trajectories[0].dropped == "the run is closing"
    pool.close()


SHARED_HARNESS = """
import json, os, sys, threading
import httpx
def play(task):
    base = task["base_url"]
    reply = httpx.post(base + "/chat/completions", json={"model": task["model"], "messages": task["messages"]}).json()
    text = reply["choices"][0]["message"]["content"]
    sys.stdout.write(f"{os.getpid()} {task['episode_id']} {text}\\n")  # one write: lines of threads never mix
    sys.stdout.flush()
    if "seed 1" in text:
        httpx.post(base + "/end").raise_for_status()  # no reward: the verifiers score it
    elif "seed 2" in text:
        os._exit(5)  # the whole shared process dies: its open episodes are dropped
    else:
        httpx.post(base + "/reward", json={"reward": 1.0}).raise_for_status()
assert os.environ["OPENAI_BASE_URL"].endswith("/v1")
for line in sys.stdin:
    threading.Thread(target=play, args=(json.loads(line),)).start()
"""


def test_a_shared_harness_plays_every_episode_from_one_process(agent, tmp_path):
    script = tmp_path / "shared.py"
    script.write_text(SHARED_HARNESS)
    function = agent(command="{python} " + str(script), shared_harness=True, harness_timeout_s=30)
    function.harness.log_path = str(tmp_path / "harness.log")
    trajectories, _ = roll(function, ["What is 6*7?"], n=2)  # seeds 100, 101: a reward, then /end
    assert [t.reward for t in trajectories] == [1.0, None] and not any(t.dropped for t in trajectories)
    pids = {line.split()[0] for line in (tmp_path / "harness.log").read_text().splitlines()}
    assert len(pids) == 1  # one process for both episodes
    trajectories, _ = roll(function, ["What is 6*7?"], n=3)  # seed 102 kills it: its open episodes dropped
    assert trajectories[2].dropped == "the harness failed: the shared harness exited with code 5"
    trajectories, _ = roll(function, ["What is 6*7?"], n=2)  # the next episodes start it again
    assert [t.reward for t in trajectories] == [1.0, None] and not any(t.dropped for t in trajectories)
    pids = {line.split()[0] for line in (tmp_path / "harness.log").read_text().splitlines()}
    assert len(pids) == 2
