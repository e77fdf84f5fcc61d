"""Two-stage part discovery on CheXpert with straight-through masks:
hard forward, soft gradient (zero leakage, trainable end to end).

  python -m metonymy.main --config=configs/chexpert_ste.py[:runlocal] --workdir=DIR

Everything but `model` (data, K, losses, optimizer, schedule, `runlocal`) is
configs/chexpert_single.py's.
"""

import ml_collections

from metonymy import config_lib


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  single = config_lib.load_sibling_config(__file__, "chexpert_single", arg)
  return config_lib.two_stage(single, mask="ste")
