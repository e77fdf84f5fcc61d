"""Single-stage part discovery on CheXpert (paper §4.0.1, Appendix A).

  python -m metonymy.main --config=configs/chexpert_single.py --config.data.root=DIR \
      --config.backbone.checkpoint=converted/rad_dino --workdir=workdirs/chexpert_single

RAD-DINO (ViT-B/14, Appendix A) at 224 px (16 x 16 patches; PDiscoFormer's resolution outside
CUB). K = 8: the paper does not state K for CheXpert; 8 is the value it uses elsewhere (override
with --config.model.num_parts). Labels: uncertain (-1) ignored in the loss. Evaluation on the
radiologist-labelled `valid` split (mAP/AUROC; CheXpert has no keypoints, so no NMI/ARI).
`runlocal` shrinks the model and run for a CPU smoke run (it still reads CheXpert from
config.data.root).
Its recipe: config_lib.PART_DISCOVERY["chexpert"], built by config_lib.part_discovery.
"""

from metonymy import config_lib


def get_config(arg: str = ""):
  return config_lib.part_discovery("chexpert", arg)
