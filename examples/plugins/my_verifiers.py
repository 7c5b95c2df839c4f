"""A verifier of your own, outside the package: name it by path in the config, nothing to register.

    rl_config:
      verifier_function: [acc_for_ppo, my_verifiers:short_answer]
      verifier_weight: [1.0, 0.2]

with this folder on PYTHONPATH (``PYTHONPATH=examples/plugins``) or the module in your own package
(``my_pkg.rewards:short_answer``). The driver imports it when it checks the config (an import that fails
is refused there, naming the key) and each reward worker imports it again.
"""


def short_answer(response: str, label: str) -> float:
    """1 for a response of at most 64 characters after its last '####', else 0 (a length prior)."""
    tail = response.rsplit("####", 1)[-1]
    return 1.0 if len(tail.strip()) <= 64 else 0.0
