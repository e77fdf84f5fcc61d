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
arg: `tiny`, a tiny random-init ViT on 32-px inputs, for the worked example and the tests;
`preset=NAME`, the architecture built when no checkpoint is given.
"""

import ml_collections

from metonymy import config_lib


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  arg = config_lib.parse_arg(arg, tiny=False, preset="vit_b16")
  size = 32 if arg.tiny else 224
  config = ml_collections.ConfigDict()
  config.job = "probe"
  config.seeds = (0,)
  config.allow_random_backbone = arg.tiny  # Real data: a checkpoint must be given.
  if arg.tiny:
    config.backbone = config_lib.random_backbone(
        patch_size=4, width=64, depth=2, num_heads=4, mlp_dim=128, pos_embed_grid=(8, 8),
        image_size=size)
    config.backbone_name = "random-vit-d2"
  else:
    config.backbone = config_lib.backbone(preset=arg.preset, image_size=size)
    config.backbone_name = ""  # Default: the checkpoint's folder name.
  config.data = config_lib.probe_data("folder", train="train", val="", test="test",
                                      image_size=size, read_threads=1 if arg.tiny else 4)
  config.masks = config_lib.part_masks("ground_truth")
  config.backbone_pretraining = config_lib.backbone_pretraining()
  config.features = config_lib.part_features()
  config.probe = config_lib.linear_probe()
  config.evaluation = config_lib.probe_evaluation()
  if arg.tiny:
    config.evaluation.update({"bootstrap": 20, "leakage_images": 16, "overlay_images": 2})
  config.report = ml_collections.ConfigDict({"title": ""})
  return config
