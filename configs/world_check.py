"""Does a synthetic world host the claims it tests? The world check as a job (world_check.py).

  python -m metonymy.main --config=configs/world_check.py[:world=v2] --workdir=DIR \
      [--config.world.seed=N] [--config.world_check.backbone=DIR]

DIR/report.md and DIR/results.json: the position baseline, where a part's evidence is, the
masking mechanism and the part legibility of a backbone that learned the world (the world's
shipped stand-in when its recipe matches, or `world_check.backbone`), what the priors charge
the truth; measured on `val`. `python -m metonymy.data world-check` is the same check as a
command line.

arg: configs/demo.py's (`world=v1|v2|v3`, `tiny`, `stand_in_objective=...`): the world and the
stand-in are the demo's.
"""

from metonymy import config_lib


def get_config(arg=None):
  config = config_lib.load_sibling_config(__file__, "demo", arg or "")
  config.job = "world_check"
  config.world_check = dict(
      backbone="",        # a converted backbone folder; "": the shipped stand-in, if it matches
      split="val",        # never test: the world is checked before any result
      train_images=1500,  # what the probes and the position baseline are fit on
      images=500,         # images of the split measured
      seed=0)             # the quarters' and the k-means' seed
  return config
