"""Single-stage part discovery (Stage 1 on a frozen backbone) on the synthetic parts world.

  python -m metonymy.main --config=configs/synthetic_single.py:runlocal --workdir=/tmp/syn
  python -m metonymy.main --config=configs/synthetic_single.py \
      --config.backbone.checkpoint=converted/dinov3_vitb16 --workdir=workdirs/synthetic_single

K = 5: the world's parts (head, body, wing, tail, legs). The world renders at the model's
resolution, so no resize blurs its patterns. `runlocal` shrinks everything for a CPU smoke run.
"""

import ml_collections

from metonymy import config_lib


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  arg = config_lib.parse_arg(arg, runlocal=False)
  image_size = 224
  config = ml_collections.ConfigDict()
  config.job = "train"
  config.seed = 0
  config.backbone = config_lib.backbone("vit_b16_dinov3", checkpoint="converted/dinov3_vitb16",
                                        image_size=image_size)
  config.data = config_lib.train_data("synthetic", image_size=image_size, train_split="train",
                                      eval_split="val",
                                      options={"image_size": image_size, "correlation": 0.8})
  config.model = config_lib.stage1_model(num_parts=5)
  config.loss = config_lib.part_losses()
  config.optimizer = config_lib.part_optimizer()
  config.trainer = config_lib.trainer(num_epochs=30)
  config.mesh = config_lib.mesh()
  if arg.runlocal:
    config_lib.shrink_for_cpu(config)
    # The world renders at the model's (shrunk) resolution, with few examples.
    config.data.options.image_size = config.data.image_size
    config.data.options.splits = (("train", 64), ("val", 16))
  return config
