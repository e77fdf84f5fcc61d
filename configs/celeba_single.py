"""Single-stage part discovery on aligned CelebA (paper §4.0.1, Appendix A).

  python -m metonymy.main --config=configs/celeba_single.py --config.data.root=DIR \
      --config.backbone.checkpoint=converted/dinov3_vitb16 --workdir=workdirs/celeba_single

DINOv3 ViT-B/16 (Appendix A) at 224 px (Table S5). K = 8, the semantic face parts of Table S8.
`runlocal` shrinks the model and run for a CPU smoke run (it still reads CelebA from
config.data.root).
"""

from metonymy import config_lib


def get_config(arg: str = ""):
  image_size = 224
  config = config_lib.part_discovery(
      config_lib.backbone("vit_b16_dinov3", checkpoint="converted/dinov3_vitb16",
                          image_size=image_size),
      config_lib.train_data("celeba", image_size=image_size, train_split="train",
                            eval_split="val"),
      num_parts=8)
  return config_lib.with_run_size(config, arg)
