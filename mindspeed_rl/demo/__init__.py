"""The embedded demos' builders: a tiny tokenizer and HF model made offline (``tiny_hf``), the lucky-number
and long-tail prompt sets (``assets``), and the tool-use task with its cold-start SFT model (``tool_task``).
They compose data, families, checkpoints and tools, so they sit at the top with the entry points: used by
``cli/prepare_demo.py``, ``make demo``, the tests and bench/, imported by nothing in the package."""
