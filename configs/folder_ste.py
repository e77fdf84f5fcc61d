"""Two-stage part discovery on your own folder dataset with straight-through masks: hard forward, soft gradient (zero leakage, trainable end to end).

  python -m metonymy.main --config=configs/folder_ste.py[:runlocal] --config.data.root=DIR \
      --workdir=DIR

Everything but the model comes from configs/folder_single.py (same data, K, losses, schedule).
"""

from metonymy import config_lib


def get_config(arg: str = ""):
  return config_lib.two_stage(config_lib.load_sibling_config(__file__, "folder_single", arg), "ste")
