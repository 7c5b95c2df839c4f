"""Rank layout: engines as vLLM splits the world, DP groups as megatron builds them, and the diagram."""

import pytest

from mindspeed_rl.trainer.startup.layout import dp_groups, engine_blocks, layout_diagram


@pytest.mark.parametrize("tp,dp,pp", [(2, 2, 1), (1, 4, 1), (2, 1, 2), (8, 4, 1), (2, 2, 2)])
def test_dp_groups_match_megatron_rank_generator(tp, dp, pp):
    from megatron.core.parallel_state import RankGenerator

    generator = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=1, order="tp-cp-ep-dp-pp")
    by_dp = {}
    for group in generator.get_ranks("dp"):  # ranks that share a TP x PP place
        for d, rank in enumerate(group):
            by_dp.setdefault(d, []).append(rank)
    assert dp_groups(tp, dp, pp) == [sorted(by_dp[d]) for d in range(dp)]


def test_engine_blocks_are_contiguous_like_vllm_external_launcher():
    assert engine_blocks(4, 2) == [[0, 1], [2, 3]]
    assert engine_blocks(32, 8)[3] == list(range(24, 32))
    assert engine_blocks(2, 1) == [[0], [1]]


def test_layout_diagram_of_the_x4_twin_and_a_pipeline_layout():
    def cells(text):
        return [[c.strip() for c in line.split("|")[:-1]] for line in text.splitlines()]

    twin = cells(layout_diagram(4, 2, [("actor", 2, 2, 1), ("critic", 2, 2, 1)]))
    assert twin == [
        ["ranks", "0-1", "2-3"],
        ["rollout", "engine 0", "engine 1"],
        ["actor train", "DP 0", "DP 1"],
        ["critic train", "DP 0", "DP 1"],
    ]
    piped = cells(layout_diagram(4, 1, [("actor", 2, 1, 2)]))  # TP 2 x PP 2, 4 engines of infer TP 1
    assert piped[1][1:] == ["engine 0", "engine 1", "engine 2", "engine 3"]
    assert piped[2][1:] == ["DP 0 PP 0", "DP 0 PP 0", "DP 0 PP 1", "DP 0 PP 1"]
    wide = cells(layout_diagram(64, 1, [("actor", 1, 64, 1)]))
    assert wide[0][-2:] == ["... (56 more)", "63"] and len(wide[0]) == 1 + 8 + 1
