"""Two-stage part discovery on your own folder dataset with straight-through masks, hard forward and
soft gradient (zero leakage, trainable end to end); everything but `model` is
configs/folder_single.py's.

  python -m metonymy.main --config=configs/folder_ste.py[:runlocal] --config.data.root=DIR \
      --workdir=DIR
"""

from metonymy import config_lib


def get_config(arg: str = ""):
  return config_lib.part_discovery("folder", arg, "ste")
