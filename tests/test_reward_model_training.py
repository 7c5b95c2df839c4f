"""Bradley-Terry reward-model training at unit level: the value-head engine trained on the demo's preference
pairs (``demo.assets.prepare_pairs``: the same body ending in 7 or in another number) ranks held-out pairs."""

import math

from mindspeed_rl.algorithms import bradley_terry_loss, preference_metrics
from mindspeed_rl.datasets.padding import left_pad
from mindspeed_rl.datasets.prompt_dataset import PromptDataset
from mindspeed_rl.models.heads import last_token_values
from tests.helpers import single_process_world_fixture, tiny_model_config, tiny_role

single_process_world = single_process_world_fixture(seed=5)
PAIRS = ("chosen_ids", "rejected_ids")


def pair_rows(items):
    """Each pair as two rows, chosen then rejected: prompt + answer, left-padded (as the PPO reward worker reads
    its rows: the score is the value at the last real token)."""
    ids, mask = left_pad([item["input_ids"] + item[field] for item in items for field in PAIRS], 0)
    return {"input_ids": ids, "attention_mask": mask}


def rewards(outputs, mb):
    r = last_token_values(outputs["raw_values"], mb["attention_mask"])
    return r[0::2], r[1::2]


def test_the_value_head_learns_to_rank_held_out_pairs(tmp_path):
    from mindspeed_rl.demo.assets import prepare_pairs
    from mindspeed_rl.models.engine import MegatronEngine

    paths = prepare_pairs(str(tmp_path), 256, train_pairs=640, test_pairs=64)
    train = PromptDataset(paths["pairs_prefix"], (), token_fields=PAIRS)
    test = PromptDataset(paths["pairs_test_prefix"], (), token_fields=PAIRS)
    assert len(train) == 640 and len(test) == 64
    engine = MegatronEngine(tiny_role(model=tiny_model_config()), head="value", trainable=True, remove_padding=True)
    held_out = pair_rows([test[i] for i in range(len(test))])

    def accuracy():
        return preference_metrics(*rewards(engine.forward(held_out, micro_batch_size=32), held_out))["accuracy"]

    pairs_per_step = 32

    def loss_fn(outputs, mb):  # each micro-batch's share of the step's mean loss
        chosen, rejected = rewards(outputs, mb)
        return bradley_terry_loss(chosen, rejected).sum() / pairs_per_step, {}

    before = accuracy()  # a zero-initialised head ties every pair (a tie counts as wrong)
    losses = []
    for step in range(20):
        items = [train[step * pairs_per_step + i] for i in range(pairs_per_step)]
        losses.append(engine.train_step(pair_rows(items), loss_fn, micro_batch_size=16).loss)
    after = accuracy()
    assert before < 0.6 and after >= 0.95, (before, after)
    assert abs(losses[0] - math.log(2)) < 1e-3  # every pair tied at the start: -log sigmoid(0)
    assert sum(losses[-5:]) / 5 < 0.3, losses
