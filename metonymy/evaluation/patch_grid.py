"""Part labels on a ViT's patch grid: a pixel part map's labels per patch, and the patch ids the
backbone sees. Shared by the leakage benchmark, the trainers' evaluation and the stand-in's
token-geometry measures.

Partial patches (`patch_part_ids`): the backbone sees one part id per patch. Rule "plurality"
(default): a patch belongs to the label (part or background) covering the most of its pixels;
ties go to the lowest id, so a foreground part wins a tie with the background (id K). Rule
"foreground": a patch with any foreground pixel belongs to the foreground part covering the most
of its pixels (ties to the lowest id); only all-background patches are background.
"""

from typing import Tuple

import numpy as np

PATCH_RULES = ("plurality", "foreground")


def patch_counts(labels: np.ndarray, num_parts: int, patch_size: int) -> np.ndarray:
  """Pixels of every label in every patch.

  Args:
    labels: int [B, H, W] in [0, K]; H and W multiples of patch_size.
    num_parts: K.
    patch_size: p.

  Returns:
    int32 [B, H / p, W / p, K + 1].
  """
  labels = np.asarray(labels)
  b, h, w = labels.shape
  if h % patch_size or w % patch_size:
    raise ValueError(f"part maps of {h}x{w} pixels do not tile into {patch_size}-pixel patches")
  if labels.size and (labels.min() < 0 or labels.max() > num_parts):
    raise ValueError(f"part labels must lie in [0, {num_parts}], got "
                     f"[{labels.min()}, {labels.max()}]")
  gh, gw = h // patch_size, w // patch_size
  rows = np.arange(h) // patch_size
  cols = np.arange(w) // patch_size
  cell = (np.arange(b)[:, None, None] * gh + rows[None, :, None]) * gw + cols[None, None, :]
  flat = cell.astype(np.int64) * (num_parts + 1) + labels.astype(np.int64)
  counts = np.bincount(flat.ravel(), minlength=b * gh * gw * (num_parts + 1))
  return counts.reshape(b, gh, gw, num_parts + 1).astype(np.int32)


def patch_part_ids(labels: np.ndarray, num_parts: int, patch_size: int,
                   rule: str = "plurality") -> Tuple[np.ndarray, np.ndarray]:
  """Part id of every patch under `rule` (see the module docstring), and pixel coverage.

  Returns:
    (int32 part ids [B, h, w] in [0, K], float32 coverage [B, h, w, K + 1]: the fraction of the
    patch's pixels carrying each label).
  """
  if rule not in PATCH_RULES:
    raise ValueError(f"patch rule must be one of {PATCH_RULES}, got {rule!r}")
  counts = patch_counts(labels, num_parts, patch_size)
  coverage = (counts / float(patch_size * patch_size)).astype(np.float32)
  if rule == "plurality":
    ids = np.argmax(counts, axis=-1)
  else:
    fg = counts[..., :num_parts]
    ids = np.where(fg.sum(-1) > 0, np.argmax(fg, axis=-1), num_parts)
  return ids.astype(np.int32), coverage


def segmentation_part_labels(segmentation: np.ndarray, num_parts: int) -> np.ndarray:
  """A `part_segmentation` (0 = background, g + 1 = part g) as part labels with the background
  last, as everywhere else here: int32 [..., H, W] in [0, K], K = background."""
  seg = np.asarray(segmentation).astype(np.int32)
  if seg.max(initial=0) > num_parts:
    raise ValueError(f"part_segmentation holds label {seg.max()} but the dataset has "
                     f"{num_parts} keypoint groups")
  return np.where(seg == 0, num_parts, seg - 1).astype(np.int32)


def nearest_index(n_in: int, n_out: int) -> np.ndarray:
  """int64 [n_out]: the input pixel each of n_out output pixels samples (its centre's)."""
  return np.minimum(((np.arange(n_out) + 0.5) * n_in / n_out).astype(np.int64), n_in - 1)


def resize_nearest(maps: np.ndarray, size: Tuple[int, int]) -> np.ndarray:
  """Nearest-neighbour resize of [..., h, w] to [..., H, W] (pixel-centre sampling): the one
  resize of label maps and masks (part maps, segmentations, CheXlocalize masks)."""
  h, w = maps.shape[-2:]
  if (h, w) == tuple(size):
    return maps
  rows, cols = nearest_index(h, size[0]), nearest_index(w, size[1])
  return maps[..., rows[:, None], cols[None, :]]
