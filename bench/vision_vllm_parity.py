"""vLLM's log-probs on a prompt with an image against our engine's, on a tiny Qwen2.5-VL or Qwen3-VL built
offline.

    .venv/bin/python bench/vision_vllm_parity.py [--family qwen3_vl|qwen3_vl_moe] [--out /tmp/tiny_vl]

Builds a random tiny model folder (tokenizer with the vision tokens, the family's processor with a pixel budget
of 4^2..8^2 patches), samples 16 tokens with vLLM (CPU, fp32) from a prompt holding one image of 8 x 6 patches
as the dataset stores it (one <|image_pad|> per image token: 12), then scores prompt + response with
MegatronEngine (the tower attached, 3D positions; Qwen3-VL: interleaved, DeepStack) and prints the largest
difference of the response tokens' log-probs. vLLM and our engine run in separate processes (each sets up its
own torch.distributed world).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]
SPECIAL += ["<|video_pad|>"]


PATCH = {"qwen2_5_vl": 14, "qwen3_vl": 16, "qwen3_vl_moe": 16}


def build(out: str, family: str) -> None:
    import torch
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
        Qwen3VLMoeConfig,
        Qwen3VLMoeForConditionalGeneration,
    )

    from mindspeed_rl.demo.tiny_hf import build_tokenizer
    from mindspeed_rl.demo.vision_task import save_processor

    tok = build_tokenizer(out, ["what colour is the circle? red green blue " * 50], 512, special_tokens=SPECIAL)
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL}
    text = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2)
    text.update(num_key_value_heads=1, max_position_embeddings=2048)  # head_dim 64: vLLM's CPU attention
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [8, 12, 12]}
    vision = dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=128)
    if family.startswith("qwen3_vl"):
        text.update(head_dim=64)
        text["rope_parameters"]["mrope_interleaved"] = True
        config_class, model_class = Qwen3VLConfig, Qwen3VLForConditionalGeneration
        vision.update(num_position_embeddings=64, deepstack_visual_indexes=[0])
    if family == "qwen3_vl_moe":  # 4 experts of 48, 2 per token (hidden != 2 x 48: the fused layouts differ)
        text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, decoder_sparse_step=1)
        text.update(norm_topk_prob=True)  # the Hub's configs carry it; vLLM reads it
        config_class, model_class = Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration
    else:
        config_class, model_class = Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
        vision.update(window_size=56, fullatt_block_indexes=[1])
    cfg = config_class(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        eos_token_id=ids["<|endoftext|>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    torch.manual_seed(0)
    model_class(cfg).save_pretrained(out)
    if family == "qwen3_vl_moe":  # transformers 5 saves its modules' expert layout; the Hub's (vLLM's) is transposed
        from safetensors.torch import load_file, save_file

        path = os.path.join(out, "model.safetensors")
        state = load_file(path)
        fused = ("experts.gate_up_proj", "experts.down_proj")
        save_file({k: v.transpose(1, 2).contiguous() if k.endswith(fused) else v for k, v in state.items()}, path)
    patch = PATCH[family]
    save_processor(out, tok, (4 * patch) ** 2, (8 * patch) ** 2, family)


def image_png(family: str) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    patch = PATCH[family]
    Image.new("RGB", (8 * patch, 6 * patch), (40, 200, 90)).save(buf, format="PNG")  # 8 x 6 patches: 12 tokens
    return buf.getvalue()


def stored_prompt(out: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    start, pad, end = (tok.convert_tokens_to_ids(t) for t in ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>"))
    return tok.encode("what colour is the circle? ", add_special_tokens=False) + [start] + [pad] * 12 + [end], pad


def sample_with_vllm(out: str, family: str) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM, SamplingParams

    from mindspeed_rl.datasets.images import pack_images
    from mindspeed_rl.rollout.engines.multimodal import vllm_prompt

    prompt, pad = stored_prompt(out)
    llm = LLM(
        model=out,
        enforce_eager=True,
        dtype="float32",
        max_model_len=512,
        max_num_seqs=4,
        kv_cache_memory_bytes=256 * 2**20,
        enable_chunked_prefill=False,
    )
    params = SamplingParams(max_tokens=16, temperature=1.0, logprobs=0, seed=3, ignore_eos=True)
    result = llm.generate([vllm_prompt(prompt, pack_images([image_png(family)]), pad)], params)[0]
    completion = result.outputs[0]
    record = dict(
        prompt_as_vllm_expanded_it=list(result.prompt_token_ids),
        response=list(completion.token_ids),
        logprobs=[entry[t].logprob for entry, t in zip(completion.logprobs, completion.token_ids)],
    )
    with open(os.path.join(out, "vllm_sample.json"), "w") as f:
        json.dump(record, f)


def score_with_engine(out: str, family: str) -> None:
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from mindspeed_rl.checkpoint.convert import vl_state_to_mcore
    from mindspeed_rl.config_cls import MegatronConfig, RoleConfig
    from mindspeed_rl.families import get_family
    from mindspeed_rl.models.engine import MegatronEngine
    from mindspeed_rl.utils import dist

    dist.init_distributed()
    dist.init_model_parallel(seed=1)
    hf = AutoModelForImageTextToText.from_pretrained(out, dtype=torch.float32)
    cfg = get_family(family).model_config_from_hf(hf.config.to_dict())
    engine = MegatronEngine(RoleConfig("actor", MegatronConfig(model="vl"), cfg, 1), trainable=False)
    engine.load_weights(vl_state_to_mcore(hf.state_dict(), cfg))
    with open(os.path.join(out, "vllm_sample.json")) as f:
        sample = json.load(f)
    prompt, _ = stored_prompt(out)
    ids = torch.tensor([prompt + sample["response"]])
    pixels = AutoProcessor.from_pretrained(out).image_processor(
        images=[Image.open(io.BytesIO(image_png(family)))], return_tensors="pt"
    )
    batch = dict(input_ids=ids, attention_mask=torch.ones_like(ids))
    batch.update(pixel_values=pixels["pixel_values"][None], image_grid_thw=pixels["image_grid_thw"][None])
    ours = engine.forward(batch, 1)["log_probs"][0, len(prompt) :]
    diff = (ours - torch.tensor(sample["logprobs"])).abs()
    print(
        f"prompt {len(prompt)} tokens (vLLM expanded the collapsed prompt back to it: "
        f"{sample['prompt_as_vllm_expanded_it'] == prompt}), image grid {pixels['image_grid_thw'].tolist()}"
    )
    print(
        f"response {len(sample['response'])} tokens: max |logp_vllm - logp_engine| {diff.max().item():.2e}, "
        f"mean {diff.mean().item():.2e}"
    )
    dist.destroy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", choices=tuple(PATCH), default="qwen2_5_vl")
    parser.add_argument("--out", default=None, help="the model folder (default /tmp/tiny_<family>)")
    parser.add_argument("--stage", choices=("all", "build", "vllm", "engine"), default="all")
    args = parser.parse_args()
    out = args.out or f"/tmp/tiny_{args.family}"
    sys.path.insert(0, ROOT)
    if args.stage == "build" or (args.stage == "all" and not os.path.exists(os.path.join(out, "config.json"))):
        build(out, args.family)
    if args.stage == "all":
        for stage in ("vllm", "engine"):
            cmd = [sys.executable, __file__, "--family", args.family, "--out", out, "--stage", stage]
            subprocess.run(cmd, check=True)
    elif args.stage == "vllm":
        sample_with_vllm(out, args.family)
    elif args.stage == "engine":
        score_with_engine(out, args.family)


if __name__ == "__main__":
    main()
