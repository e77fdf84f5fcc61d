"""The causal leakage score (beyond the paper): how much part k's feature moves when everything
outside part k is replaced by another image.

For image x, donor image x' and part k, the hybrid keeps x on the patches assigned to part k and
takes x' everywhere else: x~ = m_k * x + (1 - m_k) * x', with m_k the pixels of part k's patches
(`masks.pixel_mask_of_patches`; patch-aligned, so it is exactly what early masking lets part k
see). Part masks are held fixed (they are an input of the measurement, not recomputed). Then

  leak_k(x) = ||v^k(x~) - v^k(x)||_2 / ||v^k(x)||_2,

averaged over the (image, part) pairs where part k has at least one patch. Under early masking
part k's tokens are a function of part k's pixels only, so the score is exactly 0 (bit-identical
features: both forwards run the same program on same-shape batches, with each image at the same
batch position); under late masking it is the share of the feature that comes from outside the
part. The donor of image i is the next real image of its batch (i + 1, cyclically), so donors are
other images of the same split, with their own objects.
"""

from typing import Callable, Dict, Mapping

import numpy as np

from metonymy.probe import masks as masks_lib


def donor_order(batch_size: int, num_valid: int) -> np.ndarray:
  """int [B]: the donor of row i is row (i + 1) mod num_valid among the first num_valid (real)
  rows; padding rows (i >= num_valid) are their own donors and are ignored by the caller."""
  if num_valid < 2:
    raise ValueError("causal leakage needs at least 2 real images per batch (donors)")
  rows = np.arange(batch_size)
  return np.where(rows < num_valid, (rows + 1) % num_valid, rows)


def hybrid_images(images: np.ndarray, part_ids: np.ndarray, part: int, patch_size: int,
                  donors: np.ndarray) -> np.ndarray:
  """[B, H, W, C]: each image kept on part `part`'s patches, its donor's pixels elsewhere."""
  keep = masks_lib.pixel_mask_of_patches(part_ids, part, patch_size)[..., None]
  return np.where(keep, images, images[donors])


def relative_change(reference: np.ndarray, changed: np.ndarray) -> np.ndarray:
  """||changed - reference|| / ||reference|| over the last axis (0 where both are 0)."""
  reference = np.asarray(reference, np.float64)
  diff = np.linalg.norm(np.asarray(changed, np.float64) - reference, axis=-1)
  norm = np.linalg.norm(reference, axis=-1)
  return np.where(norm > 0, diff / np.maximum(norm, 1e-300), np.where(diff > 0, np.inf, 0.0))


def batch_leakage(extractors: Mapping[str, Callable], params, images: np.ndarray,
                  part_ids: np.ndarray, coverage: np.ndarray, num_parts: int,
                  patch_size: int, num_valid: int = 0) -> Dict[str, Dict[str, np.ndarray]]:
  """Per (image, part) relative feature change under outside replacement, per masking.

  Args:
    extractors: masking -> fn(params, images, part_ids, coverage) -> (features [B, K, D],
      present [B, K]) (features.make_extractors).
    images: float [B, H, W, 3] (normalized).
    part_ids: int [B, h, w]; coverage: float [B, h, w, K + 1].
    num_valid: the real rows (the first ones; the rest is padding); 0 = all B, which must be >= 2.

  Returns:
    masking -> {"change": float [B, K], "present": bool [B, K], "max_abs": float [B, K] (the
    largest absolute coordinate change, to show early masking's exact zeros)}.
  """
  donors = donor_order(images.shape[0], num_valid or images.shape[0])
  out = {}
  for masking, fn in extractors.items():
    reference, present = fn(params, images, part_ids, coverage)
    reference = np.asarray(reference)
    change = np.zeros(present.shape, np.float64)
    max_abs = np.zeros(present.shape, np.float64)
    for k in range(num_parts):
      hybrid = hybrid_images(images, np.asarray(part_ids), k, patch_size, donors)
      moved, _ = fn(params, hybrid, part_ids, coverage)
      moved = np.asarray(moved)
      change[:, k] = relative_change(reference[:, k], moved[:, k])
      max_abs[:, k] = np.abs(moved[:, k].astype(np.float64) - reference[:, k]).max(-1)
    out[masking] = {"change": change, "present": np.asarray(present, bool), "max_abs": max_abs}
  return out
