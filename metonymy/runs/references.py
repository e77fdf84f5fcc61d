"""What part-discovery numbers on the synthetic world are read against: the mAP of a constant
predictor on the images a train job scores (the floor), and what the part-shaping priors charge
the true parts, to compare with the maps Stage 1 found (whether the priors prefer the truth)."""

from typing import Dict, Optional

import jax
import numpy as np

from metonymy import data as data_lib
from metonymy.evaluation import patch_grid
from metonymy.training import losses

# The part-shaping priors that depend on the maps alone: objective.loss_fn's term name -> the
# function in metonymy/training/losses.py.
MAP_PRIORS = {"total_variation": "total_variation", "foreground_presence": "foreground_presence",
              "background_presence": "background_presence", "entropy": "pixel_entropy"}


def evaluated_examples(data_cfg):
  """(source, count): the split a train job evaluates on (`eval_split`) and how many of its first
  examples it scores (`eval_examples`, 0 = all)."""
  source = data_lib.make_source_from_config(data_cfg, data_cfg.eval_split)
  return source, min(len(source), int(data_cfg.eval_examples) or len(source))


def priors_of_the_truth(data_cfg, patch_size: int) -> Dict[str, float]:
  """What the part-shaping priors charge the ground-truth segmentation: the world's part labels
  on the patch grid (plurality per patch) as one-hot maps [B, K+1, h, w] (background last), for
  the first `eval_examples` of `data_cfg.eval_split`, scored in batches of the training batch size
  (the presence priors take a max over the batch) and averaged. A diagnostic only: compared with
  the trained maps' values (a train run's `loss/<term>` records), it says whether the priors, at
  this patch grid, prefer the true parts to what Stage 1 found."""
  source, count = evaluated_examples(data_cfg)
  num_parts = len(source.info.part_names)
  labels = patch_grid.segmentation_part_labels(
      np.stack([source[i]["part_segmentation"] for i in range(count)]), num_parts)
  ids, _ = patch_grid.patch_part_ids(labels, num_parts, patch_size)
  maps = np.moveaxis(np.eye(num_parts + 1, dtype=np.float32)[ids], -1, 1)
  batch = int(data_cfg.batch_size)
  chunks = [maps[i:i + batch] for i in range(0, count - batch + 1, batch)] or [maps]
  return {name: float(np.mean([jax.device_get(getattr(losses, function)(chunk))
                               for chunk in chunks]))
          for name, function in MAP_PRIORS.items()}


def chance_map(data_cfg) -> Optional[float]:
  """mAP of a constant predictor on the evaluation images the train job scores (the first
  `eval_examples` of `eval_split`): a constant score's AP is the attribute's positive rate, so
  this is the mean positive rate over attributes with a positive, the floor to read mAP against."""
  source, count = evaluated_examples(data_cfg)
  labels = np.stack([np.asarray(source[i]["attributes"], np.float64) for i in range(count)])
  valid = np.stack([np.asarray(source[i]["attribute_valid"], bool) for i in range(count)])
  positives, total = (labels * valid).sum(0), valid.sum(0)
  keep = positives > 0
  return float(np.mean(positives[keep] / total[keep])) if keep.any() else None
