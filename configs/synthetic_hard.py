"""Two-stage part discovery on synthetic with hard masks: argmax block-diagonal cliques (zero leakage).

  python -m metonymy.main --config=configs/synthetic_hard.py[:runlocal] --workdir=DIR

Stage 1 gets Stage 2's gradient through the selected patches only (model.stage2.hard_gradient
"selected", the default: paper Appendix F, a part can shrink but not grow; Table 3's hard row
improves part discovery over single-stage, which needs that gradient). The main text's reading,
no gradient to Stage 1: --config.model.stage2.hard_gradient=none.

Everything but the model comes from configs/synthetic_single.py (same data, K, losses, schedule).
"""

from metonymy import config_lib


def get_config(arg: str = ""):
  return config_lib.two_stage(config_lib.load_sibling_config(__file__, "synthetic_single", arg), "hard")
