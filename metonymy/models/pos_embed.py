"""Position encodings: absolute-table resizing that matches PyTorch, and DINOv3's 2D RoPE.

The resize is written as two static interpolation matrices (rows, then columns), built in NumPy
from the exact formulas of `torch.nn.functional.interpolate(mode="bicubic")`, so a checkpoint's
table is resized the way its own reference code does it, with no torch at run time. Which
reference to follow is a `ResizeMode`:

  * "scale_offset": `scale_factor=((h + 0.1) / h0, (w + 0.1) / w0)`, no antialias: the original
    DINOv1 and DINOv2 (without registers) code. The 0.1 shifts every sample point.
  * "size":  `size=(h, w)`, no antialias: Hugging Face ViT / DINOv2 / CLIP, the MAE fine-tuning util.
  * "size_antialias": `size=(h, w)`, `antialias=True`: timm, and the original DINOv2 with registers.

Getting the mode wrong moves outputs by 0.1-0.24 on real weights, so it is part of the config.
"""

import functools
import math
from typing import Literal, Optional, Sequence, Tuple

import jax.numpy as jnp
import numpy as np

ResizeMode = Literal["scale_offset", "size", "size_antialias"]
RESIZE_MODES = ("scale_offset", "size", "size_antialias")


def _cubic_weights(t: np.ndarray, a: float) -> np.ndarray:
  """Keys cubic convolution weights for the 4 taps at offsets -1, 0, 1, 2. t: [n] in [0, 1)."""
  def near(x):  # |x| <= 1
    return ((a + 2) * x - (a + 3)) * x * x + 1

  def far(x):  # 1 < |x| < 2
    return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

  return np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], axis=-1)


@functools.lru_cache(maxsize=256)
def bicubic_matrix(in_size: int, out_size: int, scale: Optional[float] = None,
                   antialias: bool = False) -> np.ndarray:
  """The [out_size, in_size] matrix of 1D torch bicubic interpolation (align_corners=False).

  Args:
    in_size, out_size: lengths along one axis.
    scale: the input/output ratio torch uses for coordinates. `None` means `in_size / out_size`
      (the `size=` call); with `scale_factor=s` torch uses `1 / s`, which differs from the size
      ratio when `in * s` is not an integer (the DINO 0.1 offset relies on exactly this).
    antialias: torch's separate antialiased kernel (Keys a=-0.5, support widened when
      downsampling, weights renormalized, window truncated at the borders).
  """
  if scale is None:
    scale = in_size / out_size
  matrix = np.zeros((out_size, in_size), np.float64)
  if not antialias:
    # aten/src/ATen/native/UpSample.h: area_pixel_compute_source_index(cubic=True), A = -0.75,
    # computed in the input's precision (float32 here).
    scale32 = np.float32(scale)
    source = scale32 * (np.arange(out_size, dtype=np.float32) + np.float32(0.5)) - np.float32(0.5)
    base = np.floor(source)
    t = (source - base).astype(np.float32)
    weights = _cubic_weights(t.astype(np.float64), -0.75).astype(np.float32)
    for tap in range(4):
      index = np.clip(base.astype(np.int64) - 1 + tap, 0, in_size - 1)
      np.add.at(matrix, (np.arange(out_size), index), weights[:, tap])
    return matrix.astype(np.float32)
  # aten/src/ATen/native/cpu/UpSampleKernel.cpp: _compute_indices_min_size_weights_aa.
  support = 2.0 * scale if scale >= 1.0 else 2.0
  inv_scale = 1.0 / scale if scale >= 1.0 else 1.0
  for i in range(out_size):
    center = scale * (i + 0.5)
    lo = max(int(center - support + 0.5), 0)
    hi = min(int(center + support + 0.5), in_size)
    x = (np.arange(lo, hi) - center + 0.5) * inv_scale
    ax = np.abs(x)
    w = np.where(ax <= 1, ((1.5 * ax - 2.5) * ax) * ax + 1,
                 np.where(ax < 2, ((-0.5 * ax + 2.5) * ax - 4) * ax + 2, 0.0))
    total = w.sum()
    matrix[i, lo:hi] = w / total if total != 0 else w
  return matrix.astype(np.float32)


def resize_matrices(old_grid: Tuple[int, int], new_grid: Tuple[int, int],
                    mode: ResizeMode) -> Tuple[np.ndarray, np.ndarray]:
  """The row and column matrices ([h, h0], [w, w0]) that take an [h0, w0] grid to [h, w]."""
  if mode not in RESIZE_MODES:
    raise ValueError(f"Unknown position-embedding resize mode {mode!r}; expected one of {RESIZE_MODES}.")
  (h0, w0), (h, w) = old_grid, new_grid
  if mode == "scale_offset":
    # The reference calls interpolate(scale_factor=((h + 0.1) / h0, (w + 0.1) / w0)); torch takes
    # the output size as floor(in * s) and the coordinate ratio as 1 / s.
    sy, sx = (h + 0.1) / h0, (w + 0.1) / w0
    if math.floor(h0 * sy) != h or math.floor(w0 * sx) != w:
      raise AssertionError("scale_offset resize would not produce the requested grid")
    return (bicubic_matrix(h0, h, 1.0 / sy), bicubic_matrix(w0, w, 1.0 / sx))
  antialias = mode == "size_antialias"
  return (bicubic_matrix(h0, h, None, antialias), bicubic_matrix(w0, w, None, antialias))


def resize_grid_embedding(table: jnp.ndarray, old_grid: Sequence[int], new_grid: Sequence[int],
                          mode: ResizeMode) -> jnp.ndarray:
  """Resizes a patch position table [..., h0 * w0, D] to [..., h * w, D] (row-major grids)."""
  old_grid, new_grid = tuple(old_grid), tuple(new_grid)
  if old_grid == new_grid:
    return table
  rows, cols = resize_matrices(old_grid, new_grid, mode)
  grid = table.reshape(table.shape[:-2] + old_grid + table.shape[-1:])
  out = jnp.einsum("yi,...ijd->...yjd", rows, grid, precision="highest")
  out = jnp.einsum("xj,...yjd->...yxd", cols, out, precision="highest")
  return out.reshape(table.shape[:-2] + (new_grid[0] * new_grid[1], table.shape[-1]))


def rope_periods(head_dim: int, base: float = 100.0) -> Tuple[float, ...]:
  """DINOv3's RoPE periods, `base ** (2 * arange(head_dim // 4) / (head_dim // 2))`, in float32."""
  exponents = 2 * np.arange(head_dim // 4, dtype=np.float32) / np.float32(head_dim // 2)
  return tuple(float(p) for p in np.float32(base) ** exponents)


def rope_sin_cos(grid: Tuple[int, int], periods: Sequence[float]) -> Tuple[np.ndarray, np.ndarray]:
  """DINOv3 2D RoPE tables for a patch grid, each [h * w, head_dim], float32.

  y and x are normalized separately to (-1, 1) at patch centres; the rotary angles are 16 from y
  then 16 from x (for head_dim 64), tiled twice. Pure NumPy: grids are static, so the tables are
  constants of the compiled program.
  """
  h, w = grid
  periods = np.asarray(periods, np.float32)
  ys = (np.arange(h, dtype=np.float32) + np.float32(0.5)) / np.float32(h)
  xs = (np.arange(w, dtype=np.float32) + np.float32(0.5)) / np.float32(w)
  coords = np.stack(np.meshgrid(ys, xs, indexing="ij"), axis=-1).reshape(-1, 2)
  coords = np.float32(2.0) * coords - np.float32(1.0)
  angles = np.float32(2 * math.pi) * coords[:, :, None] / periods[None, None, :]
  angles = angles.reshape(h * w, -1)
  angles = np.tile(angles, (1, 2))
  return np.sin(angles).astype(np.float32), np.cos(angles).astype(np.float32)


def apply_rope(x: jnp.ndarray, sin: jnp.ndarray, cos: jnp.ndarray) -> jnp.ndarray:
  """Rotates x [B, N, heads, head_dim] by `x cos + rotate_half(x) sin`.

  sin, cos: [N, head_dim], or [B, N, head_dim] when each example keeps its own patch subset.
  """
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  if sin.ndim == 2:
    sin, cos = sin[None], cos[None]
  sin = sin[:, :, None, :].astype(x.dtype)
  cos = cos[:, :, None, :].astype(x.dtype)
  return x * cos + rotated * sin
