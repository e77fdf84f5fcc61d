"""A part-discovery model trained in a workdir, read back: its part maps, part ids on any
patch grid, pixel labels at any image size, and (two-stage) Stage 2's isolated part features.
Made by `metonymy.loading.load_trained_part_model(workdir)`; the leakage benchmark's
`masks.source="stage1"`, the Table-3 figure, the part-map export and the notebook use it."""

from typing import Any, Dict, Optional, Tuple

import jax
import jax.numpy as jnp

from metonymy.models import part_model


class TrainedPartModel:
  """Part maps and part ids of a trained Stage-1 or two-stage model.

    masks = loading.load_trained_part_model("workdirs/cub_single")  # latest checkpoint
    maps = masks.maps(images)                      # float32 [B, K+1, h, w], background last
    ids = masks.part_ids(images)                   # int32 [B, h, w] in [0, K], K = background
    ids = masks.part_ids(images, grid=(16, 16))    # on another backbone's patch grid
    labels, fg = masks.pixel_labels(images, mean, std)  # int32 [B, H, W] at the images' size

  `images` are float32 [B, S, S, 3] at `image_size`, normalized with `image_mean`/`image_std`
  (Stage 1's backbone); `renormalize` converts images normalized for another backbone, and
  `pixel_maps` / `pixel_labels` take images of any size and normalization (the benchmark's).
  Evaluation mode: no Gumbel noise, so the ids are a deterministic function of the image.
  """

  def __init__(self, model: part_model.PartModel, params, frozen, meta: Dict[str, Any]):
    self.model, self.params, self.frozen, self.meta = model, params, frozen, meta
    cfg = model.backbone.config
    self.image_size = int(meta.get("image_size") or cfg.image_size)
    self.image_mean, self.image_std = tuple(cfg.image_mean), tuple(cfg.image_std)
    self.num_parts = model.num_parts
    self._maps = jax.jit(lambda p, f, x: model.part_maps(p, f, x, train=False))

  def part_features(self, images: jnp.ndarray) -> jnp.ndarray:
    """Stage 2's isolated part features [B, K+1, D] of a two-stage checkpoint (images
    normalized with Stage 1's mean/std, at `image_size`)."""
    if not hasattr(self.model, "part_features"):
      raise ValueError(f"{type(self.model).__name__} has no Stage-2 part features; train a "
                       "two-stage model (configs/*_{soft,hard,ste}.py).")
    return self.model.part_features(self.params, self.frozen, jnp.asarray(images, jnp.float32))

  def renormalize(self, images: jnp.ndarray, mean, std) -> jnp.ndarray:
    """Images normalized with (mean, std) -> normalized with Stage 1's (image_mean, image_std)."""
    mean, std = jnp.asarray(mean, jnp.float32), jnp.asarray(std, jnp.float32)
    raw = images * std + mean
    return (raw - jnp.asarray(self.image_mean)) / jnp.asarray(self.image_std)

  def maps(self, images: jnp.ndarray) -> jnp.ndarray:
    """float32 [B, K+1, h, w] on Stage 1's patch grid, summing to 1 over parts."""
    if images.ndim != 4 or images.shape[-1] != 3:
      raise ValueError(f"images must be [B, H, W, 3], got {images.shape}")
    return self._maps(self.params, self.frozen, jnp.asarray(images, jnp.float32))

  def pixel_maps(self, images: jnp.ndarray, mean=None, std=None) -> jnp.ndarray:
    """float32 [B, K+1, H, W]: the maps of images [B, H, W, 3] at the images' own resolution.

    mean, std: the normalization `images` carry, if not Stage 1's (e.g. the leakage benchmark's
    backbone's). Images of another size are resized (bilinear) to `image_size` for Stage 1, and
    the maps resized bilinearly back to H x W.
    """
    images = jnp.asarray(images, jnp.float32)
    if mean is not None or std is not None:
      images = self.renormalize(images, self.image_mean if mean is None else mean,
                                self.image_std if std is None else std)
    batch, height, width = images.shape[:3]
    size = self.image_size
    if (height, width) != (size, size):
      images = jax.image.resize(images, (batch, size, size, 3), "bilinear")
    maps = self.maps(images)
    return jax.image.resize(maps, maps.shape[:2] + (height, width), "bilinear")

  def pixel_labels(self, images: jnp.ndarray, mean=None, std=None):
    """(labels, foreground), int32 [B, H, W] each: the argmax over all K+1 pixel maps (K =
    background) and over the K foreground maps alone. The leakage benchmark's mask-source form
    (metonymy/probe/masks.py `PartMaps`)."""
    maps = self.pixel_maps(images, mean, std)
    return (jnp.argmax(maps, axis=1).astype(jnp.int32),
            jnp.argmax(maps[:, :-1], axis=1).astype(jnp.int32))

  def part_ids(self, images: jnp.ndarray, grid: Optional[Tuple[int, int]] = None) -> jnp.ndarray:
    """int32 [B, h, w]: the argmax part of every patch, K = background.

    grid: another patch grid (h', w'); the probabilities are resized bilinearly (half-pixel
    centres, antialiased when shrinking) before the argmax, so a patch of the target grid takes
    the part with the most mass over its footprint.
    """
    maps = self.maps(images)
    if grid is not None and tuple(grid) != maps.shape[-2:]:
      maps = jax.image.resize(maps, maps.shape[:2] + tuple(grid), "bilinear")
    return jnp.argmax(maps, axis=1).astype(jnp.int32)
