import os
import sys

import pytest

# In make test's two streams (pytest-xdist workers), OpenMP threads that wait for work sleep instead of spinning:
# a spinning team that loses a core to the other stream stalls (a 26 s SFT run took 210 s beside a busy core, 30 s
# with this). Alone on the cores spinning is faster (the compatibility stages). Set before the first torch import;
# Ray workers and CLI runs inherit it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
PYTHON = sys.executable


@pytest.fixture
def root() -> str:
    return ROOT


@pytest.fixture(scope="session")
def demo_assets(tmp_path_factory) -> dict:
    """The demo's tokenizer and prompt sets (``mindspeed_rl.demo.assets.prepare`` for ppo_tiny_cpu's
    vocabulary, which every tiny CPU config shares), made once for the session (~5 s each time); runs write
    their logs and checkpoints elsewhere."""
    from mindspeed_rl.demo.assets import prepare
    from mindspeed_rl.features import load_ppo_config

    vocab = load_ppo_config("ppo_tiny_cpu").actor.model.padded_vocab_size
    return prepare(str(tmp_path_factory.mktemp("demo_assets")), vocab)


@pytest.fixture(scope="session")
def control_run(tmp_path_factory, demo_assets) -> list:
    """The control of the learning tests, run once: the demo's initial policy never updated (actor lr 1e-12),
    3 iterations of ppo_tiny_cpu validated at 2 and 3; its metrics per iteration. The tiny CPU twins share the
    model, the seed that initialises it and the prompts, and without an update the policy is the initial one
    whatever the algorithm: one control serves the PPO, GRPO and DAPO learning tests."""
    from mindspeed_rl.trainer.launch import train
    from tests.helpers import demo_config

    root = str(tmp_path_factory.mktemp("control"))
    keys = {"actor_config.lr": 1e-12, "rl_config.test_freq": 2, "rl_config.val_before_train": "false"}
    return train(demo_config("ppo_tiny_cpu", root, demo_assets, 3, **keys))


LEARNED_ITERATIONS = 20  # the demo's length: greedy validation flips to the right answers by then (1.0 at 20)


@pytest.fixture(scope="session")
def learned_run(tmp_path_factory, demo_assets):
    """The demo's run, once for the session: ppo_tiny_cpu for 20 iterations; (its root, its metrics per
    iteration). Its checkpoint of iteration 20 (root/ckpt/actor) is the policy that solves the task: the
    distillation test's teacher."""
    from mindspeed_rl.trainer.launch import train
    from tests.helpers import demo_config

    root = str(tmp_path_factory.mktemp("demo"))
    return root, train(
        demo_config("ppo_tiny_cpu", root, demo_assets, LEARNED_ITERATIONS, **LEARNED_EVALUATION(demo_assets))
    )


def LEARNED_EVALUATION(paths: dict) -> dict:
    """The demo run's benchmark suite during training (eval_config): its held-out questions as raw rows, 4 samples
    each, before training and every 10 iterations on the rollout engines (tests/test_ppo_e2e.py)."""
    return {
        "+eval_config.suites": f'["lucky={paths["raw_test"]}"]',  # NAME=PATH: quoted for Hydra
        "+eval_config.interval": 10,
        "+eval_config.n": 4,
        "+eval_config.before_train": "true",
        "+eval_config.prompt_type": "empty",
    }


def _stop_ray() -> None:
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="session", autouse=True)
def shared_ray():
    """The in-process training runs (``trainer.launch.train``) share one Ray: the first run starts it, the
    runs after it join it (as several runs of one test always did), and it stops at the end of the session.
    A Ray start and stop costs ~5 s; an idle Ray no measurable CPU. Modules that start Ray clusters of
    their own or count Ray's processes stop it first: ``without_shared_ray``."""
    yield
    _stop_ray()


@pytest.fixture(scope="module")
def without_shared_ray():
    """Ray of the in-process runs stopped before this module (its runs start their own clusters)."""
    _stop_ray()


SHARES_THE_DEMO_RUNS = ("learned_run", "control_run")
# the modules whose tests use them: one unit of work in make test's streams, so the runs are made once
DEMO_RUN_MODULES = ("tests/test_algorithms_e2e.py", "tests/test_distill_e2e.py", "tests/test_ppo_e2e.py")


def unit_of(nodeid: str) -> str:
    """The unit of make test's streams a test belongs to: its module, or ``demo_runs`` for DEMO_RUN_MODULES."""
    module = nodeid.split("::", 1)[0]
    return "demo_runs" if module in DEMO_RUN_MODULES else module


def start_forkserver() -> None:
    """Start multiprocessing's forkserver, unless it runs, with the heavy modules imported once
    (tests/spawn_preload.py) and its output to /dev/null: what forks from it writes where the server does, not into
    the test that forked it (a rank's failure still reaches the test as an exception with its traceback)."""
    import multiprocessing
    from multiprocessing import forkserver

    multiprocessing.set_forkserver_preload(["tests.spawn_preload"])
    sys.stdout.flush()
    sys.stderr.flush()
    saved, null = [os.dup(1), os.dup(2)], os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        forkserver.ensure_running()
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)


def pytest_configure(config) -> None:
    """tests/parallel_worker.py's worlds and the in-process runs' rule-reward pools fork from the forkserver. The
    reward runner names a preload list of its own, read only when the server starts: in make test's streams, where
    both come, the server starts here, first."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        start_forkserver()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``make test``'s two streams (``-n 2 --dist loadgroup``): a module is one unit of work, run by one stream (its
    module-scoped fixtures made once), the demo-run modules one unit together; units in collection order (below),
    not by size. pytest-xdist 3.8's own loadgroup cannot group under pytest 9 (it renames test ids through an
    attribute pytest 9 no longer reads), so every test was a unit of its own."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    config.option.loadscopereorder = False
    return ModuleUnits(config, log)


def pytest_collection_modifyitems(items) -> None:
    """The order of ``make test``'s units: modules with ``slow`` tests first, so that no long module starts last;
    the ones that stop the shared Ray last among their kind (fewer restarts of it). A test that uses the demo runs
    outside DEMO_RUN_MODULES would make them again in the other stream: refused."""
    slow_modules = {item.module.__name__ for item in items if item.get_closest_marker("slow")}
    for item in items:
        names = getattr(item, "fixturenames", ())
        if any(n in names for n in SHARES_THE_DEMO_RUNS) and unit_of(item.nodeid) != "demo_runs":
            module = item.module.__name__
            raise pytest.UsageError(f"{module} uses the session's demo runs: add it to DEMO_RUN_MODULES (conftest.py)")
    items.sort(
        key=lambda item: (
            item.module.__name__ not in slow_modules,
            "without_shared_ray" in getattr(item, "fixturenames", ()),
        )
    )
