"""vLLM's native weight-transfer API behind our weight channel (``generate_config.weight_transfer: vllm_native``):
which API each vLLM release has, the choice and its fallback, and a real transfer into a dummy-weight vLLM
engine through the release's own start / update / finish lifecycle (our gloo engine on CPU)."""

import os

import pytest
import torch

from mindspeed_rl.compat import vllm_weight_transfer as native
from mindspeed_rl.config_cls import GenerateConfig, SamplingConfig
from mindspeed_rl.protocol import RolloutRequest
from mindspeed_rl.utils.dist import free_port
from tests import parallel_worker
from tests.helpers import tiny_model_config

MODEL = dict(num_layers=2, hidden_size=128, ffn_hidden_size=256, padded_vocab_size=256)
PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [100, 200, 30, 250, 20]]


def vllm_release():
    import vllm

    return tuple(int(part) for part in vllm.__version__.split(".")[:2])


def test_each_release_has_the_api_we_expect():
    """0.18: the single-shot form only (we keep our channel); 0.22-0.2x: the worker's start / update / finish
    around the engine; 0.3x: the engine owns the lifecycle."""
    release = vllm_release()
    want = None if release < (0, 22) else native.WORKER_LIFECYCLE if release < (0, 30) else native.ENGINE_LIFECYCLE
    assert native.native_api() == want
    reason = native.unavailable_reason()
    assert (reason is None) == (want is not None)
    if reason:
        assert "0.22" in reason and "start / update / finish" in reason


def test_the_worker_keeps_the_channel_and_says_why_where_native_cannot_run():
    from mindspeed_rl.workers.rollout_worker import RolloutWorker

    worker = RolloutWorker.__new__(RolloutWorker)

    class Engine:
        name, weight_transfer_backend, weight_transfer_unavailable = "vllm", None, "vLLM 0.18.0 has no ..."

    worker.engine, worker.gen = Engine(), GenerateConfig(weight_transfer="vllm_native")
    assert worker.weight_transfer() == ("channel", "vLLM 0.18.0 has no ...")
    Engine.name, Engine.weight_transfer_unavailable = "fallback", None  # the megatron-core engine: no vLLM at all
    assert worker.weight_transfer() == ("channel", "the fallback engine has no vLLM to receive through")
    Engine.weight_transfer_backend = "nccl"
    assert worker.weight_transfer() == ("vllm_native", None)
    worker.gen = GenerateConfig()
    Engine.weight_transfer_backend = None
    assert worker.weight_transfer() == ("channel", None)  # not asked for: nothing to say


def test_an_unknown_backend_is_named_with_the_registered_ones():
    if native.native_api() is None:
        pytest.skip("this vLLM release has no streamed weight-transfer API")
    native.register_gloo_engine()
    with pytest.raises(KeyError, match="no weight-transfer engine 'nope'.*mindspeed_rl_gloo"):
        native.engine_class("nope")


def pieces(model, scale=1.0):
    """The resharding stream's shape: embedding, one piece per layer, an empty piece, final norm + head."""
    from tests.helpers import random_full_weights

    full = random_full_weights(model, seed=0)
    layer = [{k: v * scale for k, v in full.items() if k.startswith(f"decoder.layers.{i}.")} for i in range(2)]
    first = {"embedding.word_embeddings.weight": full["embedding.word_embeddings.weight"] * scale}
    last = {k: full[k] * scale for k in ("decoder.final_layernorm.weight", "output_layer.weight")}
    return [first, *layer, {}, last]


def run_transfer(rank, size, ports, workdir):
    from mindspeed_rl.rollout.engines.vllm_engine import VllmEngine, vllm_named
    from mindspeed_rl.rollout.weights.weight_transfer import VllmNativeChannel

    os.environ["OMP_NUM_THREADS"] = "1"
    model = tiny_model_config(**MODEL)
    gen = GenerateConfig(
        backend="vllm",
        dtype="float32",
        max_model_len=64,
        max_num_seqs=8,
        max_num_batched_tokens=512,
        gpu_memory_utilization=0.005,
        weight_transfer="vllm_native",
    )
    cpu = torch.device("cpu")
    if rank == 0:
        backend = native.register_gloo_engine()
        prepare = lambda piece: vllm_named(piece, model, gen.dtype)  # noqa: E731
        channel = VllmNativeChannel("127.0.0.1", ports[0], 0, size, cpu, backend, ports[1], prepare=prepare)
        sent = [channel.send(pieces(model, scale=0.5)), channel.send(pieces(model))]
        torch.save(sent, os.path.join(workdir, "sent.pt"))
        return
    engine = VllmEngine(model, gen, "cpu", eos_token_id=0)
    channel = VllmNativeChannel(
        "127.0.0.1", ports[0], rank, size, cpu, engine.weight_transfer_backend, ports[1], engine
    )
    # first other weights, then the real ones: the second update must replace the first everywhere
    stats = [channel.load_into(engine), channel.load_into(engine)]
    greedy = [
        o.response_ids
        for o in engine.generate(RolloutRequest.of(PROMPTS, SamplingConfig(temperature=0, max_tokens=10)))
    ]
    torch.save(
        {"stats": stats, "greedy": greedy, "backend": engine.weight_transfer_backend}, os.path.join(workdir, "got.pt")
    )
    engine.shutdown()
    parallel_worker.run_fresh_engine(0, 1, {}, workdir, 0)  # the engine of a fresh load, in this process


@pytest.mark.slow
def test_native_transfer_gives_the_engine_of_a_fresh_load(tmp_path):
    if native.native_api() is None:
        pytest.skip("this vLLM release has no streamed weight-transfer API (the run keeps our channel)")
    from tests.test_rollout import write_hf_folder

    model = tiny_model_config(**MODEL)
    full = {k: v for piece in pieces(model) for k, v in piece.items()}
    write_hf_folder(tmp_path / "hf", model, full)
    torch.save(PROMPTS, tmp_path / "prompts.pt")
    ports = [free_port(), free_port()]
    while ports[1] == ports[0]:
        ports[1] = free_port()
    parallel_worker.start_world(run_transfer, (2, ports, str(tmp_path)), 2)
    got, sent = torch.load(tmp_path / "got.pt"), torch.load(tmp_path / "sent.pt")
    assert got["backend"] == native.GLOO_BACKEND
    assert got["greedy"] == torch.load(tmp_path / "fresh.pt")
    # the receiver counts what was announced; HF names split megatron's fused q/k/v and gate/up
    assert sent[1]["tensors"] == got["stats"][1]["tensors"] and sent[1]["bytes"] == got["stats"][1]["bytes"]
    assert got["stats"][1]["tensors"] > len(full)
