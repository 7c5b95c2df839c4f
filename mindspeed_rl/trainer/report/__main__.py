"""``python -m mindspeed_rl.trainer.report <run_dir>``: the run report of a run folder (trainer/report/report.py)."""

import sys

from .report import main

sys.exit(main())
