"""Does a backbone's patch-token geometry hold the parts? The measures a stand-in for DINO is
chosen by: what Stage 1 can find in its tokens, measured against the true parts it never saw.

On held-out images with a part segmentation, each patch labelled with its plurality part
(patch_grid.py; K parts + background), the first `fit_fraction` of the images fit and the rest
score:

  kmeans_fg/NMI[/block<i>]   k-means with K clusters on the foreground tokens (after block i, each
                              token standardised; the last block's output after the final norm as
                              it is), x100 against the true parts: are the parts what dominates
                              the tokens' geometry? `kmeans_fg/NMI` is the last block's.
  position_fg/NMI            the same k-means on the foreground patches' (row, column) alone: what
                              place in the frame says, the chance level of the above.
  part_probe/balanced_accuracy  a logistic probe from one last-block token to its label (linear
                              legibility); part_probe/chance = 1 / (K + 1).
  cls_probe/mAP              attribute linear probes (ridge regression, `ridge_probe_scores`) on
                              the frozen CLS token, fit and scored on the same split of the images;
                              cls_probe/chance: a constant score's mAP.
  pooled_probe/mAP           the same probes on the mean of the frozen last block's patch tokens
                              (every patch: no part or object mask), the other image-level read-out
                              of a ViT; its chance is cls_probe/chance.
"""

from typing import Callable, Dict, Optional

import numpy as np
from sklearn import cluster
from sklearn import linear_model
from sklearn import metrics as sk_metrics

from metonymy.evaluation import metrics
from metonymy.evaluation import patch_grid


def _standardised(tokens: np.ndarray) -> np.ndarray:
  # Intermediate blocks' tokens have no final norm; per-token standardisation makes their
  # k-means comparable with the last block's (which LayerNorm already standardised).
  tokens = tokens - tokens.mean(-1, keepdims=True)
  return tokens / (tokens.std(-1, keepdims=True) + 1e-6)


def _kmeans_nmi(features: np.ndarray, labels: np.ndarray, fit: np.ndarray, clusters: int,
                seed: int) -> float:
  kmeans = cluster.KMeans(clusters, n_init=3, random_state=seed).fit(features[fit])
  return 100.0 * float(sk_metrics.normalized_mutual_info_score(
      labels[~fit], kmeans.predict(features[~fit])))


def ridge_probe_scores(features: np.ndarray, labels: np.ndarray, valid: np.ndarray,
                       held_out: np.ndarray, ridge: float = 1.0) -> np.ndarray:
  """Linear probes of every attribute at once: ridge regression of the +-1 labels [N, A] on the
  standardised features [N, D] (one closed-form solve; an unknown label weighs 0), scores of
  `held_out` [M, D] -> [M, A]. AP only ranks the scores, so a least-squares probe serves."""
  mean, std = features.mean(0), features.std(0) + 1e-6
  x = np.concatenate([(features - mean) / std, np.ones((len(features), 1))], 1).astype(np.float64)
  z = np.concatenate([(held_out - mean) / std, np.ones((len(held_out), 1))], 1)
  targets = (2.0 * labels - 1.0) * valid
  scores = np.zeros((len(held_out), labels.shape[1]), np.float32)
  penalty = ridge * len(x) * np.eye(x.shape[1])
  for a in range(labels.shape[1]):  # Each attribute over its own known labels.
    w = valid[:, a][:, None]
    scores[:, a] = z @ np.linalg.solve(x.T @ (w * x) + penalty, x.T @ (w[:, 0] * targets[:, a]))
  return scores


def token_geometry(forward: Callable[[np.ndarray], Dict[str, np.ndarray]], images: np.ndarray,
                   part_segmentation: np.ndarray, num_parts: int, patch_size: int, *,
                   attributes: Optional[np.ndarray] = None,
                   attribute_valid: Optional[np.ndarray] = None, fit_fraction: float = 0.625,
                   batch_size: int = 100, per_block: bool = True,
                   seed: int = 0) -> Dict[str, float]:
  """The measures of the module docstring.

  Args:
    forward: images [b, H, W, 3] -> the backbone's output dict (`prefix_tokens` [b, P, D],
      `patch_tokens` [b, N, D] and, for `per_block`, `intermediates`: per block [b, P + N, D]).
    images: [M, H, W, 3] normalised; part_segmentation: [M, H, W] (0 = background, g + 1 = g).
    attributes, attribute_valid: [M, A] image-level labels for the CLS and pooled-token probes
      (optional).
  """
  count = len(images)
  fit_images = int(count * fit_fraction)
  if not 0 < fit_images < count:
    raise ValueError(f"token_geometry needs images to fit and to score; got {count} images and "
                     f"fit_fraction {fit_fraction}")
  labels = patch_grid.segmentation_part_labels(part_segmentation, num_parts)
  ids, _ = patch_grid.patch_part_ids(labels, num_parts, patch_size)
  grid = ids.shape[1:]
  outputs = [forward(images[i:i + batch_size]) for i in range(0, count, batch_size)]
  gather = lambda f: np.concatenate([np.asarray(f(o)) for o in outputs])
  last = gather(lambda o: o["patch_tokens"])
  cls = gather(lambda o: o["prefix_tokens"][:, 0])
  num_patches, width = last.shape[1], last.shape[2]
  fit = np.repeat(np.arange(count) < fit_images, num_patches)
  flat_ids = ids.reshape(-1)
  foreground = flat_ids < num_parts
  result = {}
  nmi = lambda tokens: _kmeans_nmi(tokens.reshape(-1, width)[foreground], flat_ids[foreground],
                                   fit[foreground], num_parts, seed)
  result["kmeans_fg/NMI"] = nmi(last)
  if per_block and "intermediates" in outputs[0]:
    for block in range(len(outputs[0]["intermediates"])):
      tokens = gather(lambda o, b=block: o["intermediates"][b][:, -num_patches:])
      result[f"kmeans_fg/NMI/block{block + 1}"] = nmi(_standardised(tokens))
  rows, cols = np.meshgrid(np.arange(grid[0]), np.arange(grid[1]), indexing="ij")
  position = np.tile(np.stack([rows.ravel(), cols.ravel()], -1).astype(np.float32), (count, 1))
  result["position_fg/NMI"] = _kmeans_nmi(position[foreground], flat_ids[foreground],
                                          fit[foreground], num_parts, seed)
  tokens = last.reshape(-1, width)
  probe = linear_model.LogisticRegression(max_iter=500, class_weight="balanced")
  probe.fit(tokens[fit], flat_ids[fit])
  result["part_probe/balanced_accuracy"] = float(sk_metrics.balanced_accuracy_score(
      flat_ids[~fit], probe.predict(tokens[~fit])))
  result["part_probe/chance"] = 1.0 / (num_parts + 1)
  if attributes is not None:
    valid = np.ones_like(attributes) if attribute_valid is None else attribute_valid
    scores = ridge_probe_scores(cls[:fit_images], attributes[:fit_images], valid[:fit_images],
                                cls[fit_images:])
    held_out = attributes[fit_images:], valid[fit_images:]
    result["cls_probe/mAP"] = float(np.nanmean(metrics.average_precision(scores, *held_out)))
    pooled = last.mean(1)
    pooled_scores = ridge_probe_scores(pooled[:fit_images], attributes[:fit_images],
                                       valid[:fit_images], pooled[fit_images:])
    result["pooled_probe/mAP"] = float(np.nanmean(metrics.average_precision(pooled_scores,
                                                                             *held_out)))
    result["cls_probe/chance"] = float(np.nanmean(metrics.average_precision(
        np.zeros_like(scores), *held_out)))
  result["images"] = count
  return result
