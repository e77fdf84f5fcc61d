"""How discovered parts are named and coloured (metonymy/evaluation/part_names.py, issue 23)."""

import numpy as np
import pytest

from metonymy.evaluation import part_metrics
from metonymy.evaluation import part_names


def test_discovered_parts_are_part_1_to_k_and_background():
  assert part_names.discovered_names(3) == ["part 1", "part 2", "part 3"]
  assert part_names.discovered_names(2, background=True) == ["part 1", "part 2", "background"]
  assert part_names.part_name(0) == "part 1"
  assert part_names.is_discovered(["part 1", "part 2"])
  assert not part_names.is_discovered(["head", "tail"])
  assert not part_names.is_discovered(["P0", "P1"])


def test_best_match_from_a_contingency_with_ties_and_a_part_without_keypoints():
  groups = ["beak", "wing", "tail"]
  # Rows: parts 1-4 and the background; columns: the share of each group's keypoints.
  contingency = np.array([[0.8, 0.1, 0.0],    # part 1: mostly the beak
                          [0.1, 0.3, 0.3],    # part 2: wing and tail tie
                          [0.0, 0.0, 0.0],    # part 3: no keypoint at all
                          [0.0, 0.5, 0.1],    # part 4: the wing
                          [0.1, 0.1, 0.6]])   # background: never named
  assert part_names.best_matches(contingency, groups) == [["beak"], ["wing", "tail"], [], ["wing"]]
  assert part_names.matched_names(part_names.discovered_names(4), contingency, groups) == [
      "part 1 (≈ beak)", "part 2 (≈ wing / tail)", "part 3", "part 4 (≈ wing)"]


def test_best_match_of_a_measured_contingency_ignores_groups_without_keypoints():
  # Part 0 holds both keypoints of group 0 and one of group 1; group 2 is never visible (NaN).
  keypoint_part = np.array([[0, 0, 1, -1], [0, 0, 0, -1]])
  contingency = part_metrics.contingency(keypoint_part, 2, keypoint_group=[0, 0, 1, 2])
  assert np.isnan(contingency[:, 2]).all()
  names = part_names.matched_names(["part 1", "part 2"], contingency, ["head", "body", "legs"])
  assert names == ["part 1 (≈ head)", "part 2 (≈ body)"]
  with pytest.raises(ValueError, match="3 group names"):
    part_names.best_matches(contingency[:, :2], ["head", "body", "legs"])


@pytest.mark.parametrize("num_parts", [1, 4, 7, 10, 16, 24])
def test_every_part_has_its_own_colour_and_the_background_a_fixed_one(num_parts):
  colors = part_names.part_colors(num_parts)
  assert colors.shape == (num_parts + 1, 3) and colors.dtype == np.uint8
  assert len({tuple(c) for c in colors}) == num_parts + 1  # all distinct, background included
  assert tuple(colors[-1]) == part_names.BACKGROUND_COLOR
  first = min(num_parts, 20)  # the first 20 parts keep their colour whatever K is
  np.testing.assert_array_equal(colors[:first], part_names.part_colors(30)[:first])
  groups = part_names.group_colors(7)
  assert len({tuple(c) for c in groups}) == 7
