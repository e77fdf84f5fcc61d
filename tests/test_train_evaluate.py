"""The trainer's periodic evaluation: keypoint reading, metrics, the part-map overlay."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn import metrics as skm

from metonymy.evaluation import part_names
from metonymy.training import evaluate


def test_sample_at_keypoints_equals_bilinear_upsampling_then_reading_the_pixel():
  rng = np.random.default_rng(0)
  maps = rng.random((2, 3, 4, 4)).astype(np.float32)
  keypoints = rng.uniform(0, 32, (2, 5, 2)).astype(np.float32)
  upsampled = np.asarray(jax.image.resize(jnp.asarray(maps), (2, 3, 32, 32), "bilinear"))
  col, row = np.floor(keypoints[..., 0]).astype(int), np.floor(keypoints[..., 1]).astype(int)
  expected = np.stack([upsampled[b, :, row[b], col[b]] for b in range(2)])   # [B, G, C]
  np.testing.assert_allclose(evaluate.sample_at_keypoints(maps, keypoints, (32, 32)), expected,
                             rtol=1e-5, atol=1e-6)


def _predictions(rng, maps, keypoints, visible, logits, labels):
  """What a model's `predict` returns for one batch (the function under test's input)."""
  n = len(maps)
  return {"valid": np.ones(n, bool), "attributes": labels,
          "attribute_valid": np.ones_like(labels, bool), "keypoints": keypoints,
          "keypoint_visible": visible, "maps": maps,
          "logits": {"stage1": logits, "stage2": -logits}, "image": rng.normal(size=(n, 32, 32, 3))}


def test_evaluate_metrics_match_sklearn_and_perfect_parts_score_100():
  rng = np.random.default_rng(1)
  n, groups, parts = 12, 3, 4
  # Keypoint g sits in quadrant g; part g covers quadrant g exactly.
  centres = np.array([[4, 4], [28, 4], [4, 28]], np.float32)
  keypoints = np.broadcast_to(centres, (n, groups, 2)).copy()
  maps = np.zeros((n, parts + 1, 4, 4), np.float32)
  maps[:, 0, :2, :2] = maps[:, 1, :2, 2:] = maps[:, 2, 2:, :2] = 1
  maps[:, parts, 2:, 2:] = 1
  visible = rng.random((n, groups)) < 0.8
  labels = (rng.random((n, 6)) < 0.4).astype(np.float32)
  logits = rng.normal(size=(n, 6)).astype(np.float32) + 2 * labels
  batches = [_predictions(rng, maps[i], keypoints[i], visible[i], logits[i], labels[i])
             for i in (slice(0, 6), slice(6, n))]
  out = evaluate.evaluate(lambda b: b, batches, image_mean=(0.5,) * 3, image_std=(0.25,) * 3,
                          num_images=2)
  scalars = out["scalars"]
  aps = [skm.average_precision_score(labels[:, a], logits[:, a]) for a in range(6)]
  aucs = [skm.roc_auc_score(labels[:, a], logits[:, a]) for a in range(6)]
  np.testing.assert_allclose(scalars["stage1/mAP"], np.mean(aps), rtol=1e-9)
  np.testing.assert_allclose(scalars["stage1/AUROC"], np.mean(aucs), rtol=1e-9)
  assert "ensemble/mAP" in scalars and "stage2/mAP" in scalars
  for key in ("parts/NMI", "parts/ARI", "parts/NMI_fg", "parts/ARI_fg"):
    np.testing.assert_allclose(scalars[key], 100.0, err_msg=key)
  assert scalars["parts/num_keypoints"] == visible.sum()
  image = out["image"]
  # 2 images of 32 px zoomed to 192, rows image / parts / keypoints, then the legends.
  assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
  assert image.shape[0] > 3 * 192 and image.shape[1] > 2 * 192


def _has_block(image: np.ndarray, color, size: int = 12) -> bool:
  """Whether `image` holds a size x size square of exactly `color` (a swatch or a panel, not
  anti-aliased text)."""
  hit = np.all(image == np.asarray(color, np.uint8), axis=-1).astype(np.int64)
  sums = np.pad(hit.cumsum(0).cumsum(1), ((1, 0), (1, 0)))
  windows = sums[size:, size:] - sums[:-size, size:] - sums[size:, :-size] + sums[:-size, :-size]
  return bool((windows == size * size).any())


def _quadrant_maps(n, parts):
  """Part k covers quadrant k (k < 3); the background the last quadrant; part 3 is empty."""
  maps = np.zeros((n, parts + 1, 4, 4), np.float32)
  maps[:, 0, :2, :2] = maps[:, 1, :2, 2:] = maps[:, 2, 2:, :2] = 1
  maps[:, parts, 2:, 2:] = 1
  return maps


def test_part_overlay_shows_parts_ground_truth_and_a_legend_in_the_parts_colours():
  n, parts = 2, 4
  rng = np.random.default_rng(0)
  images = rng.normal(size=(n, 32, 32, 3))
  keypoints = np.broadcast_to(np.array([[4, 4], [28, 4], [4, 28]], np.float32), (n, 3, 2))
  visible = np.ones((n, 3), bool)
  colors = part_names.part_colors(parts)
  groups = part_names.group_colors(3)
  image = evaluate.part_overlay(images, _quadrant_maps(n, parts), (0.5,) * 3, (0.25,) * 3,
                                keypoints=keypoints, keypoint_visible=visible,
                                group_names=["beak", "wing", "tail"],
                                part_names=["part 1 (≈ beak)", "part 2 (≈ wing)",
                                            "part 3 (≈ tail)", "part 4"])
  assert image.dtype == np.uint8 and image.shape[2] == 3
  gap, left, panel = 4, evaluate._LEFT, 192  # 32 px zoomed by 6: every panel is 192 px
  assert image.shape[0] > 3 * panel and image.shape[1] >= left + 2 * panel
  parts_row = image[gap + panel + gap:gap + 2 * (panel + gap) - gap, left:left + panel]
  # Nearest zoom: each quadrant of the parts panel is one flat colour, the background black.
  for k, (row, col) in enumerate([(48, 48), (48, 144), (144, 48)]):
    np.testing.assert_array_equal(parts_row[row, col], colors[k])
  np.testing.assert_array_equal(parts_row[144, 144], part_names.BACKGROUND_COLOR)
  assert tuple(colors[-1]) not in {tuple(c) for c in colors[:-1]}  # its own colour
  # Ground truth below the parts: each keypoint a disc of its group's colour.
  truth_row = image[gap + 2 * (panel + gap):gap + 3 * panel + 2 * gap, left:left + panel]
  for g, (x, y) in enumerate([(4, 4), (28, 4), (4, 28)]):
    np.testing.assert_array_equal(truth_row[int((y + 0.5) * 6), int((x + 0.5) * 6)], groups[g])
  # The legends under the panels: a swatch in every part's colour (the empty part 4 included),
  # the background's, and every ground-truth group's.
  legend = image[gap + 3 * panel + 3 * gap:]
  for color in list(colors) + list(groups):
    assert _has_block(legend, color), color
  assert not _has_block(legend, (255, 0, 255))  # (the check finds only what is there)


def test_part_overlay_prefers_a_ground_truth_part_mask():
  n, parts = 1, 4
  segmentation = np.zeros((n, 32, 32), np.int64)
  segmentation[:, :16, :16] = 2  # group 1 ("wing") in the top-left quadrant, background elsewhere
  image = evaluate.part_overlay(np.zeros((n, 32, 32, 3)), _quadrant_maps(n, parts), (0.5,) * 3,
                                (0.25,) * 3, segmentation=segmentation,
                                keypoints=np.zeros((n, 3, 2)), keypoint_visible=np.ones((n, 3), bool),
                                group_names=["beak", "wing", "tail"])
  gap, left, panel = 4, evaluate._LEFT, 192
  truth = image[gap + 2 * (panel + gap):gap + 3 * panel + 2 * gap, left:left + panel]
  np.testing.assert_array_equal(truth[48, 48], part_names.group_colors(3)[1])
  np.testing.assert_array_equal(truth[144, 144], part_names.BACKGROUND_COLOR)
  legend = image[gap + 3 * panel + 3 * gap:]
  for color in part_names.group_colors(3):
    assert _has_block(legend, color)


def test_evaluate_names_the_overlay_parts_by_their_best_keypoint_match(monkeypatch):
  """The overlay's legend: "part k (≈ group)" from the whole evaluation set's contingency; the
  part that holds no keypoint stays "part k" (never a ground-truth name of its own)."""
  rng = np.random.default_rng(2)
  n, parts = 4, 4
  keypoints = np.broadcast_to(np.array([[4, 4], [28, 4], [4, 28]], np.float32), (n, 3, 2)).copy()
  labels = (rng.random((n, 2)) < 0.5).astype(np.float32)
  batch = _predictions(rng, _quadrant_maps(n, parts), keypoints, np.ones((n, 3), bool),
                       rng.normal(size=(n, 2)), labels)
  seen = {}
  real = evaluate.part_overlay
  monkeypatch.setattr(evaluate, "part_overlay",
                      lambda *a, **kw: seen.update(kw) or real(*a, **kw))
  out = evaluate.evaluate(lambda b: b, [batch], image_mean=(0.5,) * 3, image_std=(0.25,) * 3,
                          num_images=2, keypoint_group_names=("beak", "wing", "tail"))
  assert seen["part_names"] == ["part 1 (≈ beak)", "part 2 (≈ wing)", "part 3 (≈ tail)", "part 4"]
  assert seen["group_names"] == ["beak", "wing", "tail"] and len(seen["keypoints"]) == 2
  assert out["image"].dtype == np.uint8
  unnamed = evaluate.evaluate(lambda b: b, [batch], image_mean=(0.5,) * 3, image_std=(0.25,) * 3,
                              num_images=1)
  assert seen["part_names"][0] == "part 1 (≈ group 1)" and unnamed["image"].ndim == 3
  assert evaluate.evaluate(lambda b: b, [batch], image_mean=(0.5,) * 3, image_std=(0.25,) * 3,
                           num_images=0)["image"] is None


def test_evaluate_measures_mask_coverage_on_the_patch_grid_by_plurality():
  """parts/coverage*, parts/area_ratio*: the segmentation (pixels) meets the maps' 4 x 4 grid of
  8-px patches; part k of `_quadrant_maps` holds quadrant k, the background the last one."""
  rng = np.random.default_rng(3)
  n, parts = 2, 4
  segmentation = np.zeros((n, 32, 32), np.uint8)
  segmentation[:, :16, :] = 1  # true part 0: the top half, 8 patches
  segmentation[:, 16:24, :16] = 2  # true part 1: 2 patches in channel 2's quadrant...
  # ...and 24 of the 64 pixels of the patch below: the background's by plurality (the
  # "foreground" rule would make it part 1's, coverage 1 and area ratio 4/3 instead).
  segmentation[:, 24:27, :8] = 2
  labels = (rng.random((n, 2)) < 0.5).astype(np.float32)
  batch = _predictions(rng, _quadrant_maps(n, parts), np.zeros((n, 3, 2), np.float32),
                       np.ones((n, 3), bool), rng.normal(size=(n, 2)), labels)
  batch["part_segmentation"] = segmentation
  halves = [{k: (v[:1] if isinstance(v, np.ndarray) else {h: x[:1] for h, x in v.items()})
             for k, v in batch.items()},
            {k: (v[1:] if isinstance(v, np.ndarray) else {h: x[1:] for h, x in v.items()})
             for k, v in batch.items()}]
  scalars = evaluate.evaluate(lambda b: b, halves, image_mean=(0.5,) * 3, image_std=(0.25,) * 3,
                              num_images=0, num_true_parts=3)["scalars"]
  # True part 0: channels 0 and 1 hold 4 of its 8 patches each (the tie goes to channel 0,
  # which holds nothing else): half covered, half the area. True part 1: channel 2 holds both
  # its patches and 2 background ones: fully covered, twice the area. True part 2 has no patch.
  assert scalars["parts/best_part/0"] == 0 and scalars["parts/best_part/1"] == 2
  assert np.isnan(scalars["parts/best_part/2"])
  assert scalars["parts/coverage/0"] == pytest.approx(0.5)
  assert scalars["parts/area_ratio/0"] == pytest.approx(0.5)
  assert scalars["parts/coverage/1"] == pytest.approx(1.0)
  assert scalars["parts/area_ratio/1"] == pytest.approx(2.0)
  assert np.isnan(scalars["parts/coverage/2"]) and np.isnan(scalars["parts/area_ratio/2"])
  assert scalars["parts/coverage"] == pytest.approx(0.75)
  assert scalars["parts/area_ratio"] == pytest.approx(1.25)
  # Padding rows do not count.
  padded = dict(batch, valid=np.array([True, False]))
  one = evaluate.evaluate(lambda b: b, [padded], image_mean=(0.5,) * 3, image_std=(0.25,) * 3,
                          num_images=0, num_true_parts=3)["scalars"]
  assert one["parts/coverage/0"] == pytest.approx(0.5) and one["num_examples"] == 1
  # Without the number of true parts (a dataset without segmentation), no coverage.
  none = evaluate.evaluate(lambda b: b, [batch], image_mean=(0.5,) * 3, image_std=(0.25,) * 3,
                           num_images=0)["scalars"]
  assert not any(k.startswith(("parts/coverage", "parts/area_ratio")) for k in none)
  report = evaluate.report_markdown(scalars, [], title="t", step=1, total_steps=1,
                                    true_part_names=("head", "body", "tail"))
  assert "| head | part 1 | 0.500 | 0.500 |" in report
  assert "| body | part 3 | 1.000 | 2.000 |" in report and "| tail | n/a | n/a | n/a |" in report
  assert "| mean over the true parts | | 0.750 | 1.250 |" in report
