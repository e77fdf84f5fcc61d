"""Leakage benchmark on aligned CelebA (paper Table 1).

  python -m metonymy.main --config=configs/probe_celeba.py --workdir=DIR \
      --config.data.root=/data/celeba --config.backbone.checkpoint=converted/dinov3_vitb16 \
      --config.masks.path=/data/celeba_part_maps_{split}.npy \
      --config.evaluation.manual_assignment="hair:3;hat:3;eyeglasses:1;ear:6;neck:7"

Part masks: K = 8 discovered parts per split, as for CUB. The 32 localized attributes of Table S8
in 8 groups; only eye, nose and mouth have landmarks, so K_g^+ of the other five groups must be
set by inspecting the part overlays (evaluation.manual_assignment; the ids above are an example
only). Groups without an assignment are left out of PS and listed in the report. Subsets keep the
run affordable (0 = the whole split).
arg: `preset=NAME`, the architecture built when no checkpoint is given (tests only);
`runlocal`, 32-px images and no bootstrap (config_lib.shrink_probe_for_cpu: a fixture with a
`runlocal` training workdir as backbone and masks, in seconds).
"""

import ml_collections

from metonymy import config_lib


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  data = config_lib.probe_data(
      "celeba", train="train", val="val", test="test", image_size=224, max_train=20000,
      max_val=5000, max_test=10000, read_threads=4)
  masks = config_lib.part_masks("file", num_parts=8)
  return config_lib.real_data_probe(arg, data, masks, preset="vit_b16")
