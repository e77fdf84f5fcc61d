"""Single-stage part discovery on CUB-200-2011 (paper §4.0.1, Appendix A).

  python -m metonymy.main --config=configs/cub_single.py --config.data.root=DIR \
      --config.backbone.checkpoint=converted/dinov3_vitb16 --workdir=workdirs/cub_single

DINOv3 ViT-B/16 (Appendix A). K = 7, the merged semantic parts of Tables S7/S9 (and the 7
discovered parts of Fig. S5). 512 px: PDiscoFormer's CUB resolution (518 = 37 patches of 14)
rounded to DINOv3's 16-px patches (32 x 32). `runlocal` shrinks the model and run for a CPU
smoke run (it still reads CUB from config.data.root).
Its recipe: config_lib.PART_DISCOVERY["cub"], built by config_lib.part_discovery.
"""

from metonymy import config_lib


def get_config(arg: str = ""):
  return config_lib.part_discovery("cub", arg)
