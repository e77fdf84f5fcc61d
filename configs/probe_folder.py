"""Leakage benchmark on your own dataset in the folder format (metonymy/data/folder.py).

  python -m metonymy.main --config=configs/probe_folder.py --workdir=DIR \
      --config.data.root=/data/my_insects --config.backbone.checkpoint=converted/dinov3_vitb16

  # A worked example: the synthetic world written as a folder, a tiny random-init ViT.
  python -m metonymy.data export-synthetic --root /tmp/synthetic_folder --examples 200
  python -m metonymy.main --config=configs/probe_folder.py:tiny --workdir=/tmp/probe_folder \
      --config.data.root=/tmp/synthetic_folder

Part masks: the folder's own masks (masks/, `mask` column) as ground truth, so discovered part k
is part group k (K = the number of part groups). Without masks, give discovered part maps like
the real-data configs: --config.masks.source=file --config.masks.path=maps_{split}.npy (see
configs/probe_cub.py). Splits: train and test from the `split` column; val "" holds 20% of train
out (by seed) to choose weight decay, --config.data.val=val uses a val split instead. K_g^+ comes
from the contingency for part groups with keypoints, --config.evaluation.manual_assignment for
the others. --config.data.max_train / max_val / max_test cap each split (0 = all).
arg: "" or a backbone preset (the architecture when no checkpoint is given); "tiny": a tiny
random-init ViT on 32-px inputs, for the worked example and the tests.
"""

import ml_collections

from metonymy import config_lib


def get_config(arg: str = "vit_b16") -> ml_collections.ConfigDict:
  tiny = arg == "tiny"
  size = 32 if tiny else 224
  config = config_lib.probe_job(
      config_lib.probe_data("folder", train="train", val="", test="test", image_size=size,
                            read_threads=1 if tiny else 4),
      config_lib.part_masks("ground_truth"), seeds=(0,))
  if tiny:
    config.backbone = config_lib.random_backbone(
        patch_size=4, width=64, depth=2, num_heads=4, mlp_dim=128, pos_embed_grid=(8, 8),
        image_size=size)
    config.allow_random_backbone = True
    config.backbone_name = "random-vit-d2"
    config.evaluation.bootstrap = 20
    config.evaluation.leakage_images = 16
    config.evaluation.overlay_images = 2
  else:
    config.backbone = config_lib.backbone(preset=arg or "vit_b16", image_size=size)
    config.backbone_name = ""  # default: the checkpoint's folder name
  return config
