"""Single-stage part discovery on your own dataset in the folder format (metonymy/data/folder.py).

  python -m metonymy.main --config=configs/folder_single.py --config.data.root=/data/my_insects \
      --config.backbone.checkpoint=converted/dinov3_vitb16 --workdir=workdirs/folder_single

DINOv3 ViT-B/16 at 224 px, the paper's losses and schedule (configs/celeba_single.py's recipe).
K = 8 discovered parts (a choice, like the paper's K for CUB and CelebA: set
--config.model.num_parts=K). Trains on split `train`, evaluates on `val`
(--config.data.eval_split=test if the folder has no val split). `runlocal` shrinks the model and
run for a CPU smoke run (it still reads config.data.root).
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
  config.data = config_lib.train_data("folder", image_size=image_size, train_split="train",
                                      eval_split="val")
  config.model = config_lib.stage1_model(num_parts=8)
  config.loss = config_lib.part_losses()
  config.optimizer = config_lib.part_optimizer()
  config.trainer = config_lib.trainer(num_epochs=30)
  config.mesh = config_lib.mesh()
  if arg.runlocal:
    config_lib.shrink_for_cpu(config)
  return config
