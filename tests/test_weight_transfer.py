"""The weight channel of the disaggregated layout: a group of its own (not the default world) streams full
tensors piece by piece from the actor's sender to every rollout rank, bit for bit."""

import os

import torch

from mindspeed_rl.utils.dist import free_port
from tests import parallel_worker


def pieces():
    gen = torch.Generator().manual_seed(3)
    return [
        {"embedding.word_embeddings.weight": torch.randn(7, 4, generator=gen)},
        {
            "decoder.layers.0.mlp.linear_fc1.weight": torch.randn(6, 4, generator=gen).to(torch.bfloat16),
            "decoder.layers.0.self_attention.linear_qkv.bias": torch.randn(12, generator=gen),
        },
        {},
        {"decoder.final_layernorm.weight": torch.ones(4, dtype=torch.float64)},
    ]


def run(rank, size, port, workdir):
    from mindspeed_rl.rollout.weights.weight_transfer import WeightChannel

    channel = WeightChannel("127.0.0.1", port, rank, size, torch.device("cpu"), timeout_s=60)
    if rank == 0:
        stats = channel.send(pieces())
        torch.save(stats, os.path.join(workdir, "sent.pt"))
    else:
        torch.save(list(channel.receive()), os.path.join(workdir, f"received{rank}.pt"))


def test_every_receiver_gets_every_piece_exactly(tmp_path):
    parallel_worker.start_world(run, (3, free_port(), str(tmp_path)), 3)
    want = pieces()  # an empty piece (a stage with nothing to send) is not the end
    sent = torch.load(tmp_path / "sent.pt")
    assert sent["tensors"] == 4 and sent["bytes"] == 7 * 4 * 4 + 6 * 4 * 2 + 12 * 4 + 4 * 8
    for rank in (1, 2):
        got = torch.load(tmp_path / f"received{rank}.pt")
        assert [list(p) for p in got] == [list(p) for p in want]
        for a, b in zip(got, want):
            for name in a:
                assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name
