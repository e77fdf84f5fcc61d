"""Single-stage part discovery on aligned CelebA (paper §4.0.1, Appendix A).

  python -m metonymy.main --config=configs/celeba_single.py --config.data.root=DIR \
      --config.backbone.checkpoint=converted/dinov3_vitb16 --workdir=workdirs/celeba_single

DINOv3 ViT-B/16 (Appendix A) at 224 px (Table S5). K = 8, the semantic face parts of Table S8.
`runlocal` shrinks the model and run for a CPU smoke run (it still reads CelebA from
config.data.root).
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
  config.data = config_lib.train_data("celeba", image_size=image_size, train_split="train",
                                      eval_split="val")
  config.model = config_lib.stage1_model(num_parts=8)
  config.loss = config_lib.part_losses()
  config.optimizer = config_lib.part_optimizer()
  config.trainer = config_lib.trainer(num_epochs=30)
  config.mesh = config_lib.mesh()
  if arg.runlocal:
    config_lib.shrink_for_cpu(config)
  return config
