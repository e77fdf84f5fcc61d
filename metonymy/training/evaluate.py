"""Periodic evaluation during training: attribute mAP/AUROC, part NMI/ARI, part-map PNGs.

The metrics are the leakage benchmark's (metonymy/evaluation/), so training and benchmark
numbers follow one protocol:
  <head>/mAP, <head>/AUROC   mean over attributes of average precision / ROC AUC, over the valid
                              labels of real (non-padding) examples; an attribute without a
                              positive (mAP) or without both classes (AUROC) is skipped. Heads
                              are the model's logits entries, plus "ensemble" (their sum) when
                              there are several (Table S6).
  <head>/bce                  the attribute BCE
  parts/NMI, parts/ARI        PDiscoFormer's protocol against the merged keypoint groups: the maps
                              upsampled bilinearly to the image, read at the pixel of each visible
                              keypoint, argmax over all K+1 channels (background is a cluster);
                              ground truth = the keypoint's group; pooled over the split; x100
  parts/NMI_fg, parts/ARI_fg  the same with the argmax over the K foreground channels (MPAE)
"""

from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

import numpy as np

from metonymy.evaluation import metrics
from metonymy.evaluation import part_metrics


def sample_at_keypoints(maps: np.ndarray, keypoints: np.ndarray, image_hw: Sequence[int]) -> np.ndarray:
  """Maps [B, C, h, w] read at keypoints [B, G, 2] ((x, y) pixels of an H x W image) -> [B, G, C].

  Equals upsampling the maps bilinearly to H x W (half-pixel centres, edges clamped) and reading
  the pixel that holds each keypoint.
  """
  batch, channels, height, width = maps.shape
  image_h, image_w = image_hw
  col = (np.floor(keypoints[..., 0]) + 0.5) * width / image_w - 0.5
  row = (np.floor(keypoints[..., 1]) + 0.5) * height / image_h - 0.5
  col = np.clip(col, 0, width - 1)
  row = np.clip(row, 0, height - 1)
  c0, r0 = np.floor(col).astype(np.int64), np.floor(row).astype(np.int64)
  c1, r1 = np.minimum(c0 + 1, width - 1), np.minimum(r0 + 1, height - 1)
  fc, fr = (col - c0)[..., None], (row - r0)[..., None]
  b = np.arange(batch)[:, None]
  # Advanced indices split by a slice put their broadcast dims first: [B, G, C].
  read = lambda r, c: maps[b, :, r, c]
  top = read(r0, c0) * (1 - fc) + read(r0, c1) * fc
  bottom = read(r1, c0) * (1 - fc) + read(r1, c1) * fc
  return top * (1 - fr) + bottom * fr


def attribute_metrics(logits: np.ndarray, labels: np.ndarray, valid: np.ndarray) -> Dict[str, float]:
  """mAP and AUROC (in [0, 1]) over attributes, and the mean BCE, of logits [N, A]."""
  weights = valid.astype(np.float64)
  ap = metrics.average_precision(logits, labels, weights)
  auc = metrics.roc_auc(logits, labels, weights)
  p = np.clip(1 / (1 + np.exp(-logits.astype(np.float64))), 1e-12, 1 - 1e-12)
  bce = -(labels * np.log(p) + (1 - labels) * np.log(1 - p))
  nanmean = lambda x: float(np.nanmean(x)) if np.isfinite(x).any() else float("nan")
  return {"mAP": nanmean(ap), "AUROC": nanmean(auc),
          "bce": float(np.sum(bce * valid) / max(valid.sum(), 1))}


def part_overlay(images: np.ndarray, maps: np.ndarray, mean, std) -> np.ndarray:
  """uint8 [2 S z, n S z, 3]: the images (top row) and their argmax part maps over them (bottom;
  background left uncoloured), zoomed by an integer z so small images are at least 128 px.
  images [n, S, S, 3] normalized; maps [n, K+1, h, w]."""
  from matplotlib import colormaps
  images = np.clip((images * np.asarray(std) + np.asarray(mean)) * 255, 0, 255)
  n, size_h, size_w = images.shape[:3]
  groups = maps.shape[1]
  ids = np.argmax(maps, axis=1)
  ids = ids.repeat(size_h // ids.shape[1], 1).repeat(size_w // ids.shape[2], 2)
  palette = np.asarray(colormaps["tab10" if groups <= 11 else "tab20"].colors)[:, :3] * 255
  colors = palette[ids % len(palette)]
  foreground = (ids < groups - 1)[..., None]
  overlay = np.where(foreground, 0.45 * images + 0.55 * colors, 0.6 * images)
  top = np.concatenate(list(images), axis=1)
  bottom = np.concatenate(list(overlay), axis=1)
  grid = np.concatenate([top, bottom], axis=0).astype(np.uint8)
  zoom = max(1, 128 // max(size_h, size_w))  # Smoke-run images are tiny: make them viewable.
  return grid.repeat(zoom, 0).repeat(zoom, 1)


def evaluate(predict: Callable[[Dict[str, np.ndarray]], Dict[str, Any]],
             batches: Iterable[Dict[str, np.ndarray]], *, image_mean, image_std,
             num_images: int = 8) -> Dict[str, Any]:
  """Runs `predict` over the evaluation batches and computes the metrics above.

  Args:
    predict: host batch -> {"maps": [B, K+1, h, w], "logits": {head: [B, A]}} plus the batch's
      own `valid`, `attributes`, `attribute_valid` and, when the dataset has them, `keypoints`
      and `keypoint_visible`, for every example of the global batch (as NumPy arrays).
    batches: this process's evaluation batches (padded ones carry valid = False).

  Returns:
    {"scalars": {name: float}, "image": uint8 overlay of the first images or None}.
  """
  logits: Dict[str, List[np.ndarray]] = {}
  labels, label_valid = [], []
  parts_all, parts_fg = [], []  # int [S, G]: the part under each keypoint, -1 if not visible
  num_parts = None
  overlay: Optional[np.ndarray] = None
  for host_batch in batches:
    out = predict(host_batch)
    valid = np.asarray(out["valid"], bool)
    for head, value in out["logits"].items():
      logits.setdefault(head, []).append(np.asarray(value, np.float64)[valid])
    labels.append(np.asarray(out["attributes"])[valid])
    label_valid.append(np.asarray(out["attribute_valid"], bool)[valid])
    maps = np.asarray(out["maps"], np.float32)
    num_parts = maps.shape[1] - 1
    if "keypoints" in out:
      image_hw = np.shape(host_batch["image"])[1:3]
      read = sample_at_keypoints(maps[valid], np.asarray(out["keypoints"])[valid], image_hw)
      visible = np.asarray(out["keypoint_visible"], bool)[valid]
      parts_all.append(np.where(visible, np.argmax(read, -1), part_metrics.INVISIBLE))
      parts_fg.append(np.where(visible, np.argmax(read[..., :-1], -1), part_metrics.INVISIBLE))
    if overlay is None and num_images:
      local = np.asarray(host_batch["image"])[:num_images]
      # The global batch's first rows are this process's first examples on process 0.
      overlay = part_overlay(local, maps[:len(local)], image_mean, image_std)
  if not labels:
    raise ValueError("evaluation got no batches")
  labels_np, valid_np = np.concatenate(labels), np.concatenate(label_valid)
  heads = {head: np.concatenate(chunks) for head, chunks in logits.items()}
  if len(heads) > 1:
    heads["ensemble"] = sum(heads.values())
  scalars = {}
  for head, head_logits in heads.items():
    for name, value in attribute_metrics(head_logits, labels_np, valid_np).items():
      scalars[f"{head}/{name}"] = value
  if parts_all:
    kp_all, kp_fg = np.concatenate(parts_all), np.concatenate(parts_fg)
    with_bg = part_metrics.keypoint_nmi_ari(kp_all, num_parts, include_background=True)
    fg_only = part_metrics.keypoint_nmi_ari(kp_all, num_parts, include_background=False,
                                            keypoint_part_foreground=kp_fg)
    scalars.update({"parts/NMI": with_bg["nmi"], "parts/ARI": with_bg["ari"],
                    "parts/NMI_fg": fg_only["nmi"], "parts/ARI_fg": fg_only["ari"],
                    "parts/num_keypoints": with_bg["num_points"]})
  scalars["num_examples"] = float(len(labels_np))
  return {"scalars": scalars, "image": overlay}
