"""Two-stage part discovery on the synthetic parts world with hard masks, argmax block-diagonal
cliques (zero leakage); everything but `model` is configs/synthetic_single.py's.

  python -m metonymy.main --config=configs/synthetic_hard.py[:runlocal] --workdir=DIR

--config.model.stage2.hard_gradient=none: no gradient into Stage 1, the main text's reading.
"""

from metonymy import config_lib


def get_config(arg: str = ""):
  return config_lib.part_discovery("synthetic", arg, "hard")
