"""The trainer's periodic evaluation: keypoint reading, metrics, the part-map overlay."""

import jax
import jax.numpy as jnp
import numpy as np
from sklearn import metrics as skm

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
  assert image.dtype == np.uint8 and image.shape == (2 * 128, 2 * 128, 3)
