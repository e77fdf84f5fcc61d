"""Two-stage part discovery on the synthetic parts world with hard masks:
argmax block-diagonal cliques (zero leakage).

  python -m metonymy.main --config=configs/synthetic_hard.py[:runlocal] --workdir=DIR

Stage 1 gets Stage 2's gradient through the selected patches only (model.stage2.hard_gradient
"selected", the default: paper Appendix F, a part can shrink but not grow; Table 3's hard row
improves part discovery over single-stage, which needs that gradient). The main text's reading,
no gradient to Stage 1: --config.model.stage2.hard_gradient=none.

Everything but `model` (data, K, losses, optimizer, schedule, `runlocal`) is
configs/synthetic_single.py's.
"""

import ml_collections

from metonymy import config_lib


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  single = config_lib.load_sibling_config(__file__, "synthetic_single", arg)
  return config_lib.two_stage(single, mask="hard")
