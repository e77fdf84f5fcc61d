"""Two-stage part discovery on CheXpert with straight-through masks, hard forward and soft gradient
(zero leakage, trainable end to end); everything but `model` is configs/chexpert_single.py's.

  python -m metonymy.main --config=configs/chexpert_ste.py[:runlocal] --config.data.root=DIR \
      --workdir=DIR
"""

from metonymy import config_lib


def get_config(arg: str = ""):
  return config_lib.part_discovery("chexpert", arg, "ste")
