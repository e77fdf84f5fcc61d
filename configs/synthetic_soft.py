"""Two-stage part discovery on synthetic with soft masks: Stage-1 probabilities as log attention biases (differentiable, leaks).

  python -m metonymy.main --config=configs/synthetic_soft.py[:runlocal] --workdir=DIR

Everything but the model comes from configs/synthetic_single.py (same data, K, losses, schedule).
"""

from metonymy import config_lib


def get_config(arg: str = ""):
  return config_lib.two_stage(config_lib.load_sibling_config(__file__, "synthetic_single", arg), "soft")
