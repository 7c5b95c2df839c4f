"""What the policy endpoint costs the driver: episodes of two chat turns through the real server, against an engine
that answers at once, so that everything measured is HTTP, the episodes' bookkeeping and the harness's client.

    .venv/bin/python bench/endpoint_overhead.py [--prompts 16] [--n 8]

Prints one line per harness: plain httpx requests, and the `openai` client of ``EpisodeTask.client()`` (the
shared connection pool); each after one warm-up batch.
"""

from __future__ import annotations

import argparse
import sys
import time

from mindspeed_rl.config_cls.agent_config import AgentConfig
from mindspeed_rl.config_cls.endpoint_config import PolicyEndpointConfig
from mindspeed_rl.datasets.prompt_dataset import PromptBatch
from mindspeed_rl.datasets.templates import apply_template
from mindspeed_rl.protocol import GeneratedBatch, RolloutOutput
from mindspeed_rl.rollout.endpoint.harness import shared_http_client
from mindspeed_rl.rollout.service import RolloutHandle, RolloutService
from mindspeed_rl.rollout.source.agent_loop import AgentContext, build_rollout_function
from mindspeed_rl.rollout.source.external_agent import EndpointRun
from mindspeed_rl.rollout.source.rounds import TrajectoryPool
from mindspeed_rl.utils.clock import Clock

END = "<|im_end|>"


class Chars:
    """One token per character."""

    eos_token, pad_token_id = END, 0

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=False):
        text = "".join(chr(i) for i in ids)
        return text.replace(END, "") if skip_special_tokens else text

    def __len__(self):
        return 0x110000


class Instant(RolloutService):
    """Answers every prompt at once with a short turn."""

    def submit(self, request):
        outputs = [
            RolloutOutput(j, [ord(c) for c in "#### 42" + END], [-0.1] * 11, "stop")
            for j in range(len(request.prompts))
        ]
        return RolloutHandle(request, self.version, outputs)

    def collect(self, handle):
        return GeneratedBatch(handle.pending, {}, [])


def raw_harness(task):
    client = shared_http_client()
    first = client.post(task.base_url + "/chat/completions", json={"messages": task.messages}).json()
    answer = {"role": "assistant", "content": first["choices"][0]["message"]["content"]}
    client.post(
        task.base_url + "/chat/completions",
        json={"messages": task.messages + [answer, {"role": "user", "content": "sure?"}]},
    )
    return 1.0


def openai_harness(task):
    client = task.client(max_retries=0)
    first = client.chat.completions.create(model=task.model, messages=task.messages)
    answer = {"role": "assistant", "content": first.choices[0].message.content}
    client.chat.completions.create(
        model=task.model, messages=task.messages + [answer, {"role": "user", "content": "sure?"}]
    )
    return 1.0


def batch(function, prompts: int, n: int) -> float:
    pool = TrajectoryPool(function, n, 200)
    pool.add(PromptBatch([[ord(c) for c in apply_template("qwen", f"Q{i}")] for i in range(prompts)], ["42"] * prompts))
    started, clock, rounds = time.perf_counter(), Clock(), 0
    while pool.unfinished():
        pool.run_round(Instant(), 1 + rounds, 0, 200, clock)
        rounds += 1
    pool.join_tools(0, clock)
    pool.close()
    return time.perf_counter() - started


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    args = parser.parse_args(argv)
    sys.modules.setdefault("endpoint_overhead", sys.modules[__name__])
    episodes = args.prompts * args.n
    for name in ("raw_harness", "openai_harness"):
        context = AgentContext(None, Chars(), settings=AgentConfig(max_turns=4))
        keys = PolicyEndpointConfig(entry_point=f"endpoint_overhead:{name}")
        context.endpoint = EndpointRun(keys, "qwen", 400, 4096)
        function = build_rollout_function("openai_agent", context)
        batch(function, args.prompts, args.n)  # warm-up
        seconds = batch(function, args.prompts, args.n)
        function.close()
        per_request = seconds / (2 * episodes) * 1000
        print(f"{name}: {episodes} episodes x 2 turns in {seconds:.2f} s = {per_request:.1f} ms per request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
