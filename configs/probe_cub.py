"""Leakage benchmark on CUB-200-2011 (paper Table 1, Fig. S5-S6).

  python -m metonymy.main --config=configs/probe_cub.py --workdir=DIR \
      --config.data.root=/data/CUB_200_2011 \
      --config.backbone.checkpoint=converted/dinov2_vitb14_reg4 \
      --config.masks.path=/data/cub_part_maps_{split}.npy

Part masks: K discovered parts saved by a part-discovery model (e.g. PDiscoFormer) as
[N, H, W] label maps (background = K, the largest label) or [N, K + 1, H, W] soft maps
(background channel last) per split, for the evaluation crop. K is taken from the file
(masks.num_parts = 0; the paper's CUB analysis, Fig. S5, has 7 parts): set
--config.masks.num_parts=K to have a file with another K refused (probe/masks.py FileMasks).
CUB has no val split: 20% of train is held out (by seed) to choose weight decay. The 248
attributes of Table S9 in 7 groups; K_g^+ from the contingency with the 7 merged keypoint groups.
arg: `preset=NAME`, the architecture built when no checkpoint is given (tests only);
`runlocal`, 32-px images and no bootstrap (config_lib.shrink_probe_for_cpu: a fixture with a
`runlocal` training workdir as backbone and masks, in seconds).
"""

import ml_collections

from metonymy import config_lib


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  data = config_lib.probe_data("cub", train="train", val="", test="test", image_size=224,
                               read_threads=4)
  masks = config_lib.part_masks("file", num_parts=0)
  return config_lib.real_data_probe(arg, data, masks, preset="vit_b14_reg4")
