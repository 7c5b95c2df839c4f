"""Device detection (with fake torch_npu / CUDA), the device layer, megatron-core on CPU."""
import sys
import types

import pytest
import torch

from mindspeed_rl import accelerator
from mindspeed_rl.accelerator import detect


def fake_torch_npu(available: bool = True, count: int = 8) -> types.ModuleType:
    mod = types.ModuleType("torch_npu")
    mod.npu = types.SimpleNamespace(is_available=lambda: available, device_count=lambda: count)
    return mod


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    monkeypatch.delenv(detect.ENV_VAR, raising=False)
    accelerator.reset_accelerator()
    yield
    accelerator.reset_accelerator()


def test_cpu_when_nothing_else(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # import fails
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert detect.detect_device_kind() == "cpu"
    acc = accelerator.get_accelerator()
    assert (acc.kind, acc.dist_backend, acc.ray_resource) == ("cpu", "gloo", "CPU")
    assert acc.device(3) == torch.device("cpu")
    assert set(acc.memory_stats()) == {"allocated_gib", "reserved_gib", "max_allocated_gib", "host_rss_gib"}
    assert acc.memory_stats()["host_rss_gib"] > 0
    acc.synchronize()
    acc.empty_cache()


def test_npu_preferred_over_cuda(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", fake_torch_npu())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert detect.detect_device_kind() == "npu"


def test_npu_module_without_devices_is_not_npu(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", fake_torch_npu(available=False, count=0))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert detect.detect_device_kind() == "cuda"


def test_cuda_when_no_npu(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert detect.detect_device_kind() == "cuda"
    acc = accelerator.make_accelerator("cuda")
    assert (acc.dist_backend, acc.ray_resource) == ("nccl", "GPU")
    assert acc.device(5) == torch.device("cuda", 1)
    assert acc.ray_bundle(0.5) == {"GPU": 0.5}


def test_npu_accelerator_names(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", fake_torch_npu(count=16))
    monkeypatch.setattr(torch, "npu", types.SimpleNamespace(device_count=lambda: 16), raising=False)
    acc = accelerator.make_accelerator("npu")
    assert (acc.kind, acc.dist_backend, acc.ray_resource) == ("npu", "hccl", "NPU")
    assert acc.device_count() == 16


def test_env_override_forces_cpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", fake_torch_npu())
    monkeypatch.setenv(detect.ENV_VAR, "cpu")
    assert detect.detect_device_kind() == "cpu"


def test_env_override_refuses_unusable_or_unknown(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv(detect.ENV_VAR, "npu")
    with pytest.raises(detect.DeviceUnavailable, match="torch_npu"):
        detect.detect_device_kind()
    monkeypatch.setenv(detect.ENV_VAR, "cuda")
    with pytest.raises(detect.DeviceUnavailable, match="cuda"):
        detect.detect_device_kind()
    monkeypatch.setenv(detect.ENV_VAR, "tpu")
    with pytest.raises(detect.DeviceUnavailable, match="one of npu, cuda, cpu"):
        detect.detect_device_kind()


def test_cpu_compat_mode_maps_cuda_requests():
    from mindspeed_rl.accelerator.megatron_cpu_compat import CudaToCpuMode

    with CudaToCpuMode():
        a = torch.zeros(3, device="cuda")
        b = torch.ones(2).cuda()
        c = torch.ones(2).to("cuda:0")
        assert a.device.type == b.device.type == c.device.type == "cpu"
        assert torch.ones(1).type() == "torch.cuda.FloatTensor"
    assert torch.ones(1).type() == "torch.FloatTensor"


def test_cpu_rng_tracker_forks_and_restores():
    from mindspeed_rl.accelerator.megatron_cpu_compat import CpuRNGStatesTracker

    tracker = CpuRNGStatesTracker()
    tracker.add("model-parallel-rng", 7)
    torch.manual_seed(0)
    outside = torch.get_rng_state()
    with tracker.fork():
        first = torch.rand(3)
    assert torch.equal(torch.get_rng_state(), outside)
    with tracker.fork():
        second = torch.rand(3)
    assert not torch.equal(first, second)  # the tracked stream advanced
    gen = torch.Generator().manual_seed(7)
    assert torch.equal(first, torch.rand(3, generator=gen))


def test_megatron_gpt_forward_backward_on_cpu():
    """A local-spec GPTModel trains a step on CPU once the accelerator has prepared megatron."""
    from mindspeed_rl.config_cls import MegatronConfig
    from mindspeed_rl.models.builder import build_gpt_model
    from mindspeed_rl.utils import dist
    from tests.helpers import tiny_model_config

    acc = accelerator.get_accelerator()
    assert acc.kind == "cpu"
    dist.init_distributed()
    try:
        dist.init_model_parallel(seed=3)
        model_cfg = tiny_model_config(num_layers=2)
        gpt = build_gpt_model(model_cfg, MegatronConfig(model="tiny"))
        tokens = torch.randint(0, model_cfg.padded_vocab_size, (2, 24))
        positions = torch.arange(24).expand(2, -1)
        mask = torch.triu(torch.ones(24, 24, dtype=torch.bool), 1)[None, None].expand(2, 1, 24, 24)
        logits = gpt(tokens, positions, mask)
        assert logits.shape == (2, 24, model_cfg.padded_vocab_size)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                 tokens[:, 1:].reshape(-1))
        loss.backward()
        assert torch.isfinite(loss)
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in gpt.parameters())
        # the mask is honoured: changing a later token leaves earlier logits unchanged
        tokens2 = tokens.clone()
        tokens2[:, -1] = (tokens2[:, -1] + 1) % model_cfg.padded_vocab_size
        with torch.no_grad():
            assert torch.allclose(gpt(tokens2, positions, mask)[:, :-1], logits[:, :-1].detach(), atol=1e-6)
    finally:
        dist.destroy()
