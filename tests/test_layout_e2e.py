"""End to end on ppo_tiny_cpu_x4, the CPU twin of the 32B recipe's layout (actor TP 2 x DP 2, two vLLM
engines of infer TP 2, critic TP 2 x DP 2, one placement group of 4 bundles): each engine's ranks get the
same prompts, rollout log-probs equal the actor's, and a resume continues where it stopped.

The first two iterations run with context parallelism (actor and critic TP 2 x CP 2, Ulysses): the actor's
log-probs over the split sequences still equal vLLM's, and the resume loads those checkpoints at CP 1.
"""

import pytest

from mindspeed_rl.checkpoint import megatron_layout as ml
from mindspeed_rl.features import load_ppo_config
from mindspeed_rl.workers.worker_group import WorkerGroup
from tests.helpers import demo_config


def x4_config(root, paths, iters, **extra):
    return demo_config("ppo_tiny_cpu_x4", root, paths, iters, **extra)


@pytest.mark.slow
def test_x4_twin_engines_logprobs_and_resume(tmp_path, monkeypatch, demo_assets):
    from mindspeed_rl.trainer.launch import train

    root, paths = str(tmp_path), demo_assets
    vocab = load_ppo_config("ppo_tiny_cpu_x4").actor.model.padded_vocab_size
    assert vocab == load_ppo_config("ppo_tiny_cpu").actor.model.padded_vocab_size  # the demo assets' tokenizer
    generated = []
    original = WorkerGroup.collect_generate

    def spy(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        generated.append((self.engines(), result))
        return result

    monkeypatch.setattr(WorkerGroup, "collect_generate", spy)
    cp2 = {"actor_config.context_parallel_size": 2, "critic_config.context_parallel_size": 2}
    first = train(x4_config(root, paths, 2, **cp2))
    resume = {
        "actor_config.finetune": "false",
        "critic_config.finetune": "false",
        "actor_config.load": f"{root}/ckpt/actor",
        "critic_config.load": f"{root}/ckpt/critic",
    }
    second = train(x4_config(root, paths, 3, **resume))

    assert len(generated) == 3
    for engines, result in generated:
        assert engines == [[0, 1], [2, 3]]
        digests = {r.rank: r.request_digest for r in result.per_rank}
        for ranks in engines:  # both ranks of each engine received identical requests
            assert digests[ranks[0]] == digests[ranks[1]]
        assert digests[0] != digests[2]  # and the two engines shared the prompts out
        leaders = [r for r in result.per_rank if r.outputs is not None]
        assert sorted(r.rank for r in leaders) == [0, 2]
        assert len(result.outputs) == 8 * 8  # every prompt x sample, once
    for metrics in first + second:
        assert metrics["rollout/logprob_diff_max"] < 1e-4, metrics["rollout/logprob_diff_max"]
    assert [m["iteration"] for m in first] == [1, 2]
    assert [m["iteration"] for m in second] == [3]  # continued from the saved iteration
    assert ml.read_tracker(f"{root}/ckpt/actor") == 3 and ml.read_tracker(f"{root}/ckpt/critic") == 3
    saved = ml.load_rank(f"{root}/ckpt/actor", 1, 0, mmap=False)  # TP rank 1's shard of the resumed actor
    assert saved["iteration"] == 3 and saved["trainer_state"]["consumed_samples"] == 3 * 8
