r"""Does a synthetic world host the claims it is meant to test? Measured before any experiment.

  python -m metonymy.main --config=configs/world_check.py[:world=v2] --workdir=DIR \
      [--config.world.seed=1] [--config.world_check.backbone=DIR]      # the job
  python -m metonymy.world_check --config=configs/demo.py:world=v2 --backbone=DIR   # the same
  python -m metonymy.data world-check ...                             # an alias of the line above

The job (job "world_check", through the launcher's checks like every run) writes DIR/report.md
and DIR/results.json; its options are the config's `world_check` block. The command lines take
a demo or Table-3 config and the same options as flags. The config's `world` block is the world
checked (override any SyntheticConfig option as --config.world.<option>=value). Everything is
measured on the split (val; never test), with training images only where something is fit:

  1. The position baseline (evaluation/position_baseline.py): k-means with K clusters over the
     training keypoints' positions, scored at the split's keypoints as a model's parts are. Part
     discovery is only measurable above it.
  2. Where a part's evidence is, by construction: the share of parts whose patches (plurality
     rule on the patch grid) hold some of their evidence pixels, as a whole and in a contiguous
     quarter of them (the ceil(n/4) patches nearest a random patch of the part: a lazy mask).
  3. The mechanism, with a backbone that learned the world (`--backbone`, a converted folder;
     default: the world's shipped stand-in when its recipe matches): logistic probes from part
     k's early- and late-masked feature to part k's colour and pattern, from the whole part and
     from a contiguous quarter of it. The mechanism the two-stage claim rests on is present when
     early masking loses at least 0.2 accuracy from a quarter while late masking loses clearly
     less: the leakage of late masking fills the gap a partial mask leaves.
  4. Whether the backbone's patch tokens know their part at all (`pretrain.part_legibility`: a
     logistic probe from one patch token to its part, balanced accuracy against 1 / (K + 1)).
     Part discovery reads parts off these tokens: where they do not tell one plain part from
     another, no model can find the parts however its masks are trained, and a comparison of
     part-discovery models on that world compares nothing.
  5. What the paper's part-shaping priors charge the ground-truth parts on the patch grid.
"""

from typing import Dict

from metonymy.world_check import measure


def run(config, workdir) -> Dict:
  return measure.run(config, workdir)
