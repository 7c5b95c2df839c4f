"""Rule verifiers registered by name."""
import pytest

from mindspeed_rl.rewards import get_verifier, known_verifiers
from mindspeed_rl.rewards.verifiers import extract_answer


def test_registry_names():
    assert {"acc_for_ppo", "format", "strict_format", "gsm8k", "math"} <= set(known_verifiers())
    with pytest.raises(KeyError, match="acc_for_ppo"):
        get_verifier("nope")


@pytest.mark.parametrize("text,answer", [
    ("so the total is \\boxed{72}.", "72"),
    ("\\boxed{\\frac{1}{2}} and later \\boxed{3}", "3"),
    ("Natalia sold 48/2 = 24 clips in May.\n#### 72", "72"),
    ("it costs $1,200 in all", "1,200"),
    ("no digits here", None),
])
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


@pytest.mark.parametrize("response,label,score", [
    ("The answer is \\boxed{72}", "72", 1.0),
    ("The answer is \\boxed{71}", "72", 0.0),
    ("#### 1,200", "1200", 1.0),
    ("x = 0.5", "1/2", 1.0),             # 1/2 is not a plain number: math-verify decides
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("I think 3 then 4", "4", 1.0),
    ("nothing", "4", 0.0),
])
def test_acc_for_ppo(response, label, score):
    assert get_verifier("acc_for_ppo")(response, label) == score


def test_format_rewards():
    good = "<think>add them</think> <answer>\\boxed{4}</answer>"
    assert get_verifier("format")(good, "4") == 1.0
    assert get_verifier("strict_format")(good, "4") == 1.0
    assert get_verifier("format")("hi " + good, "4") == 1.0
    assert get_verifier("strict_format")("hi " + good, "4") == 0.0
    assert get_verifier("format")("<answer>4</answer>", "4") == 0.0
