"""The trainer's data: sources and Grain pipelines from a config.data block.

Training batches carry `image`, `attributes`, `attribute_valid`; evaluation batches also
`valid`, and `keypoints` / `keypoint_visible` and `part_segmentation` when the dataset has them
(the evaluation's resize and crop move them with the image: the NMI / ARI and the mask coverage
read them). Other keys (masks, training batches' segmentations) are dropped before augmentation,
so no time goes into warping them.
"""

from typing import Dict, Tuple

import numpy as np

from metonymy import data as data_lib
from metonymy.data import pipeline
from metonymy.data import transforms
from metonymy.evaluation import position_baseline as position_baseline_lib

TRAIN_KEYS = ("image", "attributes", "attribute_valid")
# The segmentation goes to the device with the rest and comes back from the eval step: that keeps
# it aligned with the maps of the global batch when several processes each hold a share of it.
# It costs little: uint8 [B, H, W], a twelfth of the float32 image.
EVAL_KEYS = TRAIN_KEYS + ("valid", "keypoints", "keypoint_visible", "part_segmentation")


class Subset:
  """The first `size` examples of a source (picklable, for Grain workers)."""

  def __init__(self, source, size: int):
    self.source, self.size = source, min(int(size), len(source))
    self.info = source.info

  def __len__(self) -> int:
    return self.size

  def __getitem__(self, index):
    if not 0 <= int(index) < self.size:
      raise IndexError(f"index {index} out of range [0, {self.size})")
    return self.source[index]


def sources(data_config) -> Tuple[object, object]:
  """(train source, eval source) of config.data."""
  train = data_lib.make_source_from_config(data_config, data_config.train_split)
  evaluation = data_lib.make_source_from_config(data_config, data_config.eval_split)
  if data_config.get("train_examples", 0):
    train = Subset(train, data_config.train_examples)
  if data_config.eval_examples:
    evaluation = Subset(evaluation, data_config.eval_examples)
  return train, evaluation


class _Select:
  """Keeps `keys` of an example (picklable)."""

  def __init__(self, keys):
    self.keys = tuple(keys)

  def __call__(self, example, rng=None):
    return {k: example[k] for k in self.keys if k in example}


def train_pipeline(source, data_config, mean, std, batch_size: int, seed: int):
  """Infinite, shuffled, augmented training batches of `batch_size` (this process's share)."""
  augment = transforms.Compose([
      _Select(TRAIN_KEYS),  # First: the geometry then moves nothing the step does not use.
      transforms.standard(data_config.image_size, train=True, mean=mean, std=std,
                          crop_scale=tuple(data_config.crop_scale))])
  return pipeline.make_pipeline(source, batch_size=batch_size, train=True, seed=seed,
                                transforms=augment, worker_count=data_config.worker_count,
                                read_threads=data_config.read_threads)


def eval_pipeline(source, data_config, mean, std, batch_size: int):
  """One padded pass over the evaluation split (`valid` marks real examples)."""
  prepare = transforms.Compose([
      _Select(EVAL_KEYS),
      transforms.standard(data_config.image_size, train=False, mean=mean, std=std)])
  return pipeline.make_pipeline(source, batch_size=batch_size, train=False, transforms=prepare,
                                worker_count=data_config.worker_count,
                                read_threads=data_config.read_threads)


def device_keys(batch: Dict[str, np.ndarray], keys) -> Dict[str, np.ndarray]:
  return {k: batch[k] for k in keys if k in batch}


def position_baseline(source, data_config, num_clusters: int, examples: int, seed: int = 0):
  """The position-only partition (evaluation/position_baseline.py) fit on the keypoints of the
  first `examples` images of `source` as the evaluation sees them (its resize and crop), or None
  when the dataset has no keypoints. Pixels are decoded only to move the keypoints with them."""
  prepare = transforms.Compose([
      _Select(("image", "keypoints", "keypoint_visible")),
      transforms.standard(data_config.image_size, train=False, mean=(0.0,) * 3,
                          std=(1.0,) * 3)])
  keypoints, visible, image_hw = [], [], None
  for index in range(min(int(examples), len(source))):
    example = source[index]
    if "keypoints" not in example:
      return None
    example = prepare(example)
    image_hw = example["image"].shape[:2]
    keypoints.append(example["keypoints"])
    visible.append(example["keypoint_visible"])
  if not keypoints:
    return None
  return position_baseline_lib.fit(np.stack(keypoints), np.stack(visible), image_hw, num_clusters,
                                   seed=seed)
