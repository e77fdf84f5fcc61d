"""The position-only partition: the chance row of NMI / ARI at keypoints."""

import numpy as np
import pytest

from metonymy.data import synthetic
from metonymy.evaluation import part_metrics
from metonymy.evaluation import position_baseline


def _keypoints(config, split, count):
  source = synthetic.SyntheticParts(config, split)
  examples = [source[i] for i in range(count)]
  return (np.stack([e["keypoints"] for e in examples]),
          np.stack([e["keypoint_visible"] for e in examples]))


def _score(config, train=400, test=200):
  size = (config.image_size, config.image_size)
  baseline = position_baseline.fit(*_keypoints(config, "train", train), size, config.num_parts)
  return baseline.scores(*_keypoints(config, "val", test), size)


def test_position_alone_finds_the_parts_of_a_fixed_pose_world_and_not_of_a_turning_one():
  fixed = synthetic.SyntheticConfig(image_size=64, max_rotation=0.0, scale_range=(0.5, 0.5),
                                    min_translation=0.0, border_cut_prob=0.0, occlusion_prob=0.0,
                                    correlation=0.0)
  # Only the mirror flip and a few pixels of slack move the parts: five clusters over the ten
  # places still say much of which part a point is on.
  high = _score(fixed)
  assert high["parts/position_NMI"] > 50 and high["parts/position_ARI"] > 35, high
  turning = fixed.replace(max_rotation=180.0, scale_range=(0.5, 0.65), min_translation=0.18,
                          border_cut_prob=0.15)
  low = _score(turning)
  assert low["parts/position_NMI"] < 15 and low["parts/position_ARI"] < 12, low
  # The partition has no background cluster: both variants are the same numbers.
  assert low["parts/position_NMI"] == low["parts/position_NMI_fg"]


def test_clusters_are_the_nearest_centres_and_invisible_keypoints_are_left_out():
  keypoints = np.array([[[1.0, 1.0], [9.0, 9.0]], [[1.5, 0.5], [8.5, 9.5]]])  # [S=2, M=2, 2]
  visible = np.array([[True, True], [True, False]])
  baseline = position_baseline.fit(keypoints, visible, (10, 10), num_clusters=2)
  assert baseline.num_points == 3
  # Normalised by the image: a 20-px image of the same framing puts a point at twice the pixels.
  parts = baseline.keypoint_part(keypoints * 2, visible, (20, 20))
  assert parts[1, 1] == part_metrics.INVISIBLE
  assert parts[0, 0] == parts[1, 0] != parts[0, 1]
  # Scored like a model's parts: a perfect split of the two groups.
  scores = baseline.score_parts(parts)
  assert scores["parts/position_NMI"] == pytest.approx(100.0)


def test_fewer_distinct_positions_than_clusters_and_no_keypoint():
  keypoints = np.zeros((3, 2, 2))
  baseline = position_baseline.fit(keypoints, np.ones((3, 2), bool), (8, 8), num_clusters=5)
  assert baseline.num_clusters == 1
  assert position_baseline.fit(keypoints, np.zeros((3, 2), bool), (8, 8), 5) is None
  with pytest.raises(ValueError, match="must be \\[S, M, 2\\]"):
    position_baseline.fit(np.zeros((3, 2)), np.ones((3, 2), bool), (8, 8), 5)
