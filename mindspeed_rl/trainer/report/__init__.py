"""What a run reports: metrics per iteration, the loggers (console, metrics.jsonl, TensorBoard, W&B, SwanLab), curves,
the run report and its HTML page, the profiler's tables."""
