"""Two-stage part discovery on CelebA with soft masks, Stage-1 probabilities as log attention biases
(differentiable, leaks); everything but `model` is configs/celeba_single.py's.

  python -m metonymy.main --config=configs/celeba_soft.py[:runlocal] --config.data.root=DIR \
      --workdir=DIR
"""

from metonymy import config_lib


def get_config(arg: str = ""):
  return config_lib.part_discovery("celeba", arg, "soft")
