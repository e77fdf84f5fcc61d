"""Backbone smoke run: plain and early-masked forwards, with the zero-leakage check, on random data.

  python -m metonymy.main --config=configs/backbone_smoke.py --workdir=/tmp/smoke
  python -m metonymy.main --config=configs/backbone_smoke.py:vit_b16 \
      --config.backbone.checkpoint=converted/dinov2_vitb14_reg4 --workdir=/tmp/smoke
"""

import ml_collections

from metonymy import config_lib


def get_config(arg: str = "vit_tiny_test") -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.job = "backbone_smoke"
  config.seed = 0
  config.backbone = config_lib.backbone(preset=arg or "vit_tiny_test")
  config.batch_size = 2
  config.num_parts = 4
  return config
