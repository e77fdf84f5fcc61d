"""Single-stage part discovery on your own dataset in the folder format (metonymy/data/folder.py).

  python -m metonymy.main --config=configs/folder_single.py --config.data.root=/data/my_insects \
      --config.backbone.checkpoint=converted/dinov3_vitb16 --workdir=workdirs/folder_single

DINOv3 ViT-B/16 at 224 px, the paper's losses and schedule (configs/celeba_single.py's recipe).
K = 8 discovered parts (a choice, like the paper's K for CUB and CelebA: set
--config.model.num_parts=K). Trains on split `train`, evaluates on `val`
(--config.data.eval_split=test if the folder has no val split). `runlocal` shrinks the model and
run for a CPU smoke run (it still reads config.data.root).
Its recipe: config_lib.PART_DISCOVERY["folder"], built by config_lib.part_discovery.
"""

from metonymy import config_lib


def get_config(arg: str = ""):
  return config_lib.part_discovery("folder", arg)
