"""Device detection (with fake torch_npu / CUDA), the device layer, megatron-core on CPU."""

import importlib.util
import os
import platform
import sys
import types

import pytest
import torch

from mindspeed_rl import accelerator
from mindspeed_rl.accelerator import detect
from mindspeed_rl.accelerator.cuda import SOFTMAX_KERNELS


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


def test_the_micro_batch_steps_run_outside_the_cpu_compat_mode():
    """Megatron's schedules run in the mode (their own CUDA tensors); the forward and backward steps inside them
    (the model's operations) do not pay its per-operation dispatch, and the mode is back after them."""
    from torch.overrides import _get_current_function_mode

    from mindspeed_rl.accelerator.megatron_cpu_compat import CudaToCpuMode, apply, off_cpu_mode

    apply()
    from megatron.core.pipeline_parallel import schedules

    assert all(hasattr(getattr(schedules, name), "__wrapped__") for name in ("forward_step", "backward_step"))
    seen = []
    step = off_cpu_mode(lambda: seen.append(_get_current_function_mode()))
    step()  # outside any mode: nothing to set aside
    with CudaToCpuMode() as mode:
        step()
        assert _get_current_function_mode() is mode and torch.zeros(1, device="cuda").device.type == "cpu"
    assert seen == [None, None]


def test_cpu_multi_tensor_kernels_equal_megatrons_local_fallbacks():
    """Gradient clipping's scale (in place, one foreach call) and the gradient norm on the CPU give megatron's
    local fallbacks' numbers, and megatron's optimizer modules call them once the compatibility is applied."""
    from megatron.core import utils

    from mindspeed_rl.accelerator.megatron_cpu_compat import CudaToCpuMode, apply
    from mindspeed_rl.accelerator.megatron_cpu_kernels import cpu_multi_tensor_l2norm, cpu_multi_tensor_scale

    apply()
    from megatron.core.optimizer import clip_grads

    assert clip_grads.multi_tensor_scale_impl is cpu_multi_tensor_scale
    assert clip_grads.l2_norm_impl is cpu_multi_tensor_l2norm
    g = torch.Generator().manual_seed(3)
    grads = [torch.randn(shape, generator=g) for shape in ((7, 5), (11,), (3, 4, 2))]
    theirs, ours = [t.clone() for t in grads], [t.clone() for t in grads]
    storage = [t.data_ptr() for t in ours]
    utils.local_multi_tensor_scale(0, None, [theirs, theirs], 0.37)
    cpu_multi_tensor_scale(0, None, [ours, ours], 0.37)
    assert all(torch.equal(a, b) for a, b in zip(theirs, ours)) and [t.data_ptr() for t in ours] == storage
    bf16 = [torch.empty_like(t, dtype=torch.bfloat16) for t in grads]
    cpu_multi_tensor_scale(0, None, [grads, bf16], 1.0)  # a copy into another dtype
    assert all(torch.equal(a, b.to(torch.bfloat16)) for a, b in zip(bf16, grads))
    with CudaToCpuMode():
        expected, _ = utils.local_multi_tensor_l2_norm(0, None, [grads], False)
    norm, _ = cpu_multi_tensor_l2norm(0, None, [grads], False)
    assert norm.dtype == torch.float32 and norm.shape == (1,)
    assert torch.allclose(norm, expected, rtol=1e-6)
    cpu_multi_tensor_scale(0, None, [[], []], 0.5)  # no gradients: nothing to do, as megatron's loop
    assert float(cpu_multi_tensor_l2norm(0, None, [[]], False)[0]) == 0.0


def test_a_narrow_16_bit_weight_gradient_operand_is_laid_out_transposed_with_its_values_kept():
    """megatron's linear layers prepare grad_output and input for grad_output^T @ input through our stand-in on the
    CPU: the values are megatron's, a bf16 grad_output at most half as wide as the input is stored transposed (its
    transpose contiguous, as oneDNN's fast path wants), a wider or float32 one stays row-major."""
    from megatron.core.tensor_parallel import layers

    from mindspeed_rl.accelerator.megatron_cpu_compat import apply

    apply()
    prepare = layers.prepare_input_tensors_for_wgrad_compute
    megatron_prepare = prepare.megatron_prepare
    g = torch.Generator().manual_seed(5)
    for out_width, dtype, transposed in (
        (8, torch.bfloat16, True),
        (32, torch.bfloat16, False),
        (8, torch.float32, False),
    ):
        grad_output = torch.randn(3, 4, out_width, generator=g).to(dtype)  # [sequence, batch, features]
        inputs = torch.randn(3, 4, 16, generator=g).to(dtype)
        ours, theirs = prepare(grad_output, inputs), megatron_prepare(grad_output, inputs)
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs)) and ours[0].shape == (12, out_width)
        assert ours[0].t().is_contiguous() is transposed and ours[0].is_contiguous() is not transposed
        expected = grad_output.double().reshape(12, -1).t() @ inputs.double().reshape(12, -1)
        assert torch.allclose(ours[0].t().matmul(ours[1]).double(), expected, rtol=2e-2, atol=5e-2)
    apply()  # idempotent: megatron's own function stays the one underneath
    assert layers.prepare_input_tensors_for_wgrad_compute.megatron_prepare is megatron_prepare


def _glibc_at_least(version: tuple) -> bool:
    name, found = platform.libc_ver()
    return name == "glibc" and tuple(int(x) for x in found.split(".")[:2]) >= version


@pytest.mark.skipif(not _glibc_at_least((2, 35)), reason="glibc 2.35's malloc (older ones cap the mmap threshold)")
def test_a_cpu_worker_reuses_freed_host_memory_unless_the_user_tunes_malloc():
    """After the CPU worker's allocator settings a 64 MiB tensor allocated again and again, each freed before the
    next, soon faults in (almost) none of its pages; with the user's own MALLOC_MMAP_THRESHOLD_ (32 MiB: glibc's
    largest default) the settings are left alone and each one is mapped and faulted in anew."""
    import subprocess

    code = (
        "import resource, torch\n"
        "from mindspeed_rl.accelerator.host_memory import keep_freed_host_memory\n"
        "applied = keep_freed_host_memory()\n"
        "faults = []\n"
        "for _ in range(6):\n"
        "    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "    t = torch.ones(16 << 20)\n"
        "    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)\n"
        "    del t\n"
        "print(applied, sum(faults[3:]))\n"
    )
    # glibc's own malloc (the NPU-versions stage preloads tcmalloc, whose mallopt does nothing)
    unset = ("GLIBC_TUNABLES", "LD_PRELOAD")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k not in unset}
    runs = {}
    for name, user_env in (("ours", {}), ("user's", {"MALLOC_MMAP_THRESHOLD_": str(32 << 20)})):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**env, **user_env})
        applied, faults = out.stdout.split()
        runs[name] = (applied, int(faults))
    assert runs["ours"][0] == "True" and runs["user's"][0] == "False", runs
    # huge pages (THP "always") fault a block in 2 MiB at a time, so compare the two rather than count 4 KiB pages
    assert runs["ours"][1] * 4 < runs["user's"][1], runs


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


def test_megatron_core_on_cpu_is_imported_without_compiled_fusers():
    """A fresh process: megatron-core's jit_fuser is the identity (its fused functions run as written), dynamo and
    inductor are not imported, and torch.compile is torch's own again."""
    import subprocess

    code = (
        "import sys, torch\n"
        "compile_ = torch.compile\n"
        "from mindspeed_rl.accelerator.megatron_cpu_compat import apply\n"
        "apply()\n"
        "from megatron.core.jit import jit_fuser\n"
        "from megatron.core.fusions.fused_bias_swiglu import swiglu\n"
        "fn = lambda x: x\n"
        "print(jit_fuser(fn) is fn, type(swiglu).__name__, 'torch._inductor.compile_fx' in sys.modules,\n"
        "      'torch._dynamo' in sys.modules, torch.compile is compile_)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=os.getcwd())
    assert out.stdout.split() == ["True", "function", "False", "False", "True"], out.stderr[-2000:]


def test_cpu_vllm_compiles_only_when_its_engine_is_not_eager():
    """generate_config.enforce_eager false on CPU lets vLLM compile its model: torch.compile works in the process;
    true (the default) keeps every thread eager, a rollout worker's Ray thread among them."""
    import subprocess

    code = (
        "import threading, torch\n"
        "from mindspeed_rl.accelerator.cpu import allow_torch_compile\n"
        "traced = []\n"
        "def backend(gm, inputs):\n"
        "    traced.append(1)\n"
        "    return gm.forward\n"
        "def compiles():\n"
        "    torch._dynamo.reset()\n"
        "    before = len(traced)\n"
        "    torch.compile(lambda x: x * 2 + 1, backend=backend)(torch.ones(3))\n"
        "    return len(traced) > before\n"
        "def in_thread():\n"
        "    out = []\n"
        "    t = threading.Thread(target=lambda: out.append(compiles()))\n"
        "    t.start()\n"
        "    t.join()\n"
        "    return out[0]\n"
        "for compiled in (False, True, False):\n"
        "    allow_torch_compile(compiled)\n"
        "    print(compiles(), in_thread())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=os.getcwd())
    assert out.stdout.split() == ["False", "False", "True", "True", "False", "False"], out.stderr[-2000:]


def test_megatron_core_imported_first_by_a_model_module_has_no_compiled_fusers_either():
    """A process whose first megatron-core import is one of our model modules (a test module, a CLI tool building a
    model in-process) gets the CPU accelerator's import: no inductor kernels beside the workers' uncompiled ones."""
    import subprocess

    code = (
        "import sys, torch\n"
        "import mindspeed_rl.models.attention\n"
        "from megatron.core.jit import jit_fuser\n"
        "fn = lambda x: x\n"
        "print(jit_fuser(fn) is fn, 'torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=os.getcwd())
    assert out.stdout.split() == ["True", "False"], out.stderr[-2000:]


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
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)
        )
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


# ----- the decisions behind the device floor (tests/test_device_floor.py) --------------------------------
FEATURES = {
    "transformer_engine",
    "rope_fusion",
    "gradient_accumulation_fusion",
    "sequence_parallel",
    "masked_softmax_fusion",
    "flash_attn",
    "fused_rmsnorm",
    "fused_swiglu",
    "compiled_kernels",
    "bias_activation_fusion",
    "bias_dropout_fusion",
    "ring_attention",
    "liger_kernels",
    "vendor_attention",
}


def fake_ray(ids):
    mod = types.ModuleType("ray")
    context = types.SimpleNamespace(get_accelerator_ids=lambda: ids)
    mod.get_runtime_context = lambda: context
    return mod


def no_ray_noset_env(monkeypatch):
    import os

    for key in [k for k in os.environ if k.startswith("RAY_EXPERIMENTAL_NOSET_")]:
        monkeypatch.delenv(key)


def test_cpu_decisions(monkeypatch):
    from mindspeed_rl.accelerator.cpu import vllm_kv_cache_bytes
    from mindspeed_rl.config_cls import GenerateConfig

    acc = accelerator.make_accelerator("cpu")
    assert not acc.pin_memory and not acc.offload_when_idle and not acc.vllm_supports_sleep
    assert acc.cpu_initialization
    assert acc.device_rng_state() is None
    acc.set_device_rng_state(torch.zeros(4, dtype=torch.uint8))  # nothing to set
    assert acc.comm_device(torch.device("cpu")) == torch.device("cpu")
    module = torch.nn.Linear(2, 2)
    assert acc.place_model(module) is module
    # torch.compile's RMSNorm, SwiGLU and RoPE where inductor finds its C++ compiler (CXX, else g++)
    monkeypatch.setenv("CXX", sys.executable)  # any program found
    assert acc.fused_features() == dict(dict.fromkeys(FEATURES, False), compiled_kernels=True)
    monkeypatch.setenv("CXX", "no-such-compiler")
    assert acc.fused_features() == dict.fromkeys(FEATURES, False)
    monkeypatch.delenv("CXX")
    assert acc.bundle_spec(3.0) == {"CPU": 3.0}
    assert acc.actor_options(1.5) == {"num_cpus": 1.5}
    monkeypatch.setitem(sys.modules, "ray", fake_ray({"CPU": ["5"]}))
    monkeypatch.setenv("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", "1")
    assert acc.local_rank() == 0
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    gen = GenerateConfig(gpu_memory_utilization=0.2)
    # no chunked prefill on CPU (a split prefill rewinds a seeded CPU generator), so a step holds a whole prompt
    assert acc.vllm_engine_kwargs(gen) == {
        "kv_cache_memory_bytes": vllm_kv_cache_bytes(gen),
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": max(gen.max_num_batched_tokens, gen.max_model_len),
    }


def test_cpu_kv_cache_budget_is_shared_by_the_engine_processes_of_a_host(monkeypatch, caplog):
    from mindspeed_rl.accelerator.cpu import vllm_kv_cache_bytes
    from mindspeed_rl.compat import vllm as compat_vllm
    from mindspeed_rl.config_cls import GenerateConfig

    gib = 2**30
    memory = {"node": (100 * gib, 60 * gib)}  # total, available
    monkeypatch.setattr(compat_vllm, "cpu_node_memory", lambda: memory["node"])
    gen = GenerateConfig(gpu_memory_utilization=0.1)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert vllm_kv_cache_bytes(gen) == 10 * gib
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert vllm_kv_cache_bytes(gen) == int(2.5 * gib)
    # vLLM refuses a budget over the node's available memory: a loaded host gets 90% of what is free, said once
    memory["node"] = (100 * gib, 8 * gib)
    with caplog.at_level("WARNING"):
        assert vllm_kv_cache_bytes(gen) == int(0.9 * 8 * gib / 4)
    assert "2.50 GiB of KV cache per engine, but 8.00 GiB of host memory is free for 4 engine(s)" in caplog.text


def test_cpu_node_memory_is_what_vllms_cpu_worker_checks():
    resources = pytest.importorskip("vllm.utils.cpu_resource_utils")  # vLLM 0.32; older ones: psutil's figures

    from mindspeed_rl.compat import vllm as compat_vllm

    total, available = compat_vllm.cpu_node_memory()
    info = resources.get_memory_node_info(resources.get_allowed_cpu_list()[0].numa_node)
    assert total == info.total_memory and 0 < available <= total


def test_vllm_head_dims_limit_cpu_only():
    from mindspeed_rl.config_cls import GenerateConfig
    from mindspeed_rl.rollout.engines.vllm_engine import vllm_unusable_reason
    from tests.helpers import tiny_model_config

    cpu = accelerator.accelerator_class("cpu")
    assert cpu.vllm_unusable_reason(32) is None
    assert cpu.vllm_unusable_reason(16) == (
        "vLLM's CPU attention supports head_dim (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512); the model has 16"
    )
    for kind in ("cuda", "npu"):
        assert accelerator.accelerator_class(kind).vllm_unusable_reason(16) is None
    gen = GenerateConfig()
    assert vllm_unusable_reason(tiny_model_config(hidden_size=128), gen, "cpu") is None  # head_dim 32
    # vLLM's Qwen2 ignores head_dim: kv_channels other than hidden / heads cannot run anywhere
    assert "kv_channels 64" in vllm_unusable_reason(tiny_model_config(hidden_size=128, kv_channels=64), gen, "cuda")
    # Qwen3 honours head_dim: 128-wide heads on a 5120 / 64 = 80 hidden split (Qwen3-32B) are fine
    qwen3 = tiny_model_config(
        hidden_size=5120 // 8,
        num_attention_heads=8,
        kv_channels=128,
        add_qkv_bias=False,
        qk_layernorm=True,
        model_type_hf="qwen3",
    )
    assert vllm_unusable_reason(qwen3, gen, "cpu") is None


def test_device_kinds_answer_without_their_device(monkeypatch):
    from mindspeed_rl.config_cls import GenerateConfig

    gen = GenerateConfig(gpu_memory_utilization=0.3)
    for kind in ("cuda", "npu"):
        cls = accelerator.accelerator_class(kind)
        assert cls.pin_memory and cls.offload_when_idle and cls.vllm_supports_sleep
        assert not cls.cpu_initialization
        assert cls.vllm_engine_kwargs(gen) == {"gpu_memory_utilization": 0.3, "enable_sleep_mode": True}
    always = dict(
        sequence_parallel=True,
        flash_attn=True,
        fused_rmsnorm=True,
        fused_swiglu=True,
        bias_activation_fusion=True,
        bias_dropout_fusion=True,
    )
    assert accelerator.accelerator_class("npu").fused_features() == dict(
        always,
        compiled_kernels=False,
        liger_kernels=False,  # MindSpeed's adaptor fuses the norm and SwiGLU there
        transformer_engine=False,
        rope_fusion=True,
        gradient_accumulation_fusion=True,
        masked_softmax_fusion=False,
        ring_attention=True,
        vendor_attention=True,  # MindSpeed's flash attention replaces megatron's padded core attention
    )
    cuda = accelerator.accelerator_class("cuda")
    monkeypatch.setitem(sys.modules, "transformer_engine", None)  # not installed
    for kernel in SOFTMAX_KERNELS:
        monkeypatch.setitem(sys.modules, kernel, None)
    found = {"liger_kernel": None}  # liger-kernel not installed
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: found.get(name, real_find_spec(name, *a)))
    assert cuda.fused_features() == dict(
        always,
        fused_rmsnorm=False,  # neither Transformer Engine nor liger-kernel
        fused_swiglu=False,
        compiled_kernels=False,
        liger_kernels=False,
        transformer_engine=False,
        rope_fusion=False,
        gradient_accumulation_fusion=False,
        masked_softmax_fusion=False,  # no Apex / fused_kernels: megatron's unfused softmax
        ring_attention=False,
        vendor_attention=False,
    )
    found["liger_kernel"] = real_find_spec("json")  # any spec: installed
    assert cuda.fused_features()["liger_kernels"] == (real_find_spec("triton") is not None)
    monkeypatch.setitem(sys.modules, "transformer_engine", types.ModuleType("transformer_engine"))
    for kernel in SOFTMAX_KERNELS:
        monkeypatch.setitem(sys.modules, kernel, types.ModuleType(kernel))
    assert cuda.fused_features() == dict(
        always,
        compiled_kernels=False,
        liger_kernels=real_find_spec("triton") is not None,
        transformer_engine=True,
        rope_fusion=True,
        gradient_accumulation_fusion=True,
        masked_softmax_fusion=True,
        ring_attention=True,
        vendor_attention=False,
    )
    with pytest.raises(detect.DeviceUnavailable, match="is not a device kind"):
        accelerator.accelerator_class("tpu")


def test_cuda_placement_and_ranks_without_a_gpu(monkeypatch):
    import os

    acc = accelerator.make_accelerator("cuda")
    assert acc.bundle_spec(2.0) == {"GPU": 1.0, "CPU": 2.0}
    assert acc.actor_options(0.5) == {"num_cpus": 0.01, "resources": {"GPU": 0.5}}
    assert acc.bundle_cpus(2) == (1.0, max(1, (os.cpu_count() or 1) // 2))
    assert acc.comm_device(torch.device("cuda", 1)) == torch.device("cuda", 1)
    monkeypatch.setattr(torch.nn.Module, "to", lambda self, device: (self, device))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    module = torch.nn.Linear(2, 2)
    assert acc.place_model(module) == (module, torch.device("cuda", 3))
    no_ray_noset_env(monkeypatch)
    monkeypatch.setitem(sys.modules, "ray", fake_ray({"GPU": ["3"]}))
    assert acc.local_rank() == 0  # Ray set CUDA_VISIBLE_DEVICES: the one device is 0
    monkeypatch.setenv("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", "1")
    assert acc.local_rank() == 3
    monkeypatch.setitem(sys.modules, "ray", fake_ray({"NPU": ["3"]}))
    assert acc.local_rank() == 0


def test_device_rng_state_reaches_the_checkpoint(monkeypatch):
    """engine_io saves and restores the device generator through the accelerator (CUDA and NPU faked)."""
    from mindspeed_rl.checkpoint import engine_io

    monkeypatch.setattr(accelerator, "_ACCELERATOR", accelerator.make_accelerator("cpu"))
    assert "device" not in engine_io.rng_state()  # no device generator of its own
    saved = torch.tensor([7, 8], dtype=torch.uint8)
    restored = []
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda: saved)
    monkeypatch.setattr(torch.cuda, "set_rng_state", restored.append)
    monkeypatch.setattr(accelerator, "_ACCELERATOR", accelerator.make_accelerator("cuda"))
    state = engine_io.rng_state()
    assert state["device"] is saved
    engine_io.set_rng_state(state)
    assert restored == [saved]

    monkeypatch.setitem(sys.modules, "torch_npu", fake_torch_npu())
    monkeypatch.setattr(
        torch, "npu", types.SimpleNamespace(get_rng_state=lambda: saved, set_rng_state=restored.append), raising=False
    )
    npu = accelerator.make_accelerator("npu")
    assert npu.device_rng_state() is saved
    npu.set_device_rng_state(saved)
    assert restored == [saved, saved]


def test_a_world_of_one_ignores_an_inherited_master_port_that_is_taken(monkeypatch):
    """A single-process run (check_env, generate) must not die on a MASTER_PORT a parent's group still holds."""
    import socket

    from mindspeed_rl.utils import dist

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(taken.getsockname()[1]))
        dist.init_distributed()
        try:
            assert torch.distributed.get_world_size() == 1
            assert os.environ["MASTER_PORT"] != str(taken.getsockname()[1])
        finally:
            dist.destroy()


def test_rendezvous_ports_are_picked_below_the_ephemeral_range():
    """Outgoing connections (Ray opens many) draw from the ephemeral range and could take a port picked there
    before the process group binds it (EADDRINUSE seen in CI): rendezvous ports come from below it."""
    from mindspeed_rl.utils.dist import FIXED_PORTS, _ephemeral_low, free_port

    low = _ephemeral_low()
    ports = [free_port() for _ in range(20)] + [free_port("")]
    if low > FIXED_PORTS.start:
        assert all(FIXED_PORTS.start <= p < low for p in ports), ports


def test_a_forced_device_that_cannot_run_is_one_line_and_exit_2_in_the_entry_points(
    monkeypatch, capsys, demo_assets, tmp_path
):
    """MINDSPEED_RL_DEVICE that names no kind is refused by dry_run (before any heavy import); one whose device is
    missing here stops a real run, cli/train_rm.py and cli/check_env.py with one line (exit 2, no traceback)."""
    from cli import check_env, train_ppo, train_rm
    from mindspeed_rl.accelerator import reset_accelerator

    monkeypatch.setitem(sys.modules, "torch_npu", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    paths = [
        f"megatron_training.tokenizer_name_or_path={demo_assets['tokenizer']}",
        f"megatron_training.data_path={demo_assets['data_prefix']}",
        f"megatron_training.test_data_path={demo_assets['test_prefix']}",
        f"rl_config.log_dir={tmp_path}/logs",
        f"actor_config.save={tmp_path}/ckpt",
    ]
    runs = [
        ("tpu", train_ppo.main, ["--config-name", "ppo_tiny_cpu", "dry_run=true"], "'tpu' is not a device kind"),
        ("tpu", train_rm.main, ["--config-name", "rm_tiny_cpu", "dry_run=true"], "'tpu' is not a device kind"),
        ("cuda", train_ppo.main, ["--config-name", "ppo_tiny_cpu", *paths], "cuda, but torch.cuda"),
        ("npu", check_env.main, ["--steps", "versions"], "npu, but torch_npu is not importable"),
    ]
    for kind, main, argv, said in runs:
        reset_accelerator()
        monkeypatch.setenv(detect.ENV_VAR, kind)
        assert main(argv) == 2, (kind, argv)
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and detect.ENV_VAR in err and said in err and "Traceback" not in err, err
    reset_accelerator()
