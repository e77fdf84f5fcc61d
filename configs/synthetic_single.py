"""Single-stage part discovery (Stage 1 on a frozen backbone) on the synthetic parts world.

  python -m metonymy.main --config=configs/synthetic_single.py:runlocal --workdir=/tmp/syn
  python -m metonymy.main --config=configs/synthetic_single.py \
      --config.backbone.checkpoint=converted/dinov3_vitb16 --workdir=workdirs/synthetic_single

K = 5: the world's parts (head, body, wing, tail, legs). The world renders at the model's
resolution, so no resize blurs its patterns. `runlocal` shrinks everything for a CPU smoke run.
Its recipe: config_lib.PART_DISCOVERY["synthetic"], built by config_lib.part_discovery.
"""

from metonymy import config_lib


def get_config(arg: str = ""):
  return config_lib.part_discovery("synthetic", arg)
