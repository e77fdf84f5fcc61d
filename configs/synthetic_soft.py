"""Two-stage part discovery on the synthetic parts world with soft masks:
Stage-1 probabilities as log attention biases (differentiable, leaks).

  python -m metonymy.main --config=configs/synthetic_soft.py[:runlocal] --workdir=DIR

Everything but `model` (data, K, losses, optimizer, schedule, `runlocal`) is
configs/synthetic_single.py's.
"""

import ml_collections

from metonymy import config_lib


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  single = config_lib.load_sibling_config(__file__, "synthetic_single", arg)
  return config_lib.two_stage(single, mask="soft")
