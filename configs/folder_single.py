"""Single-stage part discovery on your own dataset in the folder format (metonymy/data/folder.py).

  python -m metonymy.main --config=configs/folder_single.py --config.data.root=/data/my_insects \
      --config.backbone.checkpoint=converted/dinov3_vitb16 --workdir=workdirs/folder_single

DINOv3 ViT-B/16 at 224 px, the paper's losses and schedule (configs/celeba_single.py's recipe).
K = 8 discovered parts (a choice, like the paper's K for CUB and CelebA: set
--config.model.num_parts=K). Trains on split `train`, evaluates on `val`
(--config.data.eval_split=test if the folder has no val split). `runlocal` shrinks the model and
run for a CPU smoke run (it still reads config.data.root).
"""

from metonymy import config_lib


def get_config(arg: str = ""):
  image_size = 224
  config = config_lib.part_discovery(
      config_lib.backbone("vit_b16_dinov3", checkpoint="converted/dinov3_vitb16",
                          image_size=image_size),
      config_lib.train_data("folder", image_size=image_size, train_split="train",
                            eval_split="val"),
      num_parts=8)
  return config_lib.with_run_size(config, arg)
