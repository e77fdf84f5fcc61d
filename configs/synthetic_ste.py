"""Two-stage part discovery on synthetic with straight-through masks: hard forward, soft gradient (zero leakage, trainable end to end).

  python -m metonymy.main --config=configs/synthetic_ste.py[:runlocal] --workdir=DIR

Everything but the model comes from configs/synthetic_single.py (same data, K, losses, schedule).
"""

from metonymy import config_lib


def get_config(arg: str = ""):
  return config_lib.two_stage(config_lib.load_sibling_config(__file__, "synthetic_single", arg), "ste")
