"""hf <-> mcore conversion, one pipeline stage and one layer at a time.

Peak host memory stays near one stage's weights plus one layer: HF tensors are read lazily and HF output is
written in safetensors shards as they fill (``hf_io``), megatron rank files are memory-mapped and merged
piece by piece (``megatron_reader``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from typing import Dict, List, Optional, Sequence

import torch
from tqdm import tqdm

from ..config_cls.megatron_config import pipeline_layers
from ..config_cls.model_config import ModelConfig
from ..families import get_family
from ..families.base import EMBED, FINAL_NORM, HF_LAYER, OUTPUT_MG
from . import megatron_layout as ml
from .errors import ConversionError
from .hf_io import (
    FP8_DTYPES,
    HFReader,
    SafetensorsShardWriter,
    dequantize_fp8_blocks,
    read_hf_config,
    read_hf_model_config,
    special_token_ids,
    write_config_and_tokenizer,
)
from .megatron_reader import iter_mg_pieces, read_mg_config
from .shape_check import check_tensor_shapes
from .sharding import to_local
from .tp_split import ep_owner, expert_number, layer_number, renumber_expert, split_tp

log = logging.getLogger(__name__)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def target_layers(
    num_layers: int, pp: int, num_layer_list: Optional[str], per_virtual_stage: Optional[int] = None
) -> List[List[int]]:
    """Per pipeline rank, the global layers it will hold (``--num-layer-list``, or an interleaved pipeline of
    ``--num-layers-per-virtual-pipeline-stage`` layers per model chunk)."""
    if per_virtual_stage:
        if num_layer_list:
            raise ConversionError("--num-layer-list and --num-layers-per-virtual-pipeline-stage: give one")
        if pp < 2 or num_layers % (pp * per_virtual_stage):
            raise ConversionError(
                f"--num-layers-per-virtual-pipeline-stage {per_virtual_stage}: needs PP > 1 and PP x it to divide "
                f"the {num_layers} layers (PP {pp})"
            )
        return pipeline_layers(num_layers, pp, num_layers // (pp * per_virtual_stage))
    if num_layer_list:
        try:
            counts = [int(x) for x in num_layer_list.split(",")]
        except ValueError:
            raise ConversionError(
                f"--num-layer-list {num_layer_list}: expected comma-separated integers, e.g. 3,5"
            ) from None
        if len(counts) != pp or sum(counts) != num_layers or min(counts) < 1:
            raise ConversionError(
                f"--num-layer-list {num_layer_list}: needs {pp} positive counts summing to {num_layers}"
            )
        return pipeline_layers(num_layers, pp, 1, counts)
    if num_layers % pp:
        raise ConversionError(f"{num_layers} layers do not split evenly into {pp} stages; give --num-layer-list")
    return pipeline_layers(num_layers, pp)


def checkpoint_config(
    cfg: ModelConfig,
    tp: int,
    pp: int,
    layers: Sequence[Sequence[int]],
    dtype: str,
    orm: bool,
    ep: int = 1,
    lora: Optional[dict] = None,
) -> dict:
    """The config stored in every rank file; ``layers``: each pipeline rank's global layers in its own order (an
    interleaved pipeline's are recorded as they are); ``lora``: {"r", "alpha"} when the weights carry adapters."""
    interleaved = any(list(stage) != list(range(stage[0], stage[0] + len(stage))) for stage in layers if stage)
    return {
        **({"lora": lora} if lora else {}),
        "model": dataclasses.asdict(cfg),
        "tensor_model_parallel_size": tp,
        "pipeline_model_parallel_size": pp,
        "expert_model_parallel_size": ep,
        "num_layer_list": ",".join(str(len(stage)) for stage in layers),
        **({"stage_layers": [list(stage) for stage in layers]} if interleaved else {}),
        "params_dtype": dtype,
        "orm": orm,
    }


def check_parallel(cfg: ModelConfig, tp: int, ep: int = 1) -> None:
    if cfg.num_attention_heads % tp or cfg.kv_heads % tp:
        raise ConversionError(
            f"--target-tensor-parallel-size {tp} does not divide the {cfg.num_attention_heads} heads "
            f"/ {cfg.kv_heads} query groups"
        )
    if cfg.linear_attention_freq and cfg.linear_num_key_heads % tp:
        raise ConversionError(
            f"--target-tensor-parallel-size {tp} does not divide the {cfg.linear_num_key_heads} Gated DeltaNet key "
            "heads"
        )
    if (cfg.padded_vocab_size or 0) % tp:
        raise ConversionError(f"--target-tensor-parallel-size {tp} does not divide the vocab {cfg.padded_vocab_size}")
    if ep > 1 and not cfg.num_experts:
        raise ConversionError(
            f"--target-expert-parallel-size {ep}: the model is dense ({cfg.model_type_hf}); "
            "expert parallelism needs a MoE model"
        )
    if cfg.num_experts and cfg.num_experts % ep:
        raise ConversionError(f"--target-expert-parallel-size {ep} does not divide the {cfg.num_experts} experts")


class StageShards:
    """The TP x EP shards of one pipeline stage, filled tensor by tensor (the full tensor is not kept).
    An expert's tensors go to the EP rank that owns it, renumbered locally; the rest to every EP rank."""

    def __init__(self, tp: int, layers: Sequence[int], swiglu: bool, ep: int = 1, num_experts: Optional[int] = None):
        self.tp, self.swiglu, self.ep, self.num_experts = tp, swiglu, ep, num_experts
        self.index = {g: i for i, g in enumerate(layers)}  # global layer -> this stage's own number
        self.shards: List[List[Dict[str, torch.Tensor]]] = [[{} for _ in range(ep)] for _ in range(tp)]

    def add(self, name: str, tensor: torch.Tensor) -> None:
        local = to_local(name, self.index)
        expert = expert_number(name)
        if expert >= 0:
            owner, local_expert = ep_owner(expert, self.num_experts, self.ep)
            targets = [(owner, renumber_expert(local, local_expert))]
        else:
            targets = [(ep_rank, local) for ep_rank in range(self.ep)]
        for tp_rank in range(self.tp):
            shard = split_tp(name, tensor, self.tp, tp_rank, self.swiglu).clone()
            for ep_rank, stored in targets:
                self.shards[tp_rank][ep_rank][stored] = shard

    def take(self, tp_rank: int, ep_rank: int) -> Dict[str, torch.Tensor]:
        """One rank's shards (released from this object)."""
        shards, self.shards[tp_rank][ep_rank] = self.shards[tp_rank][ep_rank], {}
        return shards

    def write(self, save_dir: str, iteration, pp_rank: int, pp: int, config: dict) -> None:
        for tp_rank in range(self.tp):
            for ep_rank in range(self.ep):
                ml.write_rank(
                    save_dir,
                    iteration,
                    tp_rank,
                    pp_rank,
                    pp,
                    {"model": self.take(tp_rank, ep_rank), "iteration": 0, "config": config},
                    ep_rank,
                    self.ep,
                )


class FamilyNames:
    """A HF folder's tensors under the names the family maps use (a Qwen2.5-VL folder may nest its language model)."""

    def __init__(self, reader: HFReader, family):
        self.reader, self.family, self.folder = reader, family, reader.folder
        quantization = read_hf_config(reader.folder).get("quantization_config") or {}
        self.fp8_block = quantization.get("weight_block_size") or [128, 128]  # DeepSeek-V3's FP8 Hub weights

    def stored(self, name: str) -> str:
        return next((n for n in self.family.hf_name_aliases(name) if n in self.reader), name)

    def __contains__(self, name: str) -> bool:
        return self.stored(name) in self.reader

    def get(self, name: str) -> torch.Tensor:
        """The tensor; an FP8 weight dequantized with its ``weight_scale_inv`` blocks (fp32)."""
        stored = self.stored(name)
        tensor = self.reader.get(stored)
        if tensor.dtype not in FP8_DTYPES:
            return tensor
        if stored + "_scale_inv" not in self.reader:
            raise ConversionError(f"{self.folder}: {stored} is FP8 but {stored}_scale_inv, its scales, is missing")
        return dequantize_fp8_blocks(tensor, self.reader.get(stored + "_scale_inv"), self.fp8_block)


def hf_to_mg(
    load_dir: str,
    save_dir: str,
    tp: int = 1,
    pp: int = 1,
    num_layer_list: Optional[str] = None,
    dtype: str = "fp32",
    orm: bool = False,
    model_type_hf: Optional[str] = None,
    seed: int = 1234,
    ep: int = 1,
    per_virtual_stage: Optional[int] = None,
) -> ModelConfig:
    """Convert a HF folder into a Megatron 'release' checkpoint with TP x PP (x EP) rank files."""
    raw = HFReader(load_dir)
    cfg = read_hf_model_config(load_dir, model_type_hf)
    family = get_family(cfg.model_type_hf)
    reader = FamilyNames(raw, family)
    if cfg.add_qkv_bias and HF_LAYER.format(i=0) + "self_attn.q_proj.bias" not in reader:
        raise ConversionError(f"{load_dir}: {family.name} expects q/k/v biases, none found")
    check_tensor_shapes(family, cfg, read_hf_config(load_dir), raw, reader.stored, orm)
    check_parallel(cfg, tp, ep)
    layers = target_layers(cfg.num_layers, pp, num_layer_list, per_virtual_stage)
    torch_dtype = DTYPES[dtype]
    config = checkpoint_config(cfg, tp, pp, layers, dtype, orm, ep)
    head = _value_head(reader, cfg, orm, seed) if orm else None
    ml.begin_save(save_dir, "release")
    bar = tqdm(total=cfg.num_layers + 2, desc="hf -> mcore", unit="layer")
    for pp_rank in range(pp):
        stage = StageShards(tp, layers[pp_rank], cfg.swiglu, ep, cfg.num_experts)
        if pp_rank == 0:
            stage.add(EMBED[1], reader.get(EMBED[0]).to(torch_dtype))
            for hf_name, mg_name in family.extra_hf_to_mcore(raw.weight_map).items():  # a vision tower
                stage.add(mg_name, raw.get(hf_name).to(torch_dtype))
            bar.update(1)
        for i in layers[pp_rank]:
            hf_layer = family.read_hf_layer(i, cfg, reader)
            for name, tensor in family.layer_hf_to_mcore(i, hf_layer, cfg).items():
                # megatron keeps the router's expert bias in fp32 whatever the weights' dtype
                stage.add(name, tensor.to(torch.float32 if name.endswith(".expert_bias") else torch_dtype))
            del hf_layer
            bar.update(1)
        if pp_rank == pp - 1:
            stage.add(FINAL_NORM[1], reader.get(FINAL_NORM[0]).to(torch_dtype))
            if orm:
                stage.add(OUTPUT_MG, head.to(torch_dtype))
            elif cfg.untie_embeddings_and_output_weights:
                stage.add(OUTPUT_MG, reader.get("lm_head.weight").to(torch_dtype))
            elif pp > 1:
                stage.add(OUTPUT_MG, reader.get(EMBED[0]).to(torch_dtype))  # tied: last stage keeps a copy
            bar.update(1)
        stage.write(save_dir, "release", pp_rank, pp, config)
    bar.close()
    ml.commit_save(save_dir, "release", tp * pp * ep)
    skipped = family.untrained_hf_names(raw.weight_map, cfg)
    if skipped:
        log.warning("%s: %d tensors of %s not converted (not trained)", load_dir, len(skipped), family.untrained_what)
    return cfg


def _value_head(reader: "FamilyNames", cfg: ModelConfig, orm: bool, seed: int) -> torch.Tensor:
    if "score.weight" in reader:
        score = reader.get("score.weight")
        if score.shape[0] != 1:
            raise ConversionError(f"score.weight has {score.shape[0]} labels; an ORM / critic needs num_labels=1")
        return score
    log.warning(
        "--orm: %s has no score.weight (a causal LM): the value head is initialised "
        "N(0, 1/(hidden+1)) so a critic can start from this model",
        reader.folder,
    )
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(1, cfg.hidden_size, generator=gen) / (cfg.hidden_size + 1)


def mg_to_hf(
    load_dir: str,
    save_dir: str,
    dtype: Optional[str] = None,
    orm: Optional[bool] = None,
    max_shard_bytes: int = 2 * 1024**3,
) -> str:
    """Convert the latest Megatron checkpoint into ``<save_dir>/mg2hf`` (config from ``save_dir``)."""
    return write_hf_folder(
        load_dir, os.path.join(save_dir, "mg2hf"), read_hf_config(save_dir), save_dir, dtype, orm, max_shard_bytes
    )


def write_hf_folder(
    load_dir: str,
    out_dir: str,
    hf_config: dict,
    tokenizer_dir: Optional[str],
    dtype: Optional[str] = None,
    orm: Optional[bool] = None,
    max_shard_bytes: int = 2 * 1024**3,
    progress: bool = True,
) -> str:
    """The latest Megatron checkpoint of ``load_dir`` as a HF folder: safetensors shards, config.json from
    ``hf_config`` (a sequence classifier with ``orm``) and the tokenizer files of ``tokenizer_dir``. Written
    into a staging folder and renamed, so ``out_dir`` is complete or absent."""
    config, _, _, _ = read_mg_config(load_dir)
    cfg = ModelConfig(**config["model"])
    family = get_family(cfg.model_type_hf)
    if orm and not config.get("orm", False):
        raise ConversionError(
            f"--orm: {load_dir} holds a language model (no value head; saved without --orm); "
            "drop --orm to write a causal LM"
        )
    orm = config.get("orm", False) if orm is None else orm
    hf_config = dict(hf_config)
    staging = out_dir + ".tmp"
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    torch_dtype = DTYPES[dtype] if dtype else None
    writer = SafetensorsShardWriter(staging, max_shard_bytes)
    bar = tqdm(total=cfg.num_layers + 2, desc="mcore -> hf", unit="layer", disable=not progress)
    cast = (lambda t: t.to(torch_dtype)) if torch_dtype else (lambda t: t)
    for piece in iter_mg_pieces(load_dir):
        if EMBED[1] in piece:
            writer.add(family.saved_hf_name(EMBED[0]), cast(piece[EMBED[1]]))
        for name, tensor in piece.items():
            extra = family.extra_mcore_to_hf(name)  # a vision tower
            if extra is not None:
                writer.add(extra, cast(tensor))
        layers = {layer_number(n) for n in piece if layer_number(n) >= 0}
        for i in layers:
            for name, tensor in family.hf_tensors_to_save(family.layer_mcore_to_hf(i, piece, cfg), cfg).items():
                writer.add(family.saved_hf_name(name), cast(tensor))
        if FINAL_NORM[1] in piece:
            writer.add(family.saved_hf_name(FINAL_NORM[0]), cast(piece[FINAL_NORM[1]]))
            if OUTPUT_MG in piece and (orm or cfg.untie_embeddings_and_output_weights):
                writer.add("score.weight" if orm else "lm_head.weight", cast(piece[OUTPUT_MG]))
        bar.update(1)
    bar.close()
    writer.close()
    if orm:
        arch = hf_config.get("architectures", [family.architecture])[0].replace(
            "ForCausalLM", "ForSequenceClassification"
        )
        hf_config.update(architectures=[arch], num_labels=1)
    if torch_dtype is not None:
        hf_config["torch_dtype"] = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[dtype]
    write_config_and_tokenizer(staging, hf_config, tokenizer_dir)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(staging, out_dir)
    return out_dir


def hf_folder_of(ckpt_dir: str, iteration: int) -> str:
    """Where save_hf puts an iteration's HF weights: ``<ckpt_dir>/iter_0000020_hf``, beside ``iter_0000020``."""
    return os.path.join(ckpt_dir, ml.iteration_dir_name(iteration) + "_hf")


def export_latest(ckpt_dir: str, out_dir: str, tokenizer_dir: Optional[str], progress: bool = True) -> str:
    """The latest iteration of ``ckpt_dir`` as a HF folder ``out_dir`` in the checkpoint's own dtype (a causal LM,
    or the --orm form for a value model): e.g. an mcore judge for vLLM."""
    config, _, _, _ = read_mg_config(ckpt_dir)
    eos, pad = special_token_ids(tokenizer_dir)
    model = ModelConfig(**config["model"])
    hf_config = get_family(model.model_type_hf).hf_config(model, eos, pad)
    dtype = config.get("params_dtype", "fp32")
    return write_hf_folder(
        ckpt_dir, out_dir, hf_config, tokenizer_dir, dtype, config.get("orm", False), progress=progress
    )


def export_saved_iteration(ckpt_dir: str, iteration: int, tokenizer_dir: Optional[str]) -> str:
    """save_hf: the iteration just saved in ``ckpt_dir`` as a HF folder beside it (the ``--orm`` form for a
    value model), loadable by transformers and vLLM as it is."""
    config, _, _, _ = read_mg_config(ckpt_dir)
    latest = ml.read_tracker(ckpt_dir)
    if latest != iteration:
        raise ConversionError(f"{ckpt_dir}: save_hf expected iteration {iteration} to be the latest, found {latest}")
    eos, pad = special_token_ids(tokenizer_dir)
    dtype = config.get("params_dtype", "fp32")
    model = ModelConfig(**config["model"])
    hf_config = get_family(model.model_type_hf).hf_config(model, eos, pad)
    return write_hf_folder(
        ckpt_dir,
        hf_folder_of(ckpt_dir, iteration),
        hf_config,
        tokenizer_dir,
        dtype,
        config.get("orm", False),
        progress=False,
    )


def vl_state_to_mcore(state: Dict[str, torch.Tensor], cfg: ModelConfig) -> Dict[str, torch.Tensor]:
    """A vision-language model's whole megatron weights (one rank, TP = PP = 1) from a HF state dict of either
    layout (a transformers module's or the Hub's): the language model by its family's maps, the tower as
    ``visual.*``."""
    from ..families.qwen2_5_vl import split_hf_state

    family = get_family(cfg.model_type_hf)
    text, vision = split_hf_state(state)
    weights = {EMBED[1]: text[EMBED[0]], FINAL_NORM[1]: text[FINAL_NORM[0]]}
    if cfg.untie_embeddings_and_output_weights:
        weights[OUTPUT_MG] = text["lm_head.weight"]
    for i in range(cfg.num_layers):
        weights.update(family.layer_hf_to_mcore(i, family.read_hf_layer(i, cfg, text), cfg))
    weights.update({"visual." + name: tensor for name, tensor in vision.items()})
    return weights
