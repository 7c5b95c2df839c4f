"""Make the embedded demo's tokenizer and data under ./demo_assets (once; later calls return at once).

python cli/prepare_demo.py            # the lucky-number task (ppo/grpo/dapo_tiny_cpu)
python cli/prepare_demo.py --tools    # also the tool-use task (grpo_tiny_cpu_tools): its cold start by the SFT stage
python cli/prepare_demo.py --pairs    # also the task's preference pairs (rm_tiny_cpu: reward-model training), and
                                      # pairs of worked answers (the four-stage pipeline's)
python cli/prepare_demo.py --sft      # also the task's worked answers as SFT examples (sft_tiny_cpu), and a
                                      # quarter-right copy (the four-stage pipeline's, examples/pipeline)
python cli/prepare_demo.py --judge    # also a small judge model fine-tuned by the SFT stage to grade the task
                                      # (grpo_tiny_cpu_judge)
python cli/prepare_demo.py --vision   # also the vision task (grpo_tiny_cpu_vision) and its blank-picture control
python cli/prepare_demo.py --vision-qwen3  # also the vision task on a tiny Qwen3-VL (grpo_tiny_cpu_vision_qwen3)
"""

from __future__ import annotations

import sys

from mindspeed_rl.demo.assets import prepare
from mindspeed_rl.features import load_ppo_config


def main() -> int:
    cfg = load_ppo_config("ppo_tiny_cpu")
    paths = prepare("./demo_assets", cfg.actor.model.padded_vocab_size)
    print(
        f"demo assets: tokenizer {paths['tokenizer']}, prompts {paths['data_prefix']}, "
        f"held-out test prompts {paths['test_prefix']}"
    )
    if "--pairs" in sys.argv[1:]:
        from mindspeed_rl.demo.assets import prepare_pairs

        for worked in (False, True):
            pairs = prepare_pairs("./demo_assets", cfg.actor.model.padded_vocab_size, worked=worked)
            print(f"preference pairs: {pairs['pairs_prefix']}, held-out pairs {pairs['pairs_test_prefix']}")
    if "--sft" in sys.argv[1:]:
        from mindspeed_rl.demo.assets import prepare_sft

        for share in (1.0, 0.25):
            sft = prepare_sft("./demo_assets", cfg.actor.model.padded_vocab_size, right_share=share)
            print(f"SFT examples: {sft['sft_prefix']}, held-out examples {sft['sft_test_prefix']}")
    if "--judge" in sys.argv[1:]:
        from mindspeed_rl.demo.judge_task import prepare_judge

        print(f"judge model: {prepare_judge('./demo_assets', cfg.actor.model)}")
    if "--tools" in sys.argv[1:]:
        from mindspeed_rl.demo.tool_task import prepare_tool_task

        tools = prepare_tool_task("./demo_assets")
        print(
            f"tool-use task: tokenizer {tools['tokenizer']}, prompts {tools['data_prefix']}, "
            f"cold-start model {tools['mcore']} (HF: {tools['hf']})"
        )
    visions = [("grpo_tiny_cpu_vision", False), ("grpo_tiny_cpu_vision", True)] if "--vision" in sys.argv[1:] else []
    if "--vision-qwen3" in sys.argv[1:]:
        visions.append(("grpo_tiny_cpu_vision_qwen3", False))
    for config_name, blank in visions:
        from mindspeed_rl.demo.vision_task import prepare_vision_task

        vision = prepare_vision_task("./demo_assets", config_name, blank=blank)
        print(
            f"vision task ({config_name}{', control: blank pictures' if blank else ''}): prompts "
            f"{vision['data_prefix']}, cold-start model {vision['hf']} (Megatron: {vision['mcore']})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
