"""Two-stage part discovery on the synthetic parts world with hard masks:
argmax block-diagonal cliques (zero leakage).

  python -m metonymy.main --config=configs/synthetic_hard.py[:runlocal] --workdir=DIR

Stage 1 gets Stage 2's gradient through the selected patches only (model.stage2.hard_gradient
"selected", the default: paper Appendix F, a part can shrink but not grow; Table 3's hard row
improves part discovery over single-stage, which needs that gradient). The main text's reading,
no gradient to Stage 1: --config.model.stage2.hard_gradient=none.

Data, K, losses, optimizer and schedule are configs/synthetic_single.py's; only `model`
differs (tests/test_configs.py checks it). `runlocal`: the CPU smoke run.
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
  config.model = config_lib.two_stage_model(num_parts=5, mask="hard")
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
