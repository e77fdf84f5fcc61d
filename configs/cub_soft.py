"""Two-stage part discovery on cub with soft masks: Stage-1 probabilities as log attention biases (differentiable, leaks).

  python -m metonymy.main --config=configs/cub_soft.py[:runlocal] --workdir=DIR

Everything but the model comes from configs/cub_single.py (same data, K, losses, schedule).
"""

from metonymy import config_lib


def get_config(arg: str = ""):
  return config_lib.two_stage(config_lib.load_sibling_config(__file__, "cub_single", arg), "soft")
