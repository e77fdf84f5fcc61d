"""Two-stage part discovery on CheXpert with soft masks:
Stage-1 probabilities as log attention biases (differentiable, leaks).

  python -m metonymy.main --config=configs/chexpert_soft.py[:runlocal] --workdir=DIR

Data, K, losses, optimizer and schedule are configs/chexpert_single.py's; only `model`
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
  config.backbone = config_lib.backbone("vit_b14_reg4", checkpoint="converted/rad_dino",
                                        image_size=image_size, family="rad_dino")
  config.data = config_lib.train_data(
      "chexpert", image_size=image_size, train_split="train", eval_split="valid",
      options={"uncertainty": "ignore", "frontal_only": False, "masks": False})
  config.model = config_lib.two_stage_model(num_parts=8, mask="soft")
  config.loss = config_lib.part_losses()
  config.optimizer = config_lib.part_optimizer()
  config.trainer = config_lib.trainer(num_epochs=30)
  config.mesh = config_lib.mesh()
  if arg.runlocal:
    config_lib.shrink_for_cpu(config)
  return config
