"""The driver with a fake actor group (no Ray, no model): DAPO's dynamic sampling through the trainer's rollout
source (which groups are kept, how the batch is completed when filter_groups_max_batches is reached, the group
ids and widths of the assembled experience, the resumable prompt position), overlong shaping, validation
metrics, and the seeds of the generation rounds."""

import pytest
import torch

from mindspeed_rl.features import load_ppo_config
from mindspeed_rl.protocol import GeneratedBatch, RolloutOutput
from mindspeed_rl.rollout.source.rollout_source import SeedStream
from mindspeed_rl.trainer.ppo.batches import build_batches
from mindspeed_rl.trainer.ppo.ppo_trainer import PPOTrainer

RIGHT, WRONG = 7, 3  # response token ids the fake verifier reads


class Tokenizer:
    pad_token_id, eos_token_id = 0, 1

    def __len__(self):
        return 100

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


class Runner:
    """acc = 1 when the response contains token 7."""

    def score_each(self, texts, labels):
        acc = torch.tensor([1.0 if str(RIGHT) in t.split() else 0.0 for t in texts])
        return {"acc_for_ppo": acc}, {"acc_for_ppo_rewards/mean": float(acc.mean())}

    def weighted(self, per_verifier):
        return per_verifier["acc_for_ppo"]


class Sampler:
    def __init__(self, size):
        self.size, self.consumed_samples = size, 0

    def next_batch(self):
        batch = [(self.consumed_samples + i) % 64 for i in range(self.size)]
        self.consumed_samples += self.size
        return batch


class Actor:
    """Prompt p (its first token) gets: all right if p % 3 == 0, all wrong if p % 3 == 1, mixed otherwise.
    Requests come one row per sample (the prompt repeated, n=1), so a sample is known by its seed s (request
    seed + row): in a mixed group the even seeds are right (a group's n=4 consecutive seeds: 2 right, 2
    wrong); response lengths 1 + (p + s) % 5 (within the row's max_new_tokens), so widths differ between
    batches. Records each request's seed."""

    def __init__(self):
        self.calls, self.requests = [], []

    def generate(self, request, version=None):
        prompts, n, seed, max_new_tokens = request.prompts, request.n, request.seed, request.max_new_tokens
        self.calls.append(seed)
        self.sampling = request.sampling
        outputs = []
        for i, prompt in enumerate(prompts):
            kind = prompt[0] % 3
            for k in range(n):
                s = seed + i * n + k
                token = RIGHT if kind == 0 or (kind == 2 and s % 2 == 0) else WRONG
                length = 1 + (prompt[0] + s) % 5
                cap = max_new_tokens[i] if max_new_tokens is not None else length
                ids = [token] * min(length, cap)
                outputs.append(RolloutOutput(i, ids, [-0.5] * len(ids), "stop" if length <= cap else "length"))
        return GeneratedBatch(outputs, {}, [])

    # the worker group's side of the colocated rollout service: generation answers at once
    def submit_generate(self, request, version=None):
        self.requests.append(request)
        return self.generate(request, version)

    def collect_generate(self, pending):
        return pending


def trainer(test_dataset=None, **overrides):
    cfg = load_ppo_config(
        "dapo_tiny_cpu",
        [f"rl_config.{k}={v}" for k, v in overrides.items()]
        + [
            "megatron_training.global_batch_size=6",
            "rl_config.n_samples_per_prompt=4",
            "rl_config.mini_batch_size=8",
            "actor_config.micro_batch_size=8",
            "rl_config.filter_groups_train_batch_size=4",
        ],
    )
    dataset = [{"input_ids": [p] + [5] * (p % 4), "labels": "7"} for p in range(64)]
    actor = Actor()
    batches = build_batches(cfg, actor, dataset, Sampler(6), Tokenizer(), Runner())
    return PPOTrainer(cfg, actor, None, batches, Tokenizer(), logger=None, test_dataset=test_dataset)


def rollout(t):
    """The trainer's first batch from its rollout source."""
    batch = t.source.next_batch(0)
    return batch.experience, batch.metrics


def group_prompts(exp):
    """The first prompt token (the prompt's number) of each group of 4 rows."""
    return [int(exp.input_ids[r, exp.prompt_width - 1 - (exp.prompt_mask[r].sum() - 1)]) for r in (0, 4, 8, 12)]


def test_groups_that_all_score_alike_are_dropped_until_the_batch_is_full():
    t = trainer(filter_groups_max_batches=-1)
    exp, metrics = rollout(t)
    # batch 1 (prompts 0-5): informative prompts 2, 5; batch 2 (6-11): 8, 11 -> 4 groups in 2 batches
    assert metrics["dynamic_sampling/batches"] == 2 and metrics["dynamic_sampling/filled_groups"] == 0
    assert metrics["dynamic_sampling/kept_groups"] == 4
    assert exp.num_rows == 16 and exp.group.tolist() == [g for g in range(4) for _ in range(4)]
    assert group_prompts(exp) == [2, 5, 8, 11]
    for g in range(4):  # every kept group has both right and wrong responses
        rows = exp.response_ids[exp.group == g]
        assert (rows == RIGHT).any() and (rows == WRONG).any()
    # new prompts, new seeds: one round per draw, each a request of one row per sample (24 rows), the second
    # seeded where the first one's seeds end
    start = SeedStream(t.gen.sampling_config.seed, "train").start
    assert t.sampler.consumed_samples == 12 and t.actor.calls == [start, start + 24]
    assert [(r.n, len(r.prompts)) for r in t.actor.requests] == [(1, 24), (1, 24)]
    assert t.actor.requests[1].prompts[:4] == [[6, 5, 5]] * 4  # prompt 6 ([6] + [5] * (6 % 4)), once per sample
    # over every generated response: per batch 2 all-right prompts (8) + 2 half-right (4) of 24
    assert metrics["acc_for_ppo_rewards/mean"] == 12 / 24


def test_the_batch_is_completed_with_filtered_groups_at_the_batch_limit():
    t = trainer(filter_groups_max_batches=1)
    exp, metrics = rollout(t)
    assert metrics["dynamic_sampling/kept_groups"] == 2 and metrics["dynamic_sampling/filled_groups"] == 2
    assert metrics["dynamic_sampling/batches"] == 1
    assert exp.num_rows == 16 and exp.group.tolist()[-1] == 3
    # the kept groups first (prompts 2, 5), then the first filtered ones (prompts 0, 1)
    assert group_prompts(exp) == [2, 5, 0, 1]
    assert t.sampler.consumed_samples == 6


def test_overlong_shaping_lowers_the_score_of_long_responses():
    t = trainer(
        filter_groups_max_batches=-1, overlong_buffer=2, rollout_max_tokens=4, overlong_buffer_penalty_factor=1.0
    )
    exp, metrics = rollout(t)
    lengths = exp.response_mask.sum(1)
    acc = (exp.response_ids == RIGHT).any(1).float()
    want = acc + ((2 - lengths.float()) / 2).clamp(-1, 0)  # 0 up to 2 tokens, -0.5 at 3, -1 from 4
    assert torch.allclose(exp.scores, want)
    assert metrics["overlong/penalised_share"] > 0


def test_validation_metrics_over_the_whole_test_set():
    test = [{"input_ids": [p], "labels": "7"} for p in (0, 1, 2, 4)]  # all right, all wrong, mixed, all wrong
    t = trainer(test_dataset=test, **{"val_kwargs.n": 4, "val_kwargs.temperature": 0.5})
    metrics = t.validate()
    assert t.actor.sampling.temperature == 0.5 and t.actor.sampling.max_tokens == 16
    # one round: row j (prompt j // 4) seeded with the validation round's base + j, the same at every validation
    seed = SeedStream(t.gen.sampling_config.seed, "validation").start
    assert t.actor.calls == [seed] and [(r.n, len(r.prompts)) for r in t.actor.requests] == [(1, 16)]
    assert metrics["val/acc_for_ppo/mean@4"] == (4 + 0 + 2 + 0) / 16
    assert metrics["val/pass@4"] == 2 / 4 and metrics["val/score/mean"] == 6 / 16
    # the unbiased pass@k of the 4 responses: the mixed prompt (2 right of 4) 1/2 at k=1, 1 - C(2,2)/C(4,2) at k=2
    assert metrics["val/pass@1"] == pytest.approx((1 + 0 + 0.5 + 0) / 4)
    assert metrics["val/pass@2"] == pytest.approx((1 + 0 + 5 / 6 + 0) / 4)
    lengths = [1 + (p + seed + 4 * i + k) % 5 for i, p in enumerate((0, 1, 2, 4)) for k in range(4)]
    assert metrics["val/response_length/mean"] == sum(lengths) / 16
    t.iteration = 5
    assert not t.validation_due()  # test_freq 0 here: only the last iteration validates
    t.iteration = t.cfg.megatron_training.train_iters
    assert t.validation_due()
    assert trainer().validate() == {} and not trainer().validation_due()


def test_generation_seeds_of_runs_with_neighbouring_seeds_do_not_overlap():
    """Sample i of a round is seeded base + i and torch's CPU generator keeps 32 bits of a seed: within a run the
    rounds take consecutive seeds (none repeats), and the streams of seeds 1 and 2 (training and validation)
    start far apart in those bits, or two runs would draw the same random streams shifted by one."""
    stream = SeedStream(1, "train")
    bases = [stream.take(rows) for rows in (24, 24, 7, 130)]
    assert bases == [stream.start + k for k in (0, 24, 48, 55)] and stream.used == 185
    starts = [SeedStream(seed, name).start for seed in (1, 2) for name in ("train", "validation")]
    assert all(0 <= s < 2**32 for s in starts)
    assert min(abs(a - b) for i, a in enumerate(starts) for b in starts[i + 1 :]) > 1_000_000
    assert SeedStream(1, "train", used=2**32 - stream.start).take(1) == 0  # wraps within 32 bits
