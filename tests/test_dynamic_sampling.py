"""The driver with a fake actor group (no Ray, no model): DAPO's dynamic sampling (which groups are kept, how
the batch is completed when filter_groups_max_batches is reached, the group ids and widths of the assembled
experience, the resumable prompt position), overlong shaping, and validation metrics."""

import torch

from mindspeed_rl.config_cls import load_ppo_config
from mindspeed_rl.protocol import GeneratedBatch, RolloutOutput
from mindspeed_rl.trainer.ppo_trainer import PPOTrainer

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
    """Prompt p (its first token) gets: all right if p % 3 == 0, all wrong if p % 3 == 1, mixed otherwise;
    response lengths grow with the sample index, so widths differ between batches."""

    def __init__(self):
        self.calls = []

    def generate(self, prompts, n, seed, sampling=None):
        self.calls.append(seed)
        self.sampling = sampling
        outputs = []
        for i, prompt in enumerate(prompts):
            kind = prompt[0] % 3
            for k in range(n):
                token = RIGHT if kind == 0 or (kind == 2 and k % 2 == 0) else WRONG
                ids = [token] * (1 + (prompt[0] + k) % 5)
                outputs.append(RolloutOutput(i, ids, [-0.5] * len(ids), "stop"))
        return GeneratedBatch(outputs, {}, [])

    # the worker group's side of the colocated rollout service: generation answers at once
    def submit_generate(self, request, version=None):
        return self.generate(request.prompts, request.n, request.seed, request.sampling)

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
    return PPOTrainer(
        cfg, Actor(), None, Runner(), dataset, Sampler(6), Tokenizer(), logger=None, test_dataset=test_dataset
    )


def test_groups_that_all_score_alike_are_dropped_until_the_batch_is_full():
    t = trainer(filter_groups_max_batches=-1)
    exp, metrics = t.rollout()
    # batch 1 (prompts 0-5): informative prompts 2, 5; batch 2 (6-11): 8, 11 -> 4 groups in 2 batches
    assert metrics["dynamic_sampling/batches"] == 2 and metrics["dynamic_sampling/filled_groups"] == 0
    assert exp.num_rows == 16 and exp.group.tolist() == [g for g in range(4) for _ in range(4)]
    assert [int(exp.input_ids[r, exp.prompt_width - 1 - (exp.prompt_mask[r].sum() - 1)]) for r in (0, 4, 8, 12)] == [
        2,
        5,
        8,
        11,
    ]
    for g in range(4):  # every kept group has both right and wrong responses
        rows = exp.response_ids[exp.group == g]
        assert (rows == RIGHT).any() and (rows == WRONG).any()
    assert t.sampler.consumed_samples == 12 and len(set(t.actor.calls)) == 2  # new prompts, new seeds
    # over every generated response: per batch 2 all-right prompts (8) + 2 half-right (4) of 24
    assert metrics["acc_for_ppo_rewards/mean"] == 12 / 24


def test_the_batch_is_completed_with_filtered_groups_at_the_batch_limit():
    t = trainer(filter_groups_max_batches=1)
    exp, metrics = t.rollout()
    assert metrics["dynamic_sampling/kept_groups"] == 2 and metrics["dynamic_sampling/filled_groups"] == 2
    assert exp.num_rows == 16 and exp.group.tolist()[-1] == 3
    assert t.sampler.consumed_samples == 6


def test_overlong_shaping_lowers_the_score_of_long_responses():
    t = trainer(
        filter_groups_max_batches=-1, overlong_buffer=2, rollout_max_tokens=4, overlong_buffer_penalty_factor=1.0
    )
    exp, metrics = t.rollout()
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
    assert metrics["val/acc_for_ppo/mean@4"] == (4 + 0 + 2 + 0) / 16
    assert metrics["val/pass@4"] == 2 / 4 and metrics["val/score/mean"] == 6 / 16
    assert metrics["val/response_length/mean"] == sum(1 + (p + k) % 5 for p in (0, 1, 2, 4) for k in range(4)) / 16
    t.iteration = 5
    assert not t.validation_due()  # test_freq 0 here: only the last iteration validates
    t.iteration = t.cfg.megatron_training.train_iters
    assert t.validation_due()
    assert trainer().validate() == {} and not trainer().validation_due()


def test_generation_seeds_of_runs_with_neighbouring_seeds_do_not_overlap():
    """Sample i of a call is seeded base + i and torch's CPU generator keeps 32 bits of a seed: the bases of
    seeds 1 and 2 (and of the calls within a run) must lie further apart in those bits than a call has
    samples, or two runs draw the same random streams shifted by one."""
    from types import SimpleNamespace

    def bases(seed):
        trainer = SimpleNamespace(gen=SimpleNamespace(sampling_config=SimpleNamespace(seed=seed)), iteration=3)
        return {
            PPOTrainer.sample_seed(trainer, batch, iteration) % 2**32
            for iteration in range(1, 50)
            for batch in range(4)
        }

    one, two = bases(1), bases(2)
    assert len(one) == 49 * 4
    assert min(abs(a - b) for a in one for b in two) > 100_000
    assert min(abs(a - b) for a in one for b in one if a != b) > 10_000
