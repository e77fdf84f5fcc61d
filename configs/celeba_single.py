"""Single-stage part discovery on aligned CelebA (paper §4.0.1, Appendix A).

  python -m metonymy.main --config=configs/celeba_single.py --config.data.root=DIR \
      --config.backbone.checkpoint=converted/dinov3_vitb16 --workdir=workdirs/celeba_single

DINOv3 ViT-B/16 (Appendix A) at 224 px (Table S5). K = 8, the semantic face parts of Table S8.
`runlocal` shrinks the model and run for a CPU smoke run (it still reads CelebA from
config.data.root).
Its recipe: config_lib.PART_DISCOVERY["celeba"], built by config_lib.part_discovery.
"""

from metonymy import config_lib


def get_config(arg: str = ""):
  return config_lib.part_discovery("celeba", arg)
