"""Leakage benchmark on the synthetic parts world: runs anywhere, nothing downloaded.

  python -m metonymy.main --config=configs/probe_synthetic.py --workdir=/tmp/probe_synth
  python -m metonymy.main --config=configs/probe_synthetic.py:trained --workdir=/tmp/probe_trained
  python -m metonymy.main --config=configs/probe_synthetic.py:tiny --workdir=/tmp/probe_tiny
  python -m metonymy.main --config=configs/probe_synthetic.py --workdir=DIR \
      --config.data.options.correlation=0.5 --config.seeds="(0,)"

A tiny ViT (patch 4, width 64, depth 4) on 48-px images, ground-truth part masks, cross-part
attribute correlation 0 (so any power of part j's feature to predict part k's attributes is
leakage, not real correlation), three seeds (three backbones).
arg (flags, `tiny,trained` combines them):
  (none)   random-init backbones (a couple of minutes on 2 CPU cores). Random weights mix a
           near-uniform average of all tokens into every token: late features change a lot when
           the rest of the image changes (causal leakage), but what leaks is mostly background
           and barely decodable, so late PS ~ early PS.
  trained  each backbone first pretrained for 600 steps on the world's attributes (CLS head and
           one attention read-out per part, training/pretraining.py; ~15 min in all on 2 CPU cores):
           it gathers object information into every patch, and late PS falls below early PS,
           as in the paper. configs/demo.py's stand-in is the same recipe trained 5x longer.
  tiny     seconds (32 px, depth 2, 96 / 48 / 64 examples, one seed); the smoke test.
"""

import ml_collections

from metonymy import config_lib


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  arg = config_lib.parse_arg(arg, tiny=False, trained=False)
  if arg.tiny:
    size, depth, (n_train, n_val, n_test), seeds = 32, 2, (96, 48, 64), (0,)
  else:
    size, depth, (n_train, n_val, n_test), seeds = 48, 4, (2000, 500, 1000), (0, 1, 2)
  patch = 4
  world = {"image_size": size, "correlation": 0.0,
           "splits": {"train": n_train, "val": n_val, "test": n_test}}
  config = ml_collections.ConfigDict()
  config.job = "probe"
  config.seeds = seeds
  config.allow_random_backbone = True
  config.backbone = config_lib.random_backbone(
      patch_size=patch, width=64, depth=depth, num_heads=4, mlp_dim=128,
      pos_embed_grid=(size // patch, size // patch), image_size=size)
  config.backbone_name = f"{'trained' if arg.trained else 'random'}-vit-d{depth}"
  config.data = config_lib.probe_data("synthetic", val="val", options=world)
  config.masks = config_lib.part_masks("ground_truth")
  config.backbone_pretraining = config_lib.backbone_pretraining(600 if arg.trained else 0,
                                                                images=n_train)
  config.features = config_lib.part_features(batch_size=64, chunk_size=256)
  config.probe = config_lib.linear_probe()
  config.evaluation = config_lib.probe_evaluation(bootstrap=20 if arg.tiny else 200,
                                                  leakage_images=32 if arg.tiny else 128)
  config.report = ml_collections.ConfigDict({"title": (
      f"synthetic parts world, correlation 0, "
      f"{'briefly trained' if arg.trained else 'random-init'} tiny ViT")})
  return config
