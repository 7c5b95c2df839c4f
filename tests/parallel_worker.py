"""Worker of the multi-process parallel-equivalence tests (run through torch.multiprocessing)."""

import os
import sys

import torch
import torch.distributed as torch_dist

from mindspeed_rl.compat.megatron_core import destroy_model_parallel


def start_rank(rank, world, port, tp=1, pp=1, ep=1, cp=1, vpp=1):
    """One thread per process, the gloo world, megatron's TP x PP (x EP, x CP) groups seeded alike on every
    rank. Returns ``mindspeed_rl.utils.dist``."""
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    from mindspeed_rl.utils import dist

    dist.init_distributed(rank, world, master_port=port)  # (an earlier job of ``run_each``: already there)
    dist.init_model_parallel(tp, pp, seed=5, ep=ep, cp=cp, vpp=vpp)
    return dist


def run_each(rank, world, jobs, workdir, port):
    """``jobs``: (worker function name, spec) pairs, run in turn in one spawned world of ``world`` processes
    (one start-up and one set of imports for them all, the seconds a spawn costs). Each job's megatron groups
    end after it (the next builds and seeds its own, as in a spawn of its own); the world ends with the last."""

    for name, spec in jobs:
        globals()[name](rank, world, spec, workdir, port)
        ps = sys.modules.get("megatron.core.parallel_state")  # (a job without megatron never imported it)
        if ps is not None and ps.model_parallel_is_initialized():
            destroy_model_parallel()


# The compatibility stages (scripts/test_npu_versions.sh) give every job a world of its own: the older releases
# keep state across a re-initialisation in one process (vLLM 0.18's engines, megatron-core 0.12's groups).
FRESH_WORLDS = os.environ.get("MINDSPEED_RL_TEST_FRESH_WORLDS") == "1"


def start_world(fn, args, nprocs):
    """``fn(rank, *args)`` in ``nprocs`` fresh processes (joined). They fork from a server that imported the
    heavy modules once (``start_forkserver``; 4-6 s of CPU per process otherwise): the server lives as long as
    this process, with this process's environment as it was when the server started."""
    import torch.multiprocessing as mp

    from tests.conftest import start_forkserver

    start_forkserver()
    mp.start_processes(fn, args=args, nprocs=nprocs, start_method="forkserver")


def spawn_each(world, jobs, workdir):
    """``run_each`` of ``jobs`` in ``world`` fresh processes (joined); a world per job with FRESH_WORLDS."""
    from mindspeed_rl.utils.dist import free_port

    jobs = list(jobs)
    for group in [[job] for job in jobs] if FRESH_WORLDS else [jobs]:
        start_world(run_each, (world, group, str(workdir), free_port()), world)


def spawn(name, world, spec, workdir):
    """The worker function ``name`` on ``spec`` in ``world`` spawned processes (joined)."""
    spawn_each(world, [(name, spec)], workdir)


def spawn_layouts(name, specs, workdir):
    """``name`` for each spec (each with its ``world``): one spawn per world size, the specs of that size run
    one after another in it."""
    for world in sorted({spec["world"] for spec in specs}):
        spawn_each(world, [(name, spec) for spec in specs if spec["world"] == world], workdir)


def global_sft_loss(normaliser):
    def loss_fn(outputs, mb):
        mask = mb["attention_mask"][:, 1:].float() * mb["attention_mask"][:, :-1].float()
        share = -(outputs["log_probs"][:, 1:] * mask).sum() / normaliser
        return share, {"tokens": float(mask.sum())}

    return loss_fn


def value_loss(normaliser):
    def loss_fn(outputs, mb):
        mask = mb["attention_mask"].float()
        return ((outputs["values"] - 1.0) ** 2 * mask).sum() / normaliser, {}

    return loss_fn


def seq_mean_token_mean_loss(scale):
    """A non-token aggregation through the shared LossScale of the whole batch (what the actor does)."""
    from mindspeed_rl.algorithms.losses import aggregate

    def loss_fn(outputs, mb):
        mask = mb["attention_mask"][:, 1:] * mb["attention_mask"][:, :-1]
        return aggregate(-outputs["log_probs"][:, 1:], mask, "seq-mean-token-mean", scale), {}

    return loss_fn


def small_rollout_config(**changes):
    """The rollout settings of the tests' small engines: vLLM in float32 on a 128-token context, a small KV cache."""
    from mindspeed_rl.config_cls import GenerateConfig

    settings = dict(
        backend="vllm",
        dtype="float32",
        max_model_len=128,
        max_num_seqs=16,
        max_num_batched_tokens=1024,
        gpu_memory_utilization=0.005,
    )
    return GenerateConfig(**{**settings, **changes})


def run(rank, world, spec, workdir, port):
    from megatron.core import parallel_state as ps

    from mindspeed_rl.checkpoint.sharding import merge_state_dicts, shard_state_dict
    from mindspeed_rl.models.engine import MegatronEngine
    from tests.helpers import make_batch, tiny_model_config, tiny_role

    tp, pp, cp, vpp = spec["tp"], spec["pp"], spec.get("cp", 1), spec.get("vpp", 1)
    start_rank(rank, world, port, tp, pp, cp=cp, vpp=vpp)
    model = tiny_model_config(num_layers=4)
    layer_list = spec.get("num_layer_list")
    counts = [int(x) for x in layer_list.split(",")] if layer_list else [model.num_layers // pp] * pp
    if vpp > 1:  # an interleaved pipeline: each rank's layers, chunk by chunk
        from mindspeed_rl.config_cls.megatron_config import pipeline_layers

        counts = pipeline_layers(model.num_layers, pp, vpp)
    tp_rank, pp_rank = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
    dp_rank, dp = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
    cp_rank = ps.get_context_parallel_rank()
    results = {}
    batch = make_batch(8, 20, vocab=model.padded_vocab_size, seed=1)
    rows = batch["input_ids"].shape[0] // dp
    local = {k: v[dp_rank * rows : (dp_rank + 1) * rows] for k, v in batch.items()}
    normaliser = float((batch["attention_mask"][:, 1:] * batch["attention_mask"][:, :-1]).sum())
    from mindspeed_rl.algorithms.losses import LossScale

    scale = LossScale.of(batch["attention_mask"][:, 1:] * batch["attention_mask"][:, :-1])
    for run_name in ("lm", "value", "lm_seq"):
        head = run_name[:2] if run_name.startswith("lm") else run_name
        full = torch.load(os.path.join(workdir, f"full_{head}.pt"), weights_only=True)
        role = tiny_role(
            "actor" if head == "lm" else "critic",
            tp=tp,
            pp=pp,
            num_devices=world,
            model=model,
            num_layer_list=layer_list,
            use_distributed_optimizer=spec.get("dist_opt", False),
            lr=1e-4,
            context_parallel_size=cp,
            sequence_parallel=spec.get("sp", False),
            log_prob_chunk_size=spec.get("chunk", 1024),
            virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
        )
        engine = MegatronEngine(role, head=head, total_steps=4, remove_padding=spec.get("packed", False))
        engine.load_weights(shard_state_dict(full, tp, tp_rank, counts, pp_rank))
        budget = spec.get("budget")  # token-budget micro-batches (use_dynamic_bsz)
        out = engine.forward(local, micro_batch_size=2, with_entropy=True, token_budget=budget)
        loss_fn = {
            "lm": global_sft_loss(normaliser),
            "lm_seq": seq_mean_token_mean_loss(scale),
            "value": value_loss(float(batch["attention_mask"].sum())),
        }[run_name]
        step = engine.train_step(local, loss_fn, micro_batch_size=2, token_budget=budget)
        gathered = [None] * world
        torch_dist.all_gather_object(
            gathered,
            (pp_rank, tp_rank, dp_rank if cp_rank == 0 else -1, out, {k: v.clone() for k, v in engine.named_weights()}),
        )
        if rank == 0:  # (a CP rank other than 0 holds copies: listed with DP rank -1)
            outs = [g[3] for g in sorted(gathered, key=lambda g: g[2]) if g[0] == pp - 1 and g[1] == 0 and g[2] >= 0]
            results[run_name] = {k: torch.cat([o[k] for o in outs]) for k in outs[0]}
            shards = [
                [next(g[4] for g in gathered if g[0] == p and g[1] == t and g[2] == 0) for t in range(tp)]
                for p in range(pp)
            ]
            results[run_name + "_weights"] = merge_state_dicts(shards, counts)
            results[run_name + "_loss"] = step.loss
            results[run_name + "_grad_norm"] = step.grad_norm
    if rank == 0:
        torch.save(results, os.path.join(workdir, f"result_{spec['name']}.pt"))


def run_vision(rank, world, spec, workdir, port):
    """A vision-language model (``vl_model.json``, weights ``vl_full.pt``) at TP ``spec['tp']``: the log-probs of
    ``vl_batch.pt`` (rows with images), one training step's loss and grad norm, and every rank's tower after it."""
    import json

    from megatron.core import parallel_state as ps

    from mindspeed_rl.checkpoint.sharding import shard_state_dict
    from mindspeed_rl.config_cls import ModelConfig
    from mindspeed_rl.models.engine import MegatronEngine
    from tests.helpers import tiny_role

    tp = spec["tp"]
    start_rank(rank, world, port, tp)
    with open(os.path.join(workdir, "vl_model.json")) as f:
        model = ModelConfig(**json.load(f))
    full = torch.load(os.path.join(workdir, "vl_full.pt"), weights_only=True)
    batch = torch.load(os.path.join(workdir, "vl_batch.pt"), weights_only=True)
    engine = MegatronEngine(tiny_role(tp=tp, num_devices=world, model=model), total_steps=2)
    engine.load_weights(shard_state_dict(full, tp, ps.get_tensor_model_parallel_rank(), [model.num_layers], 0))
    out = engine.forward(batch, micro_batch_size=1)
    normaliser = float((batch["attention_mask"][:, 1:] * batch["attention_mask"][:, :-1]).sum())
    step = engine.train_step(batch, global_sft_loss(normaliser), micro_batch_size=1)
    tower = {k: v.clone() for k, v in engine.named_weights() if k.startswith("visual.")}
    gathered = [None] * world
    torch_dist.all_gather_object(gathered, tower)
    if rank == 0:
        result = dict(log_probs=out["log_probs"], loss=step.loss, grad_norm=step.grad_norm, towers=gathered)
        torch.save(result, os.path.join(workdir, f"vision_{spec['name']}.pt"))


def run_sp_splice(rank, world, spec, workdir, port):
    """Sequence parallelism with images at TP ``world`` (megatron's torch norms refuse SP, so the splice is checked
    alone): each rank's decoder input and DeepStack addition are its share of the whole-sequence splice, and the
    image features get their whole gradient back."""
    import types

    from megatron.core.models.common.embeddings.language_model_embedding import LanguageModelEmbedding
    from megatron.core.transformer import TransformerConfig

    from mindspeed_rl.families.vision.vl_model import deepstack_added, embed_with_images

    start_rank(rank, world, port, tp=world)
    config = TransformerConfig(
        num_layers=1,
        hidden_size=8,
        num_attention_heads=2,
        tensor_model_parallel_size=world,
        sequence_parallel=True,
        hidden_dropout=0.0,
    )
    torch.manual_seed(0)
    embedding = LanguageModelEmbedding(config, vocab_size=32, max_sequence_length=16, position_embedding_type="rope")
    table = [torch.zeros_like(embedding.word_embeddings.weight) for _ in range(world)]
    torch_dist.all_gather(table, embedding.word_embeddings.weight.detach())
    ids = torch.tensor([[1, 5, 5, 5, 2, 3, 4, 6], [7, 8, 5, 5, 9, 1, 2, 3]])
    where = ids == 5
    features = torch.arange(5 * 8, dtype=torch.float).view(5, 8).requires_grad_(True)
    layer = torch.nn.Module()
    layer.forward = lambda hidden: (hidden, None)
    gpt = types.SimpleNamespace(embedding=embedding, config=config, decoder=types.SimpleNamespace(layers=[layer]))
    local = embed_with_images(gpt, ids, where, features)
    with deepstack_added(gpt, where, [features * 2]):
        added, _ = layer(torch.zeros_like(local))
    full = torch.nn.functional.embedding(ids, torch.cat(table)).masked_scatter(where.unsqueeze(-1), features)
    extra = torch.zeros(2, 8, 8).masked_scatter(where.unsqueeze(-1), features.detach() * 2)
    share = slice(rank * 8 // world, (rank + 1) * 8 // world)
    (local.sum() + added.sum()).backward()
    result = dict(
        decoder_input=(local - full.transpose(0, 1)[share]).abs().max().item(),
        deepstack=(added - extra.transpose(0, 1)[share]).abs().max().item(),
        grad=features.grad.clone(),
        shape=tuple(local.shape),
    )
    gathered = [None] * world
    torch_dist.all_gather_object(gathered, result)
    if rank == 0:
        torch.save(gathered, os.path.join(workdir, "sp_splice.pt"))


def run_converted(rank, world, spec, workdir, port):
    """Load a converted Megatron checkpoint at TP x PP and save its logits (LM) or values (ORM)."""
    from mindspeed_rl.checkpoint.engine_io import load_weights_only
    from mindspeed_rl.checkpoint.megatron_reader import read_mg_config
    from mindspeed_rl.config_cls import ModelConfig
    from mindspeed_rl.models.engine import MegatronEngine
    from tests.helpers import tiny_role

    tp, pp = spec["tp"], spec["pp"]
    start_rank(rank, world, port, tp, pp)
    batch = torch.load(os.path.join(workdir, "batch.pt"))
    out = {}
    for kind in ("lm", "value"):
        mg_dir = os.path.join(workdir, f"mg_{kind}_{spec['name']}")
        config = read_mg_config(mg_dir)[0]
        role = tiny_role(
            tp=tp,
            pp=pp,
            num_devices=world,
            model=ModelConfig(**config["model"]),
            num_layer_list=config["num_layer_list"] if pp > 1 else None,
        )
        engine = MegatronEngine(role, head=kind, trainable=False)
        load_weights_only(engine, mg_dir)
        out[kind] = engine.forward(batch, micro_batch_size=2, with_logits=kind == "lm")
    if rank == 0:
        torch.save(out, os.path.join(workdir, f"converted_{spec['name']}.pt"))


def route_replay_available() -> bool:
    """Both libraries have router replay's parts (the main stack; not the NPU sets' older releases)."""
    from mindspeed_rl.compat import vllm_routes
    from mindspeed_rl.compat.megatron_core import router_replay_unavailable

    return not vllm_routes.capture_unavailable() and not router_replay_unavailable()


def route_to_runners_up(worker):
    """Runs in a vLLM worker: every MoE router picks the experts ranked 2..k+1 instead of 1..k (gate weights: their
    softmax probabilities renormalised, as Qwen3-MoE's norm_topk_prob does), a rollout routed otherwise than any
    training forward would."""
    from vllm.model_executor.layers.fused_moe.layer import MoERunner

    for module in worker.model_runner.get_model().modules():
        if not isinstance(module, MoERunner):
            continue
        router, original = module.router, module.router._compute_routing

        def runners_up(hidden_states, router_logits, indices_type, *, original=original, **kwargs):
            weights, ids = original(hidden_states, router_logits, indices_type, **kwargs)
            probs = torch.softmax(router_logits.float(), dim=-1)
            chosen = probs.argsort(dim=-1, descending=True)[:, 1 : ids.shape[1] + 1]
            gate = probs.gather(1, chosen)
            return (gate / gate.sum(-1, keepdim=True)).to(weights.dtype), chosen.to(ids.dtype)

        router._compute_routing = runners_up


def grid_of(prompts, outputs):
    """Prompt + response rows (right-padded), their attention mask and routes on that grid."""
    rows = [list(p) + list(o.response_ids) for p, o in zip(prompts, outputs)]
    width = max(map(len, rows))
    layers, k = outputs[0].routed_experts.shape[1:]
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    routes = torch.full((len(rows), width, layers, k), -1, dtype=torch.int16)
    for i, (row, output) in enumerate(zip(rows, outputs)):
        ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
        routes[i, : output.routed_experts.shape[0]] = output.routed_experts
    return ids, mask, routes


def replay_check(engine, prompts, outputs):
    """The largest |training log-prob - rollout log-prob| of the sampled tokens with the rollout's routes replayed
    and without, and the mismatch counts."""
    from mindspeed_rl.models import router_replay

    ids, mask, routes = grid_of(prompts, outputs)
    diffs = {}
    for replay in (True, False):
        engine.replay_routes = replay
        got = engine.forward({"input_ids": ids, "attention_mask": mask, "routed_experts": routes}, len(prompts))
        worst = 0.0
        for i, (p, o) in enumerate(zip(prompts, outputs)):
            mine = got["log_probs"][i, len(p) : len(p) + len(o.response_ids)]
            worst = max(worst, (mine - torch.tensor(o.logprobs)).abs().max().item())
        diffs["replayed" if replay else "own"] = worst
    diffs["counts"] = router_replay.take_mismatch(engine.route_replays)
    return diffs


def route_counts(engine, prompts, outputs):
    """[layer, tokens routed otherwise, tokens compared] of the training forward against the rollout's routes
    (router replay's metric, nothing replayed)."""
    from mindspeed_rl.models import router_replay

    ids, mask, routes = grid_of(prompts, outputs)
    engine.replay_routes = False
    engine.forward({"input_ids": ids, "attention_mask": mask, "routed_experts": routes}, micro_batch_size=len(prompts))
    return router_replay.take_mismatch(engine.route_replays)


def _family_rollout(engine, model, spec, workdir):
    """Greedy responses of a vLLM engine updated in place from ``engine``'s weights (fp32), and for Qwen3-MoE the
    route checks."""
    from mindspeed_rl.config_cls import SamplingConfig
    from mindspeed_rl.protocol import RolloutRequest
    from mindspeed_rl.rollout.engines.factory import make_rollout_engine
    from mindspeed_rl.rollout.weights.resharding import iter_full_weights

    out = {}
    infer = spec.get("infer", {})  # the rollout's own TP x DP x EP (expert parallelism)
    gen = small_rollout_config(
        infer_tensor_parallel_size=infer.get("tp", 1),
        infer_data_parallel_size=infer.get("dp", 1),
        infer_expert_parallel_size=infer.get("ep", 1),
    )
    moe = spec["family"] == "qwen3_moe" and route_replay_available()
    rollout = make_rollout_engine(model, gen, "cpu", eos_token_id=0, capture_routes=moe)
    out["update_bytes"] = rollout.update_weights(iter_full_weights(engine))["bytes"]
    prompts = torch.load(os.path.join(workdir, "prompts.pt"))
    outputs = rollout.generate(RolloutRequest.of(prompts, SamplingConfig(temperature=0, max_tokens=12)))
    out["greedy"] = [o.response_ids for o in outputs]
    if moe:  # the engine's routes against the training forward's own router on the same tokens and weights
        out["route_counts"] = route_counts(engine, prompts, outputs)
        # the rollout forced onto other experts: replayed, training matches it; not replayed, it does not
        rollout.llm.collective_rpc(route_to_runners_up)
        forced = rollout.generate(RolloutRequest.of(prompts, SamplingConfig(temperature=1.0, max_tokens=12), seed=5))
        out["forced"] = replay_check(engine, prompts, forced)
    rollout.shutdown()
    return out


def run_family(rank, world, spec, workdir, port):
    """One model family at TP x PP x EP from its converted checkpoint: logits, greedy rollout through an
    in-place updated vLLM engine, and (with ``spec["train"]``) one SFT step's loss, grad norm and weights."""
    from mindspeed_rl.checkpoint.engine_io import load_weights_only
    from mindspeed_rl.checkpoint.megatron_reader import read_mg_config
    from mindspeed_rl.config_cls import ModelConfig
    from mindspeed_rl.models.engine import MegatronEngine
    from mindspeed_rl.rollout.weights.resharding import iter_full_weights
    from tests.helpers import tiny_role

    tp, pp, ep = spec["tp"], spec["pp"], spec.get("ep", 1)
    start_rank(rank, world, port, tp, pp, ep)
    mg_dir = os.path.join(workdir, f"mg_{spec['name']}")
    config = read_mg_config(mg_dir)[0]
    model = ModelConfig(**config["model"])

    def role(**extra):
        return tiny_role(
            tp=tp,
            pp=pp,
            num_devices=world,
            model=model,
            expert_model_parallel_size=ep,
            num_layer_list=config["num_layer_list"] if pp > 1 else None,
            **extra,
        )

    batch = torch.load(os.path.join(workdir, "batch.pt"))
    engine = MegatronEngine(role(), trainable=False)
    load_weights_only(engine, mg_dir)
    out = {"logits": engine.forward(batch, micro_batch_size=2, with_logits=True)["logits"]}
    if spec.get("rollout", True):
        out.update(_family_rollout(engine, model, spec, workdir))
    if spec.get("train"):
        from megatron.core import parallel_state as ps

        trained = MegatronEngine(role(lr=1e-4, clip_grad=0.0), total_steps=2)
        load_weights_only(trained, mg_dir)
        dp, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
        rows = batch["input_ids"].shape[0] // dp
        local = {k: v[dp_rank * rows : (dp_rank + 1) * rows] for k, v in batch.items()}
        normaliser = float((batch["attention_mask"][:, 1:] * batch["attention_mask"][:, :-1]).sum())
        step = trained.train_step(local, global_sft_loss(normaliser), micro_batch_size=2)
        out.update(
            loss=step.loss,
            grad_norm=step.grad_norm,
            weights={k: v.clone() for piece in iter_full_weights(trained) for k, v in piece.items()},
        )
        from mindspeed_rl.checkpoint.engine_io import load_engine, save_engine

        ckpt = os.path.join(workdir, f"trained_{spec['name']}")  # a training checkpoint at this layout
        save_engine(trained, ckpt, 1)
        reloaded = MegatronEngine(role(lr=1e-4, clip_grad=0.0), total_steps=2)
        load_engine(reloaded, ckpt)
        mine = dict(reloaded.named_weights())
        same = all(torch.equal(mine[k], v) for k, v in trained.named_weights())
        flags = [None] * world
        torch_dist.all_gather_object(flags, same)
        out.update(reload_equal=all(flags), ckpt_files=sorted(os.listdir(os.path.join(ckpt, "iter_0000001"))))
    if rank == 0:
        torch.save(out, os.path.join(workdir, f"family_{spec['name']}.pt"))


def run_rollout(rank, world, spec, workdir, port):
    """Actor at TP x PP; each rank runs its own in-process rollout engine (infer TP 1) on its prompts.

    Saves (prompts, outputs of every rank, the actor's log-probs of those tokens) on rank 0.
    """
    from mindspeed_rl.config_cls import SamplingConfig
    from mindspeed_rl.datasets.padding import left_pad
    from mindspeed_rl.models.engine import MegatronEngine
    from mindspeed_rl.protocol import RolloutRequest
    from mindspeed_rl.rollout.engines.factory import make_rollout_engine
    from mindspeed_rl.rollout.weights.resharding import iter_full_weights
    from tests.helpers import tiny_model_config, tiny_role

    tp, pp = spec["tp"], spec["pp"]
    start_rank(rank, world, port, tp, pp)
    model = tiny_model_config(num_layers=4, hidden_size=128, ffn_hidden_size=256, padded_vocab_size=512)
    actor = MegatronEngine(tiny_role(tp=tp, pp=pp, num_devices=world, model=model), trainable=False)
    full = torch.load(os.path.join(workdir, "actor_full.pt"), weights_only=True)
    from megatron.core import parallel_state as ps

    from mindspeed_rl.checkpoint.sharding import shard_state_dict

    actor.load_weights(
        shard_state_dict(
            full, tp, ps.get_tensor_model_parallel_rank(), [4 // pp] * pp, ps.get_pipeline_model_parallel_rank()
        )
    )
    gen = small_rollout_config(backend=spec["backend"])
    engine = make_rollout_engine(model, gen, "cpu", eos_token_id=0)
    stats = engine.update_weights(iter_full_weights(actor))
    prompts = [[5 + rank, 6, 7, 8], [9, 10 + rank, 11]]
    outs = engine.generate(
        RolloutRequest.of(prompts, SamplingConfig(temperature=spec.get("temperature", 1.0), max_tokens=10, seed=3), n=2)
    )
    mine = [(prompts[o.prompt_index], o.response_ids, o.logprobs) for o in outs]
    everyone = [None] * world
    torch.distributed.all_gather_object(everyone, mine)
    rows = [r for part in everyone for r in part]
    ids, mask = left_pad([p + r for p, r, _ in rows], 0)
    logp = actor.forward(
        {"input_ids": ids, "attention_mask": mask}, micro_batch_size=4, temperature=spec.get("temperature", 1.0)
    )["log_probs"]
    if rank == 0:
        torch.save(
            {"rows": rows, "actor_logp": logp, "ids": ids, "stats": stats},
            os.path.join(workdir, f"rollout_{spec['name']}.pt"),
        )
    engine.shutdown()


def fresh_hf_llm(workdir, dtype: str = "float32", kv_mib: int = 32, folder: str = "hf", **extra):
    """A vLLM engine loaded the ordinary way from ``workdir``/``folder`` (the reference of the in-place updates)."""
    from vllm import LLM

    return LLM(
        model=os.path.join(workdir, folder),
        skip_tokenizer_init=True,
        enforce_eager=True,
        dtype=dtype,
        max_model_len=128,
        kv_cache_memory_bytes=kv_mib * 2**20,
        seed=1,
        **extra,
    )


def run_fresh_engine(rank, world, spec, workdir, port):
    """A vLLM engine loaded the ordinary way from a HF folder; greedy outputs saved."""
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import SamplingParams

    prompts = torch.load(os.path.join(workdir, "prompts.pt"))
    llm = fresh_hf_llm(workdir, kv_mib=64)
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        SamplingParams(temperature=0, max_tokens=10, detokenize=False),
        use_tqdm=False,
    )
    torch.save([list(o.outputs[0].token_ids) for o in outs], os.path.join(workdir, "fresh.pt"))
    llm.llm_engine.engine_core.shutdown()


def run_updated_engine(rank, world, spec, workdir, port):
    """A dummy-weight vLLM engine updated in place from a megatron actor; greedy and seeded outputs."""
    from mindspeed_rl.compat.vllm import WEIGHT_LOAD_ENV
    from mindspeed_rl.config_cls import SamplingConfig
    from mindspeed_rl.models.engine import MegatronEngine
    from mindspeed_rl.protocol import RolloutRequest
    from mindspeed_rl.rollout.engines.factory import make_rollout_engine
    from mindspeed_rl.rollout.weights.resharding import iter_full_weights
    from tests.helpers import tiny_model_config, tiny_role

    start_rank(rank, world, port)
    model = tiny_model_config(num_layers=4, hidden_size=128, ffn_hidden_size=256, padded_vocab_size=512)
    actor = MegatronEngine(tiny_role(model=model), trainable=False)
    actor.load_weights(torch.load(os.path.join(workdir, "actor_full.pt"), weights_only=True))
    gen = small_rollout_config()
    os.environ[WEIGHT_LOAD_ENV] = spec.get("weight_load", "auto")
    engine = make_rollout_engine(model, gen, "cpu", eos_token_id=0)
    # a first update with other weights, then the actor's: the second must replace the first everywhere
    engine.update_weights([{k: v * 0.5 for k, v in piece.items()} for piece in iter_full_weights(actor)])
    engine.update_weights(iter_full_weights(actor))
    prompts = torch.load(os.path.join(workdir, "prompts.pt"))
    greedy = [
        o.response_ids
        for o in engine.generate(RolloutRequest.of(prompts, SamplingConfig(temperature=0, max_tokens=10)))
    ]
    sampling = SamplingConfig(temperature=1.0, max_tokens=10, seed=11)
    runs = [[o.response_ids for o in engine.generate(RolloutRequest.of(prompts, sampling, n=3))] for _ in range(2)]
    other_seed = [
        o.response_ids
        for o in engine.generate(
            RolloutRequest.of(prompts, SamplingConfig(temperature=1.0, max_tokens=10, seed=12), n=3)
        )
    ]
    torch.save(
        {"greedy": greedy, "runs": runs, "other_seed": other_seed, "method": engine.weight_load_method},
        os.path.join(workdir, spec.get("out", "updated.pt")),
    )
    engine.shutdown()


def teacher_forced_logprobs(llm, sequences):
    """vLLM's log-prob of every token after the first of each sequence (prompt log-probs of the whole sequence)."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": s} for s in sequences], params, use_tqdm=False)
    return [[entry[tok].logprob for entry, tok in zip(o.prompt_logprobs[1:], s[1:])] for o, s in zip(outs, sequences)]


def write_int8_folder(workdir) -> str:
    """``workdir``/hf as a W8A8 INT8 compressed-tensors checkpoint (``hf_int8``), quantized from its bf16 weights."""
    import json

    from safetensors.torch import load_file, save_file

    from mindspeed_rl.rollout.weights.quantize import int8_named, int8_quantization_config

    source, target = os.path.join(workdir, "hf"), os.path.join(workdir, "hf_int8")
    os.makedirs(target, exist_ok=True)
    with open(os.path.join(source, "config.json")) as fh:
        config = {**json.load(fh), "quantization_config": int8_quantization_config(), "torch_dtype": "bfloat16"}
    with open(os.path.join(target, "config.json"), "w") as fh:
        json.dump(config, fh)
    weights = {k: v.to(torch.bfloat16) for k, v in load_file(os.path.join(source, "model.safetensors")).items()}
    save_file({k: v.contiguous() for k, v in int8_named(weights.items())}, os.path.join(target, "model.safetensors"))
    return "hf_int8"


def run_quantized_engine(rank, world, spec, workdir, port):
    """rollout_quantization ``spec["precision"]``: a dummy-weight engine updated in place from the actor (twice), a
    bf16 engine of the same weights, and a fresh quantized engine loaded from the HF folder (FP8: vLLM's own
    load-time quantization; INT8: a compressed-tensors checkpoint of the same weights): the log-probs of the
    quantized engine's samples under each, saved."""
    from mindspeed_rl.compat.vllm import WEIGHT_LOAD_ENV, cpu_int8_kernel_unavailable, online_quantization_unavailable
    from mindspeed_rl.config_cls import SamplingConfig
    from mindspeed_rl.models.engine import MegatronEngine
    from mindspeed_rl.protocol import RolloutRequest
    from mindspeed_rl.rollout.engines.factory import make_rollout_engine
    from mindspeed_rl.rollout.weights.resharding import iter_full_weights
    from tests.helpers import tiny_model_config, tiny_role

    precision = spec["precision"]
    out = os.path.join(workdir, f"quantized_{precision}.pt")
    missing = (
        online_quantization_unavailable("fp8_per_channel") if precision == "fp8" else cpu_int8_kernel_unavailable()
    )
    if missing:  # vLLM 0.18 / 0.23 (the NPU sets' releases); INT8: a CPU build without oneDNN's scaled mm
        torch.save({"unavailable": missing}, out)
        return
    start_rank(rank, world, port)
    os.environ[WEIGHT_LOAD_ENV] = "auto"  # run_updated_engine, before it in this process, may have forced a path
    model = tiny_model_config(num_layers=4, hidden_size=128, ffn_hidden_size=256, padded_vocab_size=512)
    actor = MegatronEngine(tiny_role(model=model), trainable=False)
    actor.load_weights(torch.load(os.path.join(workdir, "actor_full.pt"), weights_only=True))
    prompts = torch.load(os.path.join(workdir, "prompts.pt"))
    logprobs, method = {}, None
    for name in (precision, "bf16"):
        gen = small_rollout_config(dtype="bfloat16", rollout_quantization=precision if name == precision else "none")
        try:
            engine = make_rollout_engine(model, gen, "cpu", eos_token_id=0)
        except RuntimeError as exc:
            if "weight updates would go through load_weights" not in str(exc):
                raise
            torch.save({"unavailable": str(exc)}, out)  # a release whose worker has no layer-wise reload
            return
        engine.update_weights([{k: v * 0.5 for k, v in piece.items()} for piece in iter_full_weights(actor)])
        engine.update_weights(iter_full_weights(actor))
        if name == precision:  # the sequences every forward scores: the quantized engine's own samples
            sampled = engine.generate(RolloutRequest.of(prompts, SamplingConfig(temperature=1.0, max_tokens=12)))
            sequences = [prompts[o.prompt_index] + o.response_ids for o in sampled]
            logprobs["sampled"] = [o.logprobs for o in sampled]
            method = engine.weight_load_method
        logprobs[name] = teacher_forced_logprobs(engine.llm, sequences)
        engine.shutdown()
    if precision == "fp8":
        fresh = fresh_hf_llm(workdir, dtype="bfloat16", quantization="fp8_per_channel")
    else:
        fresh = fresh_hf_llm(workdir, dtype="bfloat16", folder=write_int8_folder(workdir))
    logprobs["fresh"] = teacher_forced_logprobs(fresh, sequences)
    fresh.llm_engine.engine_core.shutdown()
    torch.save({"logprobs": logprobs, "sequences": sequences, "method": method}, out)


def run_reward_worker(rank, world, spec, workdir, port):
    """The ORM worker (outside Ray) scores sequences from a converted --orm checkpoint."""
    os.environ["OMP_NUM_THREADS"] = "1"
    from mindspeed_rl.checkpoint.megatron_reader import read_mg_config
    from mindspeed_rl.config_cls import ModelConfig, RLConfig
    from mindspeed_rl.workers.reward_worker import RewardWorker
    from tests.helpers import tiny_role

    config = read_mg_config(os.path.join(workdir, "rm_mg"))[0]
    role = tiny_role("reward", model=ModelConfig(**config["model"]))
    from mindspeed_rl.protocol import WorldSpec

    where = WorldSpec(rank, world, "127.0.0.1", port, threads=1)
    worker = RewardWorker(where, role, RLConfig(ref_forward_micro_batch_size=2))
    worker.init_weights(os.path.join(workdir, "rm_mg"))
    batch = torch.load(os.path.join(workdir, "batch.pt"))
    from mindspeed_rl.protocol import Experience

    rows = Experience(
        prompt_width=3,
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        response_mask=batch["attention_mask"][:, 3:],
    )
    out = worker.compute_scores(rows)
    torch.save(out.per_row, os.path.join(workdir, "rm_scores.pt"))
    worker.shutdown()


RESHARD_CASES = [
    dict(name="tp2_to_itp1", tp=2, pp=1, itp=1),
    dict(name="tp2_to_itp2", tp=2, pp=1, itp=2),
    dict(name="tp1_to_itp2", tp=1, pp=1, itp=2),
    dict(name="tp2pp2_to_itp2", tp=2, pp=2, itp=2),
]


def run_reshard_relations(rank, world, spec, workdir, port):
    """For each (train TP x PP, infer TP) case in one world: the actor's shards streamed into dummy-weight
    engines (one per infer-TP block of ranks), greedy ids; then a fresh engine of the same infer TP
    loaded from the HF folder, greedy ids. Saves {case: (updated, fresh)} per rank."""
    from megatron.core import parallel_state as ps
    from vllm import SamplingParams

    from mindspeed_rl.accelerator import get_accelerator
    from mindspeed_rl.checkpoint.sharding import shard_state_dict
    from mindspeed_rl.config_cls import SamplingConfig
    from mindspeed_rl.models.engine import MegatronEngine
    from mindspeed_rl.protocol import RolloutRequest
    from mindspeed_rl.rollout.engines.factory import make_rollout_engine
    from mindspeed_rl.rollout.engines.vllm_engine import stop_llm
    from mindspeed_rl.rollout.weights.resharding import iter_full_weights
    from tests.helpers import tiny_model_config, tiny_role

    dist = start_rank(rank, world, port)
    model = tiny_model_config(num_layers=4, hidden_size=128, ffn_hidden_size=256, padded_vocab_size=512)
    full = torch.load(os.path.join(workdir, "actor_full.pt"), weights_only=True)
    prompts = torch.load(os.path.join(workdir, "prompts.pt"))
    results, fresh = {}, {}
    for case in RESHARD_CASES:
        tp, pp, itp = case["tp"], case["pp"], case["itp"]
        destroy_model_parallel()
        dist.init_model_parallel(tp, pp, seed=5)
        actor = MegatronEngine(tiny_role(tp=tp, pp=pp, num_devices=world, model=model), trainable=False)
        actor.load_weights(
            shard_state_dict(
                full, tp, ps.get_tensor_model_parallel_rank(), [4 // pp] * pp, ps.get_pipeline_model_parallel_rank()
            )
        )
        gen = small_rollout_config(infer_tensor_parallel_size=itp)
        engine = make_rollout_engine(model, gen, "cpu", eos_token_id=0)
        engine.update_weights(iter_full_weights(actor))
        updated = [
            o.response_ids
            for o in engine.generate(RolloutRequest.of(prompts, SamplingConfig(temperature=0, max_tokens=10)))
        ]
        engine.shutdown()
        if itp not in fresh:  # one fresh engine per infer TP serves every case with that TP
            get_accelerator().prepare_vllm()
            llm = fresh_hf_llm(workdir, tensor_parallel_size=itp, distributed_executor_backend="external_launcher")
            outs = llm.generate(
                [{"prompt_token_ids": p} for p in prompts],
                SamplingParams(temperature=0, max_tokens=10, detokenize=False),
                use_tqdm=False,
            )
            stop_llm(llm)
            fresh[itp] = [list(o.outputs[0].token_ids) for o in outs]
        results[case["name"]] = (updated, fresh[itp])
    torch.save(results, os.path.join(workdir, f"reshard_rank{rank}.pt"))


def _gathered_by_layout(engine, local, tp, pp, counts, join):
    """Rank 0: ``local`` (a per-rank dict) of every rank, joined over data-parallel ranks by ``join`` and
    merged over TP x PP into full tensors with global names."""
    from megatron.core import parallel_state as ps

    from mindspeed_rl.checkpoint.sharding import merge_state_dicts

    gathered = [None] * torch_dist.get_world_size()
    torch_dist.all_gather_object(
        gathered, (ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank(), local)
    )
    shards = [[join([g[2] for g in gathered if g[:2] == (p, t)]) for t in range(tp)] for p in range(pp)]
    return merge_state_dicts(shards, counts)


def full_weights(engine, tp, pp, counts):
    local = {k: v.detach().float().clone() for k, v in engine.named_weights()}
    return _gathered_by_layout(engine, local, tp, pp, counts, lambda replicas: replicas[0])


def full_optimizer_state(engine, tp, pp, counts):
    """{kind/name: full tensor} for the fp32 main weights and Adam's moments, whatever the layout."""
    from mindspeed_rl.checkpoint.optimizer_state import MOMENTS, assemble, engine_slots

    pieces = {}
    for sub, megatron_sub in zip(engine_slots(engine), engine.optimizer.chained_optimizers):
        for slot in sub:
            state = megatron_sub.optimizer.state[slot.main]
            piece = {
                "shape": slot.shape,
                "start": slot.start,
                "end": slot.end,
                "step": float(state["step"]),
                "param": slot.main.detach().float().reshape(-1).clone(),
            }
            piece.update({k: state[k].detach().float().reshape(-1).clone() for k in MOMENTS})
            pieces.setdefault(slot.name, []).append(piece)

    kinds = ("param",) + MOMENTS
    assembled = {
        kind: (lambda replicas, kind=kind: {n: e[kind] for n, e in assemble(replicas).items()}) for kind in kinds
    }
    return {
        f"{kind}/{name}": tensor
        for kind in kinds
        for name, tensor in _gathered_by_layout(engine, pieces, tp, pp, counts, assembled[kind]).items()
    }


def run_resharded_resume(rank, world, spec, workdir, port):
    """Per case: train 3 steps at the source layout (saving after 2), reshard that checkpoint with the
    converter, load it at the target layout and take the third step again; also once without the
    optimizer state (the control). Saves per case the optimizer state saved and loaded, and the weights
    after the straight, resumed and fresh-optimizer third steps."""
    from megatron.core import parallel_state as ps

    from mindspeed_rl.checkpoint.engine_io import load_engine, save_engine
    from mindspeed_rl.checkpoint.reshard import mg_to_mg
    from mindspeed_rl.checkpoint.sharding import shard_state_dict
    from mindspeed_rl.models.engine import MegatronEngine
    from tests.helpers import make_batch, tiny_model_config, tiny_role

    dist = start_rank(rank, world, port)
    model = tiny_model_config(num_layers=4)
    full = torch.load(os.path.join(workdir, "full_lm.pt"), weights_only=True)
    batches = [make_batch(8, 20, vocab=model.padded_vocab_size, seed=s) for s in (1, 2, 3)]
    results = {}
    for case in spec["cases"]:
        outcome = {}
        for run_name, side in (("straight", "source"), ("resumed", "target"), ("fresh", "target")):
            layout = case[side]
            tp, pp = layout["tp"], layout["pp"]
            counts = [model.num_layers // pp] * pp
            destroy_model_parallel()
            dist.init_model_parallel(tp, pp, seed=5)
            dp_rank, dp = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
            role = tiny_role(
                tp=tp,
                pp=pp,
                num_devices=world,
                model=model,
                lr=1e-2,
                bf16=case["bf16"],
                use_distributed_optimizer=layout.get("dist_opt", False),
            )
            engine = MegatronEngine(role, total_steps=6)
            src, dst = os.path.join(workdir, case["name"], "src"), os.path.join(workdir, case["name"], "dst")

            def step(batch):
                rows = batch["input_ids"].shape[0] // dp
                local = {k: v[dp_rank * rows : (dp_rank + 1) * rows] for k, v in batch.items()}
                mask = batch["attention_mask"]
                engine.train_step(local, global_sft_loss(float((mask[:, 1:] * mask[:, :-1]).sum())), 2)

            if run_name == "straight":
                engine.load_weights(
                    shard_state_dict(
                        full, tp, ps.get_tensor_model_parallel_rank(), counts, ps.get_pipeline_model_parallel_rank()
                    )
                )
                step(batches[0])
                step(batches[1])
                save_engine(engine, src, 2, {"trainer_state": {"consumed_samples": 16}})
                outcome["saved"] = full_optimizer_state(engine, tp, pp, counts)
                if rank == 0:
                    target = case["target"]
                    mg_to_mg(src, dst, target["tp"], target["pp"])
                torch_dist.barrier()
            else:
                payload = load_engine(engine, dst, load_optim=run_name == "resumed", load_rng=False)
                assert payload["iteration"] == 2 and payload["trainer_state"] == {"consumed_samples": 16}
                if run_name == "resumed":
                    outcome["loaded"] = full_optimizer_state(engine, tp, pp, counts)
            step(batches[2])
            outcome[run_name] = full_weights(engine, tp, pp, counts)
        results[case["name"]] = outcome
    if rank == 0:
        torch.save(results, os.path.join(workdir, "resharded_resume.pt"))


def run_lora(rank, world, spec, workdir, port):
    """A LoRA engine at spec's TP x PP x EP, loaded from the converter's reshard of one LoRA checkpoint: its
    log-probs, one SFT step (each data-parallel rank its rows), and the checkpoint of that step (adapters
    only, completed from the loaded one by whoever reads it)."""
    tp, pp, ep = spec["tp"], spec["pp"], spec["ep"]
    start_rank(rank, world, port, tp, pp, ep, cp=spec.get("cp", 1))
    log_probs = lora_step(spec, workdir, world)
    if rank == 0:
        torch.save({"log_probs": log_probs}, os.path.join(workdir, spec["save"] + ".pt"))


def lora_step(spec, workdir, world=1):
    """The body of ``run_lora`` in an initialised world (also the one-rank reference, in the test's process):
    returns the log-probs before the step."""
    from megatron.core import parallel_state as ps

    from mindspeed_rl.checkpoint.engine_io import load_weights_only, save_engine
    from mindspeed_rl.config_cls import ModelConfig
    from mindspeed_rl.models.engine import MegatronEngine
    from tests.helpers import make_batch, tiny_role

    tp, pp, ep = spec["tp"], spec["pp"], spec["ep"]
    model = ModelConfig(**spec["model"])
    role = tiny_role(
        tp=tp,
        pp=pp,
        num_devices=world,
        model=model,
        expert_model_parallel_size=ep,
        context_parallel_size=spec.get("cp", 1),
        **spec["megatron"],
    )
    engine = MegatronEngine(role, total_steps=4)
    load_weights_only(engine, os.path.join(workdir, spec["load"]))
    batch = make_batch(8, 20, vocab=model.padded_vocab_size, seed=1)
    mask = batch["attention_mask"]
    log_probs = engine.forward(batch, 2)["log_probs"]
    dp, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
    rows = batch["input_ids"].shape[0] // dp
    local = {k: v[dp_rank * rows : (dp_rank + 1) * rows] for k, v in batch.items()}
    engine.train_step(local, global_sft_loss(float((mask[:, 1:] * mask[:, :-1]).sum())), 2)
    save_engine(engine, os.path.join(workdir, spec["save"]), 1)
    return log_probs


def run_lora_layers(rank, world, spec, workdir, port):
    """A column- then a row-parallel layer with LoRA at TP = world, per case: plain TP, sequence parallel
    (the input split over the sequence, the output reduce-scattered), and expert layers (TP communication
    left to the token dispatcher, emulated here: full tokens in, partial outputs summed). Saves per case the
    output and the adapters' gradients (after megatron's TP sum of ``sequence_parallel`` parameters),
    merged to full tensors, beside the plain-torch formula's."""
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region
    from megatron.core.transformer import TransformerConfig

    from mindspeed_rl.models.lora import LoRAState, adapt_layer

    start_rank(rank, world, port, tp=world)
    gen = torch.Generator().manual_seed(3)
    s, b, h, f, r = 8, 2, 16, 24, 4
    full = {
        "w1": torch.randn(f, h, generator=gen), "a1": torch.randn(r, h, generator=gen),
        "b1": torch.randn(f, r, generator=gen), "w2": torch.randn(h, f, generator=gen),
        "a2": torch.randn(r, f, generator=gen), "b2": torch.randn(h, r, generator=gen),
    }  # fmt: skip
    x, g = torch.randn(s, b, h, generator=gen), torch.randn(s, b, h, generator=gen)
    scaling = 0.5
    ref = {k: v.clone().requires_grad_(k[0] in "ab") for k, v in full.items()}
    y1 = x @ ref["w1"].T + scaling * (x @ ref["a1"].T) @ ref["b1"].T
    y2 = y1 @ ref["w2"].T + scaling * (y1 @ ref["a2"].T) @ ref["b2"].T
    (y2 * g).sum().backward()
    results = {"reference": {"out": y2.detach(), **{k: ref[k].grad for k in ("a1", "b1", "a2", "b2")}}}
    for case in ("tp", "sequence_parallel", "expert"):
        sp, expert = case == "sequence_parallel", case == "expert"
        config = TransformerConfig(num_layers=1, hidden_size=h, num_attention_heads=2, use_cpu_initialization=True,
                                   params_dtype=torch.float32, tensor_model_parallel_size=world,
                                   sequence_parallel=sp)  # fmt: skip
        init = torch.nn.init.zeros_
        column = ColumnParallelLinear(h, f, config=config, init_method=init, bias=False, gather_output=False,
                                      is_expert=expert)  # fmt: skip
        row = RowParallelLinear(f, h, config=config, init_method=init, bias=False, input_is_parallel=True,
                                skip_bias_add=True, is_expert=expert)  # fmt: skip
        state = LoRAState(r, scaling * r, 0.0)
        for layer, name in ((column, "column"), (row, "row")):
            layer.weight.requires_grad_(False)
            adapt_layer(layer, f"{case}.{name}", name, state, seed=1)
        with torch.no_grad():
            column.weight.copy_(full["w1"].chunk(world, 0)[rank])
            column.lora_A.copy_(full["a1"])
            column.lora_B.copy_(full["b1"].chunk(world, 0)[rank])
            row.weight.copy_(full["w2"].chunk(world, 1)[rank])
            row.lora_A.copy_(full["a2"].chunk(world, 1)[rank])
            row.lora_B.copy_(full["b2"])
        out = row(column(x.chunk(world, 0)[rank] if sp else x)[0])[0]
        if expert:  # the dispatcher sums the experts' partial outputs over TP
            out = reduce_from_tensor_model_parallel_region(out)
        (out * (g.chunk(world, 0)[rank] if sp else g)).sum().backward()
        for p in (column.lora_A, column.lora_B, row.lora_A, row.lora_B):
            if getattr(p, "sequence_parallel", False):  # what megatron's finalize_model_grads does under SP
                torch_dist.all_reduce(p.grad)
        gathered = [None] * world
        local = {"out": out.detach(), "a1": column.lora_A.grad, "b1": column.lora_B.grad,
                 "a2": row.lora_A.grad, "b2": row.lora_B.grad}  # fmt: skip
        torch_dist.all_gather_object(gathered, local)
        merged = {
            "out": torch.cat([p["out"] for p in gathered]) if sp else gathered[0]["out"],
            "a1": gathered[0]["a1"],
            "b1": torch.cat([p["b1"] for p in gathered]),
            "a2": torch.cat([p["a2"] for p in gathered], dim=1),
            "b2": gathered[0]["b2"],
        }
        merged["replicas_agree"] = all(torch.equal(p[k], gathered[0][k]) for p in gathered for k in ("a1", "b2")) and (
            sp or all(torch.equal(p["out"], gathered[0]["out"]) for p in gathered)
        )
        results[case] = merged
    if rank == 0:
        torch.save(results, os.path.join(workdir, "lora_layers.pt"))


def run_expert_parallel_engine(rank, world, spec, workdir, port):
    """A vLLM engine of ``world`` in-process ranks, TP ``spec["tp"]`` x DP ``spec.get("dp", 1)`` (with ``spec["ep"]``
    its experts split over them: vLLM's EP = TP x DP) on the HF folder; with DP, DP rank 0 gets every prompt and the
    others none. Rank 0 saves its greedy outputs as ``ep_<name>.pt``."""
    from mindspeed_rl.compat import vllm as compat_vllm

    start_rank(rank, world, port)
    os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", RANK=str(rank), LOCAL_RANK=str(rank))
    from vllm import SamplingParams

    from mindspeed_rl.accelerator import get_accelerator

    get_accelerator().prepare_vllm()  # the compat patches (the CPU experts' expert map among them)
    prompts = torch.load(os.path.join(workdir, "prompts.pt"))
    tp, dp = spec["tp"], spec.get("dp", 1)
    with compat_vllm.engine_rank(tp * dp, dp):
        llm = fresh_hf_llm(
            workdir,
            kv_mib=64,
            tensor_parallel_size=tp,
            enable_expert_parallel=spec.get("ep", False),
            distributed_executor_backend="external_launcher",
            **({"data_parallel_size": dp} if dp > 1 else {}),
        )
    mine = prompts if rank // tp == 0 else []
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in mine],
        SamplingParams(temperature=0, max_tokens=10, detokenize=False),
        use_tqdm=False,
    )
    if rank == 0:
        torch.save([list(o.outputs[0].token_ids) for o in outs], os.path.join(workdir, f"ep_{spec['name']}.pt"))
