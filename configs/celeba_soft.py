"""Two-stage part discovery on celeba with soft masks: Stage-1 probabilities as log attention biases (differentiable, leaks).

  python -m metonymy.main --config=configs/celeba_soft.py[:runlocal] --workdir=DIR

Everything but the model comes from configs/celeba_single.py (same data, K, losses, schedule).
"""

from metonymy import config_lib


def get_config(arg: str = ""):
  return config_lib.two_stage(config_lib.load_sibling_config(__file__, "celeba_single", arg), "soft")
