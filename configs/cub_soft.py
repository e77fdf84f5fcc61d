"""Two-stage part discovery on CUB with soft masks, Stage-1 probabilities as log attention biases
(differentiable, leaks); everything but `model` is configs/cub_single.py's.

  python -m metonymy.main --config=configs/cub_soft.py[:runlocal] --config.data.root=DIR \
      --workdir=DIR
"""

from metonymy import config_lib


def get_config(arg: str = ""):
  return config_lib.part_discovery("cub", arg, "soft")
