"""The collapse monitor: per-part patch shares (training step and evaluation), the collapse flag
and warnings, and report.md (issue 12, "Training that says when it fails")."""

import jax.numpy as jnp
import numpy as np
import pytest

from metonymy.training import objective
from metonymy.training import evaluate

NUM_PARTS = 3  # K; channels 0..3, 3 = background


def _maps_from_ids(ids: np.ndarray, num_channels: int = NUM_PARTS + 1,
                   confidence: float = 0.7) -> np.ndarray:
  """Soft maps [B, C, h, w] whose argmax is ids [B, h, w]: `confidence` on the winner, the rest
  spread evenly (so every map sums to 1 and the soft mass is known in closed form)."""
  rest = (1 - confidence) / (num_channels - 1)
  one_hot = np.moveaxis(np.eye(num_channels)[ids], -1, 1)
  return (rest + (confidence - rest) * one_hot).astype(np.float32)


def _ids_with_counts(counts, shape=(2, 5, 10)) -> np.ndarray:
  """Part ids [B, h, w] holding channel k exactly counts[k] times (in a fixed shuffled order)."""
  flat = np.repeat(np.arange(len(counts)), counts)
  assert flat.size == np.prod(shape)
  return np.random.default_rng(0).permutation(flat).reshape(shape)


def _scalars(counts, confidence=0.7):
  maps = _maps_from_ids(_ids_with_counts(counts), confidence=confidence)
  return evaluate.part_share_scalars(*evaluate.part_occupancy(maps))


def test_part_shares_and_soft_mass_are_exact():
  counts = [10, 25, 5, 60]  # of 100 patches
  scalars = _scalars(counts, confidence=0.7)
  for k, n in enumerate(counts):
    assert scalars[f"part_share/{k}"] == pytest.approx(n / 100, abs=1e-12)
    # Mass of k: 0.7 on its own patches, 0.1 on the others.
    assert scalars[f"part_mass/{k}"] == pytest.approx((0.7 * n + 0.1 * (100 - n)) / 100, abs=1e-6)
  assert scalars["part_share/max"] == pytest.approx(0.6)
  assert scalars["part_share/max_part"] == 3.0
  assert scalars["part_share/num_empty"] == 0.0
  assert scalars["collapsed"] == 0.0


def test_training_step_shares_equal_the_evaluation_shares():
  counts = [10, 25, 5, 60]
  maps = _maps_from_ids(_ids_with_counts(counts))
  metrics = objective.part_share_metrics(jnp.asarray(maps))
  expected = evaluate.part_share_scalars(*evaluate.part_occupancy(maps))
  for k in range(NUM_PARTS + 1):
    np.testing.assert_allclose(metrics[f"train/part_share/{k}"], expected[f"part_share/{k}"],
                               rtol=1e-6)
    np.testing.assert_allclose(metrics[f"train/part_mass/{k}"], expected[f"part_mass/{k}"],
                               rtol=1e-6)
  np.testing.assert_allclose(metrics["train/part_share/max"], 0.6, rtol=1e-6)


def test_one_part_with_95_percent_of_the_patches_is_a_collapse():
  scalars = _scalars([2, 2, 1, 95])  # the background takes 95%
  assert scalars["collapsed"] == 1.0 and scalars["part_share/max"] == pytest.approx(0.95)
  warnings = evaluate.collapse_warnings(scalars)
  assert len(warnings) == 1
  assert warnings[0].startswith("Part collapse: background takes 95.0%")
  # A foreground part collapses the same way.
  scalars = _scalars([1, 95, 2, 2])
  assert scalars["collapsed"] == 1.0
  assert "Part collapse: part 2 takes 95.0%" in evaluate.collapse_warnings(scalars)[0]


def test_balanced_parts_are_not_a_collapse():
  scalars = _scalars([25, 25, 20, 30])
  assert scalars["collapsed"] == 0.0
  assert evaluate.collapse_warnings(scalars) == []
  # 90% exactly is not "more than 90%".
  assert _scalars([4, 3, 3, 90])["collapsed"] == 0.0


def test_an_empty_part_is_detected():
  scalars = _scalars([30, 0, 30, 40])
  assert scalars["part_share/num_empty"] == 1.0 and scalars["collapsed"] == 1.0
  warnings = evaluate.collapse_warnings(scalars)
  assert len(warnings) == 1 and "Empty part: part 2 of 3" in warnings[0]
  assert "no patch" in warnings[0]
  # The background is not a part: a frame full of foreground parts is no collapse.
  assert _scalars([30, 30, 40, 0])["collapsed"] == 0.0


def test_evaluate_pools_the_shares_over_the_set_and_skips_padding():
  rng = np.random.default_rng(0)
  # Batch 1: part 0 everywhere; batch 2: the background everywhere, but its second row is
  # padding (all part 1, which must not count).
  ids = np.zeros((2, 2, 4, 4), np.int64)
  ids[1, 0], ids[1, 1] = NUM_PARTS, 1
  batches = []
  for b in range(2):
    maps = _maps_from_ids(ids[b])
    batches.append({"valid": np.array([True, b == 0]), "attributes": np.zeros((2, 3), np.float32),
                    "attribute_valid": np.ones((2, 3), bool), "maps": maps,
                    "logits": {"stage1": rng.normal(size=(2, 3))},
                    "image": np.zeros((2, 16, 16, 3), np.float32)})
  scalars = evaluate.evaluate(lambda b: b, batches, image_mean=(0.5,) * 3, image_std=(0.25,) * 3,
                              num_images=0)["scalars"]
  # 3 real images of 16 patches: part 0 holds 2 of them, the background 1.
  assert scalars["part_share/0"] == pytest.approx(2 / 3)
  assert scalars["part_share/1"] == 0.0 and scalars["part_share/2"] == 0.0
  assert scalars["part_share/3"] == pytest.approx(1 / 3)
  assert scalars["part_share/num_empty"] == 2.0 and scalars["collapsed"] == 1.0


def test_report_lists_the_warnings_the_share_table_and_both_nmi_variants():
  scalars = _scalars([2, 2, 1, 95])
  scalars.update({"stage1/mAP": 0.25, "stage1/AUROC": 0.5, "stage1/bce": 0.48, "parts/NMI": 0.0,
                  "parts/ARI": 0.0, "parts/NMI_fg": 12.5, "parts/ARI_fg": 3.5,
                  "parts/num_keypoints": 40.0, "num_examples": 2.0})
  warnings = evaluate.collapse_warnings(scalars)
  text = evaluate.report_markdown(scalars, warnings, title="Training report", step=30,
                                  total_steps=30)
  assert "## Warnings" in text and f"- **{warnings[0]}**" in text
  assert "| background | 95.0% |" in text and "| part 1 | 2.0% |" in text
  assert "| K + 1 maps (background included) | 0.0 | 0.0 |" in text
  assert "| K foreground maps (MPAE) | 12.5 | 3.5 |" in text
  healthy = _scalars([25, 25, 20, 30])
  assert "None: no part holds more than 90%" in evaluate.report_markdown(
      healthy, [], title="t", step=1, total_steps=1)
  empty = _scalars([30, 0, 30, 40])
  assert "| part 2 | 0 (empty) |" in evaluate.report_markdown(
      empty, evaluate.collapse_warnings(empty), title="t", step=1, total_steps=1)


def test_probe_report_shows_nmi_ari_with_and_without_the_background(tmp_path):
  import ml_collections
  from metonymy.probe import report
  config = ml_collections.ConfigDict({
      "data": {"dataset": "synthetic"}, "seeds": [0], "report": {"title": ""},
      "masks": {"source": "stage1", "patch_rule": "plurality"}, "features": {"prefix": "cls"}})
  num_parts, groups = 2, ["head", "tail"]
  seed0 = {"backbone": "tiny", "seed": 0, "dataset": "synthetic", "num_parts": num_parts,
           "part_names": ["part 0", "part 1"], "groups": groups, "keypoint_groups": groups,
           "maskings": ["late", "early"], "probes": {m: {"weight_decay": 0.1} for m in
                                                     ("late", "early")},
           "num_train": 8, "num_val": 4, "num_test": 4, "tau": 0.5,
           "assignment": [[True, False], [False, True]], "assignment_source": ["contingency"] * 2,
           "ps_late": 0.1, "ps_early": 0.3, "map_matrix_late": [[0.5, 0.4], [0.4, 0.5]],
           "map_matrix_early": [[0.6, 0.3], [0.3, 0.6]],
           "nmi_with_background": 0.0, "ari_with_background": 0.0,
           "nmi_foreground": 41.25, "ari_foreground": 27.5}
  results = report.build_results(config, {"tiny": [seed0]}, {})
  report.write(str(tmp_path), config, results, visuals={}, arch={})
  text = (tmp_path / "report.md").read_text()
  assert "| with background | 0.00 | 0.00 |" in text
  assert "| foreground only | 41.25 | 27.50 |" in text


def test_evaluate_scores_keypoints_by_their_group_in_both_nmi_variants():
  """Groups merge by relabelling (Tables S7/S8): two wings are two points of one group. Part 0
  covers the left half (both keypoints of group 0), part 1 the right half (group 1), so both
  variants are perfect once the keypoints are scored by group, and not when each keypoint is its
  own group."""
  n = 4
  maps = np.zeros((n, NUM_PARTS + 1, 4, 4), np.float32)
  maps[:, 0, :, :2] = maps[:, 1, :, 2:] = 0.8
  maps[:, 2] = maps[:, NUM_PARTS] = 0.1
  maps[:, 0, :, 2:] = maps[:, 1, :, :2] = 0.0
  keypoints = np.broadcast_to(np.array([[4, 4], [4, 28], [28, 4], [28, 28]], np.float32),
                              (n, 4, 2)).copy()
  batch = {"valid": np.ones(n, bool), "attributes": np.zeros((n, 3), np.float32),
           "attribute_valid": np.ones((n, 3), bool), "maps": maps,
           "logits": {"stage1": np.zeros((n, 3))}, "keypoints": keypoints,
           "keypoint_visible": np.ones((n, 4), bool), "image": np.zeros((n, 32, 32, 3))}
  run = lambda group: evaluate.evaluate(lambda b: b, [batch], image_mean=(0.5,) * 3,
                                        image_std=(0.25,) * 3, num_images=0,
                                        keypoint_group=group)["scalars"]
  grouped = run((0, 0, 1, 1))
  for key in ("parts/NMI", "parts/ARI", "parts/NMI_fg", "parts/ARI_fg"):
    assert grouped[key] == pytest.approx(100.0), key
  assert grouped["parts/num_keypoints"] == 4 * n
  assert run(None)["parts/NMI"] < 90.0


def test_a_background_off_the_truth_s_share_is_reported_and_warned_of():
  """World v3: the truth's background is ~80% of the patches; a background channel on 96% is
  warned of as 16 points off the truth, whatever the largest-share rule says."""
  true = np.array([[0, 0, 0, 10], [0, 0, 0, 10], [0, 0, 0, 0], [1, 3, 0, 76]], np.float64)
  truth_background = true[-1].sum() / true.sum()
  scalars = evaluate.coverage_scalars(true)
  assert scalars["parts/background_share"] == pytest.approx(0.96)
  assert scalars["parts/background_share_true"] == pytest.approx(truth_background)
  assert scalars["parts/background_gap"] == pytest.approx(0.96 - truth_background)
  warnings = evaluate.collapse_warnings(dict(scalars, **_scalars([10, 10, 10, 70])))
  assert any(w.startswith("Background off the truth: the background channel takes 96.0%")
             for w in warnings), warnings
  near = np.array([[5, 0, 0, 5], [0, 5, 0, 5], [0, 0, 0, 0], [0, 0, 0, 80]], np.float64)
  assert not any("Background off" in w for w in evaluate.collapse_warnings(
      dict(evaluate.coverage_scalars(near), **_scalars([10, 10, 10, 70]))))


def test_a_background_at_the_truth_s_share_holding_the_object_is_reported():
  """The background channel can hold the truth's share of the patches and still be the wrong
  patches: here it takes every patch of both true parts (and gives as many background patches
  to the parts), so its share equals the truth's while it holds the whole object."""
  # Rows: true part 0, true part 1, background; columns: found part 0, part 1, background.
  swapped = np.array([[0, 0, 10], [0, 0, 10], [10, 10, 60]], np.float64)
  scalars = evaluate.coverage_scalars(swapped)
  assert scalars["parts/background_gap"] == pytest.approx(0.0)
  assert scalars["parts/object_in_background"] == pytest.approx(1.0)
  assert scalars["parts/background_in_parts"] == pytest.approx(0.25)
  assert scalars["parts/in_background/0"] == pytest.approx(1.0)
  # Per part, and a part without patches has no share (NaN), not 0.
  near = np.array([[5, 0, 0, 5], [0, 8, 0, 2], [0, 0, 0, 0], [0, 0, 0, 80]], np.float64)
  scalars = evaluate.coverage_scalars(near)
  assert scalars["parts/object_in_background"] == pytest.approx(7 / 20)
  assert scalars["parts/in_background/0"] == pytest.approx(0.5)
  assert scalars["parts/in_background/1"] == pytest.approx(0.2)
  assert np.isnan(scalars["parts/in_background/2"])
  assert scalars["parts/background_in_parts"] == pytest.approx(0.0)
