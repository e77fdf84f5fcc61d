"""Two-stage part discovery on CelebA with hard masks, argmax block-diagonal cliques (zero leakage);
everything but `model` is configs/celeba_single.py's.

  python -m metonymy.main --config=configs/celeba_hard.py[:runlocal] --config.data.root=DIR \
      --workdir=DIR

--config.model.stage2.hard_gradient=none: no gradient into Stage 1, the main text's reading.
"""

from metonymy import config_lib


def get_config(arg: str = ""):
  return config_lib.part_discovery("celeba", arg, "hard")
