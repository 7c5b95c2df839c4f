"""Preference optimisation (cli/train_dpo.py): each loss against its paper's formula on hand-built log-probs, TRL's
metrics, the rows' answer mask and the config's refusals. The end-to-end run (DPO from the SFT stage's save, resumed
exactly) is in tests/test_sft.py."""

import math

import pytest
import torch

from mindspeed_rl.algorithms.preference import dpo_loss, dpo_metrics, ipo_loss, simpo_loss
from mindspeed_rl.config_cls.dpo_config import DPOConfig
from mindspeed_rl.datasets.pairs import dpo_rows
from mindspeed_rl.workers.dpo_worker import pair_losses


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


def test_each_loss_is_its_papers_formula():
    pc, pr = torch.tensor([-3.0, -5.0]), torch.tensor([-4.0, -2.0])  # the policy's answer log-probs
    rc, rr = torch.tensor([-3.5, -4.0]), torch.tensor([-3.5, -3.0])  # the reference's
    beta = 0.5
    for i in range(2):
        h = (float(pc[i]) - float(rc[i])) - (float(pr[i]) - float(rr[i]))  # Rafailov et al. eq. 7
        assert float(dpo_loss(pc, pr, rc, rr, beta)[i]) == pytest.approx(-math.log(sigmoid(beta * h)))
        smoothed = -0.8 * math.log(sigmoid(beta * h)) - 0.2 * math.log(sigmoid(-beta * h))  # cDPO, e = 0.2
        assert float(dpo_loss(pc, pr, rc, rr, beta, 0.2)[i]) == pytest.approx(smoothed)
        assert float(ipo_loss(pc, pr, rc, rr, beta)[i]) == pytest.approx((h - 1 / (2 * beta)) ** 2)  # Azar et al. 17
    mean_c, mean_r = torch.tensor([-0.5]), torch.tensor([-0.9])
    expected = -math.log(sigmoid(2.0 * (-0.5 + 0.9) - 0.3))  # Meng et al. eq. 6
    assert float(simpo_loss(mean_c, mean_r, 2.0, 0.3)[0]) == pytest.approx(expected)
    assert float(dpo_loss(pc, pr, pc, pr, beta)[0]) == pytest.approx(math.log(2))  # the policy is the reference


# Two pairs at beta 0.5 (target gap 1 / (2 beta) = 1): summed answer log-probs of the policy and the reference, and
# the answers' token counts. Pair 0: log-ratios +2 over 4 tokens, -3 over 3; pair 1: -1 over 2, +1 over 5.
IPO_PAIRS = dict(pc=[-6.0, -2.0], rc=[-8.0, -1.0], pr=[-9.0, -10.0], rr=[-6.0, -11.0], nc=[4, 2], nr=[3, 5])
IPO_AVERAGED = [(2 / 4 + 3 / 3 - 1) ** 2, (-1 / 2 - 1 / 5 - 1) ** 2]  # (0.5)^2 = 0.25, (-1.7)^2 = 2.89
IPO_SUMMED = [(2 + 3 - 1) ** 2, (-1 - 1 - 1) ** 2]  # 16, 9


def test_ipo_on_average_log_likelihoods_is_azar_et_al_and_trl():
    t = {k: torch.tensor(v, dtype=torch.float32) for k, v in IPO_PAIRS.items()}
    averaged = ipo_loss(t["pc"], t["pr"], t["rc"], t["rr"], 0.5, t["nc"], t["nr"])
    assert averaged.tolist() == pytest.approx(IPO_AVERAGED) and IPO_AVERAGED == pytest.approx([0.25, 2.89])
    assert ipo_loss(t["pc"], t["pr"], t["rc"], t["rr"], 0.5).tolist() == pytest.approx(IPO_SUMMED)


def ipo_rows():
    """The pairs as the worker gets them: rows chosen, rejected side by side, each answer's log-probs spread over its
    answer tokens after a prompt whose log-probs must not count."""
    width, rows, masks = 7, [], []
    for total, tokens in zip([-6.0, -9.0, -2.0, -10.0], [4, 3, 2, 5]):
        rows.append([-7.0] * (width - tokens) + [total / tokens] * tokens)
        masks.append([0] * (width - tokens) + [1] * tokens)
    return torch.tensor(rows), {
        "answer_mask": torch.tensor(masks),
        "ref_logps": torch.tensor([-8.0, -6.0, -1.0, -11.0]),
    }


def test_ipo_averages_each_answers_log_ratio_over_its_answer_tokens_by_default():
    log_probs, rows = ipo_rows()
    loss, sums = pair_losses(DPOConfig(dpo_loss_type="ipo", dpo_beta=0.5), log_probs, rows)
    assert loss.tolist() == pytest.approx(IPO_AVERAGED)  # the summed form gives 16 and 9
    assert float(sums["rewards/margins"]) == pytest.approx(0.5 * ((0.5 + 1.0) + (-0.5 - 0.2)))  # TRL: averages
    summed = DPOConfig(dpo_loss_type="ipo", dpo_beta=0.5, ipo_length_normalized=False)
    loss, sums = pair_losses(summed, log_probs, rows)
    assert loss.tolist() == pytest.approx(IPO_SUMMED)
    assert float(sums["rewards/margins"]) == pytest.approx(0.5 * ((2 + 3) + (-1 - 1)))


def test_trl_metrics_are_the_implicit_rewards():
    pc, pr = torch.tensor([-3.0, -5.0]), torch.tensor([-4.0, -2.0])
    got = dpo_metrics(pc, pr, torch.tensor([-3.5, -4.0]), torch.tensor([-3.5, -3.0]), 0.5)
    assert float(got["rewards/chosen"]) == pytest.approx(0.5 * (0.5 + -1.0))
    assert float(got["rewards/rejected"]) == pytest.approx(0.5 * (-0.5 + 1.0))
    assert float(got["rewards/accuracies"]) == 1.0  # pair 0: 0.25 > -0.25; pair 1: -0.5 < 0.5
    assert float(got["rewards/margins"]) == pytest.approx(0.5 - 1.0)
    assert float(got["logps/chosen"]) == -8.0 and float(got["logps/rejected"]) == -6.0


def test_dpo_rows_mark_each_answer_after_its_left_padded_prompt():
    items = [{"input_ids": [5, 6], "chosen_ids": [7, 2], "rejected_ids": [8]}, {"input_ids": [9], "chosen_ids": [1],
             "rejected_ids": [3, 4, 2]}]  # fmt: skip
    rows = dpo_rows(items)
    assert rows["input_ids"].tolist() == [[5, 6, 7, 2], [0, 5, 6, 8], [0, 0, 9, 1], [9, 3, 4, 2]]
    assert rows["answer_mask"].tolist() == [[0, 0, 1, 1], [0, 0, 0, 1], [0, 0, 0, 1], [0, 1, 1, 1]]


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["dpo_config.dpo_loss_type=ipo", "dpo_config.dpo_label_smoothing=0.1"], "dpo_config.dpo_label_smoothing"),
        (["dpo_config.dpo_loss_type=simpo", "dpo_config.ref_model=./x"], "dpo_config.ref_model"),
        (["actor_config.lora_r=8", "dpo_config.ref_model=./x"], "dpo_config.ref_model"),
        (["dpo_config.dpo_beta=0"], "dpo_config.dpo_beta"),
        (["+dpo_config.ipo_length_normalized=false"], "dpo_config.ipo_length_normalized"),
        (["+dpo_config.beta=0.1"], "dpo_config.beta"),
        (["rl_config.use_dynamic_bsz=true"], "rl_config.use_dynamic_bsz"),
    ],
)
def test_a_bad_dpo_config_exits_2_naming_the_key(overrides, key, capsys):
    from cli.train_dpo import main

    assert main(["--config-name", "dpo_tiny_cpu", *overrides]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and key in err[0] and "Traceback" not in err[0], err


def test_a_missing_reference_is_named_before_anything_starts(capsys):
    from cli.train_dpo import main

    assert main(["--config-name", "dpo_tiny_cpu", "--check", "dpo_config.ref_model=/nonexistent/sft"]) == 2
    assert "dpo_config.ref_model: folder '/nonexistent/sft' does not exist" in capsys.readouterr().err
