"""Two-stage part discovery on CUB with straight-through masks, hard forward and soft gradient (zero
leakage, trainable end to end); everything but `model` is configs/cub_single.py's.

  python -m metonymy.main --config=configs/cub_ste.py[:runlocal] --config.data.root=DIR \
      --workdir=DIR
"""

from metonymy import config_lib


def get_config(arg: str = ""):
  return config_lib.part_discovery("cub", arg, "ste")
