"""Single-stage part discovery on CUB-200-2011 (paper §4.0.1, Appendix A).

  python -m metonymy.main --config=configs/cub_single.py --config.data.root=DIR \
      --config.backbone.checkpoint=converted/dinov3_vitb16 --workdir=workdirs/cub_single

DINOv3 ViT-B/16 (Appendix A). K = 7, the merged semantic parts of Tables S7/S9 (and the 7
discovered parts of Fig. S5). 512 px: PDiscoFormer's CUB resolution (518 = 37 patches of 14)
rounded to DINOv3's 16-px patches (32 x 32). `runlocal` shrinks the model and run for a CPU
smoke run (it still reads CUB from config.data.root).
"""

import ml_collections

from metonymy import config_lib


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  arg = config_lib.parse_arg(arg, runlocal=False)
  image_size = 512
  config = ml_collections.ConfigDict()
  config.job = "train"
  config.seed = 0
  config.backbone = config_lib.backbone("vit_b16_dinov3", checkpoint="converted/dinov3_vitb16",
                                        image_size=image_size)
  config.data = config_lib.train_data("cub", image_size=image_size, train_split="train",
                                      eval_split="test", options={"ignore_not_visible": False})
  config.model = config_lib.stage1_model(num_parts=7)
  config.loss = config_lib.part_losses()
  config.optimizer = config_lib.part_optimizer()
  config.trainer = config_lib.trainer(num_epochs=30)
  config.mesh = config_lib.mesh()
  if arg.runlocal:
    config_lib.shrink_for_cpu(config)
  return config
