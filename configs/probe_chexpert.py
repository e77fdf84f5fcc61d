"""Leakage benchmark on CheXpert with CheXlocalize masks: MPPO (paper Table 2).

  python -m metonymy.main --config=configs/probe_chexpert.py --workdir=DIR \
      --config.data.root=/data/CheXpert-v1.0-small \
      --config.backbone.checkpoint=converted/rad_dino \
      --config.masks.path=/data/chexpert_part_maps_{split}.npy

Probes train on a subset of the train split, choose weight decay on `valid` and are tested on
CheXlocalize's `test` split, whose radiologist masks give MPPO (eq. 2): for each of the 10 tasks,
how often the part with the largest logit overlaps the task's ground-truth mask. PS needs keypoint
groups and is not defined here. Uncertain labels (-1) are ignored (attribute_valid False).
arg: `preset=NAME`, the architecture built when no checkpoint is given (tests only);
`runlocal`, 32-px images and no bootstrap (config_lib.shrink_probe_for_cpu: a fixture with a
`runlocal` training workdir as backbone and masks, in seconds).
"""

import ml_collections

from metonymy import config_lib


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  data = config_lib.probe_data(
      "chexpert", train="train", val="valid", test="test", image_size=224, max_train=20000,
      read_threads=4, options={"uncertainty": "ignore", "frontal_only": True})
  masks = config_lib.part_masks("file", num_parts=8)
  return config_lib.real_data_probe(arg, data, masks, preset="vit_b14_reg4")
