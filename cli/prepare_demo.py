"""Make the embedded demo's tokenizer and data under ./demo_assets (once; later calls return at once)."""
from __future__ import annotations

import sys

from mindspeed_rl.config_cls import load_ppo_config
from mindspeed_rl.utils.demo_assets import prepare


def main() -> int:
    cfg = load_ppo_config("ppo_tiny_cpu")
    paths = prepare("./demo_assets", cfg.actor.model.padded_vocab_size)
    print(f"demo assets: tokenizer {paths['tokenizer']}, prompts {paths['data_prefix']}, "
          f"held-out test prompts {paths['test_prefix']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
