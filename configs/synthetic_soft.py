"""Two-stage part discovery on the synthetic parts world with soft masks, Stage-1 probabilities as
log attention biases (differentiable, leaks); everything but `model` is
configs/synthetic_single.py's.

  python -m metonymy.main --config=configs/synthetic_soft.py[:runlocal] --workdir=DIR
"""

from metonymy import config_lib


def get_config(arg: str = ""):
  return config_lib.part_discovery("synthetic", arg, "soft")
