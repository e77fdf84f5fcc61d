"""Several backbones on one dataset, into one table (paper Tables 1-2).

  python -m metonymy.main --config=configs/probe_suite.py:dataset=cub --workdir=DIR \
      --config.data.root=/data/CUB_200_2011 --config.masks.path=/data/cub_parts_{split}.npy \
      --config.backbones.dinov2.checkpoint=converted/dinov2_vitb14_reg4 \
      --config.backbones.dinov3.checkpoint=converted/dinov3_vitb16 \
      --config.backbones.sam_vit_b16.checkpoint=sam_vit_b_01ec64.pth
  python -m metonymy.main --config=configs/probe_suite.py:dataset=synthetic --workdir=DIR  # no data

arg: `dataset=NAME`, one of cub (the default), celeba, chexpert or synthetic. The config is
configs/probe_<NAME>.py's with its one backbone replaced by `backbones`. For real data every
backbone needs its checkpoint; those left without one are skipped and listed in the report.
Features are cached per backbone, so adding a checkpoint later only computes the new one. The
synthetic suite compares random-init tiny ViTs of depth 2, 4 and 8.
sam_vit_b16 (SAM's image encoder, `sam_vit_b_01ec64.pth` or its HF / timm files) has no CLS
token and runs late masking only (its own `maskings`); for the non-paper pooled early masking add
--config.backbones.sam_vit_b16.part_pooling=True \
--config.backbones.sam_vit_b16.maskings="('late', 'early')".
"""

import ml_collections

from metonymy import config_lib

# name -> (preset for the architecture, checkpoint family): the paper's Table 1 backbones.
_BACKBONES = {
    "dinov3": ("vit_b16_dinov3", "dinov3"),
    "dinov2": ("vit_b14_reg4", "dinov2"),
    "dinov1": ("vit_b16", "dino"),
    "clip": ("vit_b16", "clip"),
    "mae": ("vit_b16", "mae"),
    # SAM's image encoder: no aggregation token, so late masking only (paper Table 1).
    "sam_vit_b16": ("sam_vit_b16", "sam"),
}
_LATE_ONLY = ("sam_vit_b16",)
_CHEXPERT_BACKBONES = ("dinov3", "dinov2", "rad_dino")


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  dataset = config_lib.parse_arg(arg, dataset="cub").dataset
  if dataset not in ("cub", "celeba", "chexpert", "synthetic"):
    raise ValueError(f"configs/probe_suite.py: unknown dataset {dataset!r}; use cub, celeba, "
                     "chexpert or synthetic")
  config = config_lib.load_sibling_config(__file__, f"probe_{dataset}")
  single = config.backbone
  del config["backbone"]
  del config["backbone_name"]
  if dataset == "synthetic":
    backbones = {}
    for depth in (2, 4, 8):
      b = ml_collections.ConfigDict(single.to_dict())
      b.arch.depth = depth
      backbones[f"random-vit-d{depth}"] = b
    config.seeds = (0,)
  elif dataset == "chexpert":
    backbones = {name: config_lib.backbone(preset="vit_b14_reg4", family=name, image_size=224)
                 for name in _CHEXPERT_BACKBONES}
    backbones["dinov3"].preset = "vit_b16_dinov3"
  else:
    backbones = {name: config_lib.backbone(preset=preset, family=family, image_size=224)
                 for name, (preset, family) in _BACKBONES.items()}
    for name in _LATE_ONLY:  # probe/job.py cuts features.maskings to these for the backbone.
      backbones[name].maskings = ("late",)
  config.backbones = ml_collections.ConfigDict(backbones)
  return config
