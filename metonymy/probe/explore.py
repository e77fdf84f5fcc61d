"""Looking inside a backbone: attention weights and late vs early part features
(colabs/explore_attention_masks.ipynb uses these).

The ViT's attention (models/attention.py) returns the attended values, never its attention
weights, so `attention_weights` recomputes one layer's softmax(q k^T / sqrt(d)) from that layer's
parameters and its input (the previous block's output, from the forward's intermediates), under
the same block-diagonal mask as the early forward. With `check=True` it also rebuilds the
block's output from those weights and compares it with the forward's own, so the picture is the
attention the model actually used, not an approximation.
"""

from typing import Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np

from metonymy.models import attention_masks
from metonymy.models import vit


def _layer_norm(x, p, eps):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / jnp.sqrt(var + eps) * p["scale"] + p["bias"]


def _gelu(config: vit.ViTConfig, x):
  if config.activation == "quick_gelu":
    return x * jax.nn.sigmoid(1.702 * x)
  return jax.nn.gelu(x, approximate=False)


def attention_weights(config: vit.ViTConfig, params, images: jnp.ndarray, layer: int,
                      part_ids: Optional[jnp.ndarray] = None, num_parts: Optional[int] = None,
                      check: bool = True, atol: float = 1e-4) -> Dict[str, np.ndarray]:
  """Attention weights of block `layer` (0-based) of the plain or early-masked forward.

  Args:
    config, params: a ViT (models/vit.py) and its parameters.
    images: float32 [B, H, W, 3], normalized with the backbone's mean/std.
    part_ids: int [B, h, w] in [0, K] on the patch grid (K = background): the early-masked
      forward (K+1 prefix copies, block-diagonal mask). None: the plain forward.
    check: rebuild the block's output from the weights and raise if it differs from the
      forward's by more than `atol` (RoPE models are not supported by the rebuild).

  Returns:
    {"weights": float32 [B, H, L, L] (rows: queries, summing to 1 over the allowed keys),
     "group_ids": int32 [B, L] (early forward; prefix copies first, then patches) or None,
     "num_prefix_tokens": tokens before the patches (P, or (K+1) P)}.
  """
  if config.rope_periods is not None:
    raise ValueError("attention_weights does not recompute RoPE attention (DINOv3-style models).")
  if not 0 <= layer < config.depth:
    raise ValueError(f"layer must be in [0, {config.depth}), got {layer}")
  model = vit.VisionTransformer(config)
  images = jnp.asarray(images, jnp.float32)
  out = model.apply({"params": params}, images, part_ids=part_ids, num_parts=num_parts,
                    return_intermediates=True)
  if layer == 0:
    prefix, patches, _ = model.apply({"params": params}, images, method=model.embed)
    if part_ids is not None:
      prefix = jnp.tile(prefix, (1, num_parts + 1, 1))
    x = jnp.concatenate([prefix, patches], 1)
    if config.ln_pre:
      x = _layer_norm(x, params["ln_pre"], config.norm_eps)
  else:
    x = out["intermediates"][layer - 1]
  block = params[f"blocks_{layer}"]
  attn = block["attn"]
  h = _layer_norm(x, block["norm1"], config.norm_eps)
  qkv = jnp.einsum("bld,dthe->blthe", h, attn["qkv_kernel"])
  if config.qkv_bias:
    bias = attn["qkv_bias"]
    if not config.k_bias:
      bias = bias * jnp.array([1.0, 0.0, 1.0])[:, None, None]
    qkv = qkv + bias
  q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]                      # [B, L, H, E]
  logits = jnp.einsum("bqhe,bkhe->bhqk", q, k) / np.sqrt(config.head_dim)
  group_ids = None
  if part_ids is not None:
    flat = part_ids.reshape(part_ids.shape[0], -1)
    group_ids = attention_masks.early_masking_group_ids(flat, num_parts, config.num_prefix)
    logits = jnp.where(attention_masks.block_attention_mask(group_ids), logits, -jnp.inf)
  weights = jax.nn.softmax(logits, axis=-1)
  if check:
    y = jnp.einsum("bhqk,bkhe->bqhe", weights, v)
    y = jnp.einsum("blhe,hed->bld", y, attn["out_kernel"]) + attn["out_bias"]
    if config.layer_scale:
      y = y * block["ls1"]["gamma"]
    x = x + y
    m = _layer_norm(x, block["norm2"], config.norm_eps)
    m = _gelu(config, m @ block["mlp"]["fc1"]["kernel"] + block["mlp"]["fc1"]["bias"])
    m = m @ block["mlp"]["fc2"]["kernel"] + block["mlp"]["fc2"]["bias"]
    if config.layer_scale:
      m = m * block["ls2"]["gamma"]
    rebuilt, actual = x + m, out["intermediates"][layer]
    err = float(jnp.max(jnp.abs(rebuilt - actual)))
    if not err <= atol:
      raise AssertionError(f"recomputed block {layer} differs from the forward by {err:.2e} > "
                           f"{atol}: the weights shown would not be the model's")
  groups = 1 if part_ids is None else num_parts + 1
  return {"weights": np.asarray(weights),
          "group_ids": None if group_ids is None else np.asarray(group_ids),
          "num_prefix_tokens": groups * config.num_prefix}


def late_and_early(config: vit.ViTConfig, params, images: jnp.ndarray, part_ids: jnp.ndarray,
                   num_parts: int) -> Dict[str, np.ndarray]:
  """Per-part features of the benchmark (probe/features.py's definitions, hard weights):

    late  [B, K+1, D]: mean of the plain forward's final patch tokens inside part k (zero where
                       part k has no patch);
    early [B, K+1, D]: part k's CLS of the early-masked forward.
  """
  model = vit.VisionTransformer(config)
  plain = model.apply({"params": params}, images)["patch_tokens"]              # [B, N, D]
  onehot = jax.nn.one_hot(part_ids.reshape(part_ids.shape[0], -1), num_parts + 1)  # [B, N, K+1]
  count = onehot.sum(1)[..., None]                                              # [B, K+1, 1]
  late = jnp.einsum("bnk,bnd->bkd", onehot, plain) / jnp.maximum(count, 1.0)
  early = model.apply({"params": params}, images, part_ids=part_ids,
                      num_parts=num_parts)["part_tokens"][:, :, 0]
  return {"late": np.asarray(late), "early": np.asarray(early)}
