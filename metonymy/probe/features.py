"""Part features of a frozen backbone: late masking and early masking (paper Sec. 5.2).

  late   one plain forward; part k's feature is the mask-weighted mean of the final (normed)
         patch tokens: v^k = sum_n w_nk z_n / sum_n w_nk, with w_nk = [part_ids_n == k] ("hard")
         or the fraction of patch n's pixels in part k ("coverage").
  early  one early-masked forward (K + 1 prefix copies, block-diagonal attention in every layer);
         part k's feature is its CLS copy ("cls") or the mean of its CLS and register copies
         ("cls_registers").

A part with no patch in an image has no late feature: it is 0 there and `present` is False. Its
early feature is still defined (the prefix copy attends only to itself) and image-independent.
"""

import functools
from typing import Callable, Dict

import jax
import jax.numpy as jnp

MASKINGS = ("late", "early")
PREFIX_MODES = ("cls", "cls_registers")
LATE_WEIGHTS = ("hard", "coverage")


def late_features(patch_tokens: jnp.ndarray, weights: jnp.ndarray):
  """Mask-weighted means of patch tokens.

  Args:
    patch_tokens: [B, N, D] final patch tokens.
    weights: [B, N, K] non-negative weights of every patch for every foreground part.

  Returns:
    features [B, K, D] (0 where a part has no weight), present bool [B, K].
  """
  mass = weights.sum(1)  # [B, K]
  summed = jnp.einsum("bnk,bnd->bkd", weights, patch_tokens)
  return summed / jnp.maximum(mass, 1e-12)[..., None], mass > 0


def early_features(part_tokens: jnp.ndarray, num_parts: int, prefix: str) -> jnp.ndarray:
  """part_tokens [B, K + 1, P, D] -> [B, K, D] foreground part features."""
  tokens = part_tokens[:, :num_parts]
  if prefix == "cls":
    return tokens[:, :, 0]
  if prefix == "cls_registers":
    return tokens.mean(2)
  raise ValueError(f"features.prefix must be one of {PREFIX_MODES}, got {prefix!r}")


def patch_weights(part_ids: jnp.ndarray, coverage: jnp.ndarray, num_parts: int,
                  mode: str) -> jnp.ndarray:
  """[B, N, K] late-masking weights from part ids [B, h, w] or coverage [B, h, w, K + 1]."""
  batch = part_ids.shape[0]
  if mode == "hard":
    onehot = part_ids.reshape(batch, -1)[..., None] == jnp.arange(num_parts)
    return onehot.astype(jnp.float32)
  if mode == "coverage":
    return coverage.reshape(batch, -1, num_parts + 1)[..., :num_parts]
  raise ValueError(f"features.late_weights must be one of {LATE_WEIGHTS}, got {mode!r}")


@functools.lru_cache(maxsize=32)
def make_extractors(model, num_parts: int, prefix: str = "cls",
                    late_weights: str = "hard") -> Dict[str, Callable]:
  """Jitted feature functions, one per masking (do not modify the returned dict).

  Each is `fn(params, images [B, H, W, 3], part_ids [B, h, w], coverage [B, h, w, K + 1]) ->
  (features [B, K, D], present [B, K])`. Params are an argument (not a closure constant), so a
  ViT-B is not baked into the compiled program, and the functions are cached per (architecture,
  K, options): seeds and splits of the same backbone reuse one compilation.
  """
  if prefix not in PREFIX_MODES:
    raise ValueError(f"features.prefix must be one of {PREFIX_MODES}, got {prefix!r}")
  if late_weights not in LATE_WEIGHTS:
    raise ValueError(f"features.late_weights must be one of {LATE_WEIGHTS}, got {late_weights!r}")

  @jax.jit
  def late(params, images, part_ids, coverage):
    out = model.apply({"params": params}, images)
    return late_features(out["patch_tokens"],
                         patch_weights(part_ids, coverage, num_parts, late_weights))

  @jax.jit
  def early(params, images, part_ids, coverage):
    del coverage
    out = model.apply({"params": params}, images, part_ids=part_ids, num_parts=num_parts)
    flat_ids = part_ids.reshape(part_ids.shape[0], -1)
    present = jnp.any(flat_ids[..., None] == jnp.arange(num_parts), 1)
    return early_features(out["part_tokens"], num_parts, prefix), present

  return {"late": late, "early": early}

