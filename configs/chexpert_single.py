"""Single-stage part discovery on CheXpert (paper §4.0.1, Appendix A).

  python -m metonymy.main --config=configs/chexpert_single.py --config.data.root=DIR \
      --config.backbone.checkpoint=converted/rad_dino --workdir=workdirs/chexpert_single

RAD-DINO (ViT-B/14, Appendix A) at 224 px (16 x 16 patches; PDiscoFormer's resolution outside
CUB). K = 8: the paper does not state K for CheXpert; 8 is the value it uses elsewhere (override
with --config.model.num_parts). Labels: uncertain (-1) ignored in the loss. Evaluation on the
radiologist-labelled `valid` split (mAP/AUROC; CheXpert has no keypoints, so no NMI/ARI).
`runlocal` shrinks the model and run for a CPU smoke run (it still reads CheXpert from
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
  config.backbone = config_lib.backbone("vit_b14_reg4", checkpoint="converted/rad_dino",
                                        image_size=image_size, family="rad_dino")
  config.data = config_lib.train_data(
      "chexpert", image_size=image_size, train_split="train", eval_split="valid",
      options={"uncertainty": "ignore", "frontal_only": False, "masks": False})
  config.model = config_lib.stage1_model(num_parts=8)
  config.loss = config_lib.part_losses()
  config.optimizer = config_lib.part_optimizer()
  config.trainer = config_lib.trainer(num_epochs=30)
  config.mesh = config_lib.mesh()
  if arg.runlocal:
    config_lib.shrink_for_cpu(config)
  return config
