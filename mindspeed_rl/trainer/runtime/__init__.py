"""The frame a run runs in: the run directory, log routing, Ray and the placement group (`ray_run.py`), exit codes and
failure translation, restarts (`failures.py`), and the guards that stop a run on non-finite or collapsed steps."""
