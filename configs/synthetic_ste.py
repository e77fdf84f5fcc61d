"""Two-stage part discovery on the synthetic parts world with straight-through masks, hard forward
and soft gradient (zero leakage, trainable end to end); everything but `model` is
configs/synthetic_single.py's.

  python -m metonymy.main --config=configs/synthetic_ste.py[:runlocal] --workdir=DIR
"""

from metonymy import config_lib


def get_config(arg: str = ""):
  return config_lib.part_discovery("synthetic", arg, "ste")
