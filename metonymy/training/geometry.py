"""Random affine warps of image and map batches in JAX, for the equivariance loss.

Coordinates are normalized per grid: the centre of pixel (row i, column j) of an n x m grid is
(x, y) = (2 (j + 0.5) / m - 1, 2 (i + 0.5) / n - 1), so (0, 0) is the image centre and +-1 its
edges, whatever the resolution. One transform therefore warps a 224-px image and its 16 x 16 map
grid consistently (what PDiscoFormer does by rescaling the translation to the map grid).

A transform `T = (angle, translation, scale)` maps a point p to `scale * R(angle) p + translation`
(x right, y down, so a positive angle turns clockwise on screen); `warp(x, T)` moves the content
of x by T: out(T p) = x(p). Grids are assumed square (a rotation of a non-square grid in
normalized units would shear it).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Affine(NamedTuple):
  """One similarity transform, as float32 scalars: angle in radians, translation [2] as a
  fraction of the half-size (normalized units), scale."""
  angle: jnp.ndarray
  translation: jnp.ndarray
  scale: jnp.ndarray


def sample_affine(rng: jax.Array, max_degrees: float = 90.0, max_translate: float = 0.11,
                  scale_range=(0.8, 1.4)) -> Affine:
  """Angle ~ U(-max_degrees, max_degrees), translation ~ U(-max_translate, max_translate) of the
  image size per axis, scale ~ U(scale_range). PDiscoFormer's ranges are the defaults."""
  r_angle, r_shift, r_scale = jax.random.split(rng, 3)
  angle = jnp.deg2rad(jax.random.uniform(r_angle, (), minval=-max_degrees, maxval=max_degrees))
  # A shift of f * size is 2 f in normalized units (the image spans [-1, 1]).
  shift = 2.0 * jax.random.uniform(r_shift, (2,), minval=-max_translate, maxval=max_translate)
  scale = jax.random.uniform(r_scale, (), minval=scale_range[0], maxval=scale_range[1])
  return Affine(angle, shift, scale)


def inverse(transform: Affine) -> Affine:
  """T^-1: p = R(-angle) (q - t) / s = (1/s) R(-angle) q - (1/s) R(-angle) t."""
  angle, t, s = transform
  c, si = jnp.cos(-angle), jnp.sin(-angle)
  rt = jnp.stack([c * t[0] - si * t[1], si * t[0] + c * t[1]])
  return Affine(-angle, -rt / s, 1.0 / s)


def _apply(transform: Affine, x: jnp.ndarray, y: jnp.ndarray):
  angle, t, s = transform
  c, si = jnp.cos(angle), jnp.sin(angle)
  return s * (c * x - si * y) + t[0], s * (si * x + c * y) + t[1]


def warp(maps: jnp.ndarray, transform: Affine) -> jnp.ndarray:
  """Moves the content of `maps` [..., H, W] by `transform`: out(T p) = maps(p).

  Bilinear sampling; what comes from outside the input reads 0 (as torchvision's affine fills).
  Differentiable in `maps` (the transform is treated as data).
  """
  height, width = maps.shape[-2:]
  ys = 2.0 * (jnp.arange(height, dtype=jnp.float32) + 0.5) / height - 1.0
  xs = 2.0 * (jnp.arange(width, dtype=jnp.float32) + 0.5) / width - 1.0
  gy, gx = jnp.meshgrid(ys, xs, indexing="ij")
  # Each output pixel reads the input at T^-1 of its own position.
  sx, sy = _apply(inverse(transform), gx, gy)
  rows = (sy + 1.0) * height / 2.0 - 0.5
  cols = (sx + 1.0) * width / 2.0 - 0.5
  flat = maps.reshape((-1, height, width))
  sample = lambda m: jax.scipy.ndimage.map_coordinates(m, [rows, cols], order=1, mode="constant",
                                                       cval=0.0)
  return jax.vmap(sample)(flat).reshape(maps.shape)


def warp_images(images: jnp.ndarray, transform: Affine) -> jnp.ndarray:
  """`warp` for channels-last images [B, H, W, C]."""
  return jnp.moveaxis(warp(jnp.moveaxis(images, -1, -3), transform), -3, -1)
