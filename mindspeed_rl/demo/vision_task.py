"""Assets of the vision CPU task ("what colour is the circle?"), made offline on first use.

Each prompt is one 56 x 56 picture (4 image tokens) of a circle of one of four colours at a random place and
size on a noisy grey background, and the same question every time; the reward is 1 when the response ends in
"#### <the circle's colour>". The answer is only in the picture: a model that does not look can only guess
(1 in 4). RL starts from a short cold-start SFT in two phases (``sft_phases``): first on the right colours (the model
learns the answer's format and to look at the picture), then on colours drawn at random (its answers drift back
to a guess). The model starts RL at chance, its vision tower trained; RL has to tie what it sees to what it
says. The control (``blank=True``) shows every picture
without its circle: the colour is nowhere, and neither the cold start nor RL can do better than guess.

Everything is written under ``root``: the tokenizer and image processor (``tiny_vl_hf``: the folder vLLM and
the trainer read them from), the pictures as PNG files and the rows that name them (``raw/``), the prompts
preprocessed with their images inside the indexed dataset (train and held-out test), the cold-start model as
HF and as a Megatron checkpoint for ``load``.
"""

from __future__ import annotations

import io
import json
import os
import random
from typing import Dict, List, Tuple

COLOURS = {"red": (215, 45, 40), "green": (40, 170, 60), "blue": (45, 80, 215), "yellow": (225, 200, 35)}
QUESTION = "What colour is the circle?"
SIZE = 56  # pixels a side: 4 x 4 patches of 14, 2 x 2 image tokens
SPECIAL = [
    "<|im_end|>",
    "<|endoftext|>",
    "<|im_start|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]  # <|im_end|> is id 0 (the models' EOS); <|image_pad|> is 5 (configs/model/tiny_qwen25_vl.yaml)


def picture(rng: random.Random, colour: str, blank: bool = False) -> bytes:
    """PNG of a circle of ``colour`` (jittered) on a noisy grey background; ``blank``: the background only."""
    from PIL import Image, ImageDraw

    grey = rng.randint(150, 235)
    image = Image.new("RGB", (SIZE, SIZE), (grey, grey, grey))
    pixels = image.load()
    for x in range(SIZE):
        for y in range(SIZE):
            v = max(0, min(255, grey + rng.randint(-20, 20)))
            pixels[x, y] = (v, v, v)
    radius = rng.randint(14, 24)
    cx, cy = rng.randint(4, SIZE - 4), rng.randint(4, SIZE - 4)  # the circle may leave the picture in part
    fill = tuple(max(0, min(255, c + rng.randint(-25, 25))) for c in COLOURS[colour])
    if not blank:
        ImageDraw.Draw(image).ellipse((cx - radius, cy - radius, cx + radius, cy + radius), fill=fill)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def make_rows(root: str, name: str, count: int, seed: int, blank: bool) -> List[dict]:
    """``count`` rows; their pictures written as ``<root>/raw/<name>/<i>.png`` and named relative to the raw folder."""
    rng = random.Random(seed)
    folder = os.path.join(root, "raw", name)
    os.makedirs(folder, exist_ok=True)
    rows = []
    for i in range(count):
        colour = rng.choice(sorted(COLOURS))
        with open(os.path.join(folder, f"{i}.png"), "wb") as fh:
            fh.write(picture(rng, colour, blank))
        rows.append({"problem": "<image>" + QUESTION, "answer": colour, "images": [f"{name}/{i}.png"]})
    return rows


def save_processor(folder: str, tokenizer, min_pixels: int, max_pixels: int, family: str = "qwen2_5_vl") -> None:
    """The family's processor (image processor with this pixel budget, the tokenizer) saved into ``folder``: what
    vLLM's multimodal input processing and the trainer's pixel values read. Qwen3-VL's cuts 16-pixel patches
    normalised to [-1, 1]; Qwen2.5-VL's 14-pixel patches with CLIP's statistics."""
    from transformers import Qwen2_5_VLProcessor, Qwen3VLProcessor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    if family.startswith("qwen3_vl"):
        half = dict(image_mean=[0.5] * 3, image_std=[0.5] * 3)
        images = Qwen2VLImageProcessor(min_pixels=min_pixels, max_pixels=max_pixels, patch_size=16, **half)
        processor = Qwen3VLProcessor(images, tokenizer, video_processor=Qwen3VLVideoProcessor())
    else:
        images = Qwen2VLImageProcessor(min_pixels=min_pixels, max_pixels=max_pixels)
        processor = Qwen2_5_VLProcessor(images, tokenizer, video_processor=Qwen2VLVideoProcessor())
    processor.save_pretrained(folder)


def write_prompt_sets(root: str, tokenizer_dir: str, parts: Dict[str, List[dict]]) -> None:
    """Each set of rows as ``<root>/raw/<name>.jsonl``, preprocessed into ``<root>/data/<name>``."""
    from ..datasets.dataset_config import DatasetConfig
    from ..datasets.preprocess import preprocess

    for name, part in parts.items():
        raw = os.path.join(root, "raw", name + ".jsonl")
        with open(raw, "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in part)
        cfg = DatasetConfig(
            input=raw,
            tokenizer_name_or_path=tokenizer_dir,
            output_prefix=os.path.join(root, "data", name),
            handler_name="R1VisionInstructionHandler",
            prompt_type="empty",
            map_keys={"prompt": "problem", "query": "", "response": "answer", "system": "", "image": "images"},
            dataset_additional_keys=["labels"],
            min_pixels=SIZE * SIZE,
            max_pixels=4 * SIZE * SIZE,  # the processor's budget (save_processor): Qwen3-VL's 32-pixel units fit 64^2
            seq_length=64,
        )
        cfg.check()
        summary = preprocess(cfg, progress=False)
        if summary["kept"] != len(part):
            raise RuntimeError(f"vision task {name}: {summary}")


def cold_start(
    hf_dir: str, prefix: str, right_share: float, steps: int, batch: int, lr: float, seed: int
) -> List[float]:
    """Supervised training of the HF model in ``hf_dir`` (saved in place) on the preprocessed prompts of
    ``prefix``, each followed by "#### <colour>" and EOS: the circle's colour with probability ``right_share``,
    a random colour otherwise. Returns the loss of every step."""
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    from ..datasets.images import ImageEncoder
    from ..datasets.prompt_dataset import PromptDataset
    from .tiny_hf import masked_lm_batch, sft_step

    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    model = AutoModelForImageTextToText.from_pretrained(hf_dir, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    dataset, encoder = PromptDataset(prefix), ImageEncoder(hf_dir)
    rows = [dataset[i] for i in range(len(dataset))]
    encoded = [encoder.encode(r["images"]) for r in rows]
    answers = {c: tokenizer.encode(f"#### {c}", add_special_tokens=False) + [tokenizer.eos_token_id] for c in COLOURS}
    image_token = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    losses = []
    for _ in tqdm(range(steps), desc="cold-start SFT (vision)", leave=False):
        picked = [rng.randrange(len(rows)) for _ in range(batch)]
        sequences, masks = [], []
        for i in picked:
            colour = rows[i]["labels"] if rng.random() < right_share else rng.choice(sorted(COLOURS))
            prompt = rows[i]["input_ids"]
            sequences.append(prompt + answers[colour])
            masks.append([0] * len(prompt) + [1] * len(answers[colour]))
        ids, labels, attention = masked_lm_batch(list(zip(sequences, masks)), tokenizer.pad_token_id)
        loss = model(
            input_ids=ids,
            attention_mask=attention,
            labels=labels,
            pixel_values=torch.cat([encoded[i][0] for i in picked]),
            image_grid_thw=torch.cat([encoded[i][1] for i in picked]),
            mm_token_type_ids=(ids == image_token).int(),
        ).loss
        sft_step(model, optimizer, loss)
        losses.append(loss.item())
    model.save_pretrained(hf_dir)
    return losses


def task_tokenizer(folder: str, model) -> None:
    """The task's tokenizer for ``model`` (a model section) with its family's image processor, saved into
    ``folder``: what the run's tokenizer_name_or_path and vLLM read."""
    from .tiny_hf import build_tokenizer

    texts = [QUESTION + " " + " ".join(f"#### {c}" for c in COLOURS)] * 20
    tokenizer = build_tokenizer(
        folder,
        texts,
        model.padded_vocab_size,
        full_alphabet=False,
        special_tokens=SPECIAL,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        pad_to_vocab=True,
    )
    if tokenizer.convert_tokens_to_ids("<|image_pad|>") != model.image_token_id:
        raise RuntimeError(f"<|image_pad|> is not token {model.image_token_id} of the task's tokenizer")
    save_processor(folder, tokenizer, SIZE * SIZE, 4 * SIZE * SIZE, model.model_type_hf)


def prepare_vision_task(
    root: str,
    config_name: str = "grpo_tiny_cpu_vision",
    blank: bool = False,
    train_rows: int = 1024,
    test_rows: int = 64,
    sft_phases: Tuple[Tuple[int, float], ...] = ((150, 1.0), (40, 0.0)),
    sft_batch: int = 32,
    sft_lr: float = 1e-3,
    seed: int = 1,
) -> Dict[str, str]:
    """Write the task's assets under ``root`` (idempotent) and return their paths: tokenizer (with the image
    processor), data_prefix, test_prefix, hf (the cold-start model), mcore (the same for ``load``) and critic
    (the same with a value head).
    ``blank``: the control's assets (pictures without their circle), beside the task's."""
    from ..checkpoint.convert import hf_to_mg
    from ..features import load_ppo_config
    from .tiny_hf import build_hf_model

    model = load_ppo_config(config_name).actor.model
    family = model.model_type_hf
    stem = "tiny_vl" if family == "qwen2_5_vl" else f"tiny_{family}"  # each family its processor and pixels
    tag = ("shapes_blank" if blank else "shapes") + ("" if family == "qwen2_5_vl" else f"_{family}")
    paths = {
        "tokenizer": os.path.join(root, f"{stem}_hf"),
        "data_prefix": os.path.join(root, "data", tag + "_train"),
        "test_prefix": os.path.join(root, "data", tag + "_test"),
        "hf": os.path.join(root, f"{stem}_{tag}_sft_hf"),
        "mcore": os.path.join(root, "ckpt", f"{stem}_{tag}_sft_mcore"),
        "critic": os.path.join(root, "ckpt", f"{stem}_{tag}_sft_orm_mcore"),  # with a value head (ppo_tiny_cpu_vision)
    }
    if os.path.isfile(os.path.join(paths["critic"], "latest_checkpointed_iteration.txt")):
        return paths
    task_tokenizer(paths["tokenizer"], model)
    train = make_rows(root, tag + "_train", train_rows, seed, blank)
    test = make_rows(root, tag + "_test", test_rows, seed + 1000, blank)
    write_prompt_sets(root, paths["tokenizer"], {tag + "_train": train, tag + "_test": test})
    build_hf_model(paths["hf"], model, seed=seed, tokenizer_dir=paths["tokenizer"])
    for k, (steps, right_share) in enumerate(sft_phases):  # (steps, share of right colours)
        cold_start(paths["hf"], paths["data_prefix"], right_share, steps, sft_batch, sft_lr, seed + k)
    hf_to_mg(paths["hf"], paths["mcore"])
    hf_to_mg(paths["hf"], paths["critic"], orm=True)
    return paths


__all__ = ["COLOURS", "QUESTION", "picture", "prepare_vision_task", "save_processor", "task_tokenizer"]
