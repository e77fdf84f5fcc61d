"""Backbone smoke run: plain and early-masked forwards, with the zero-leakage check, on random data.

  python -m metonymy.main --config=configs/backbone_smoke.py --workdir=/tmp/smoke
  python -m metonymy.main --config=configs/backbone_smoke.py:preset=vit_b16 \
      --config.backbone.checkpoint=converted/dinov2_vitb14_reg4 --workdir=/tmp/smoke

arg: `preset=NAME`, the backbone architecture (random weights unless a checkpoint is given).
"""

import ml_collections

from metonymy import config_lib


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  arg = config_lib.parse_arg(arg, preset="vit_tiny_test")
  config = ml_collections.ConfigDict()
  config.job = "backbone_smoke"
  config.seed = 0
  config.backbone = config_lib.backbone(preset=arg.preset)
  config.batch_size = 2
  config.num_parts = 4
  return config
