"""Looking inside a backbone: attention weights and late vs early part features
(colabs/explore_attention_masks.ipynb uses these).

`attention_weights` reads the weights the ViT's attention sows into its "intermediates"
collection when asked for it (models/vit.py's `Attention`): they come from the forward's own
queries and keys under the forward's own mask, so the picture is the attention the model used.
"""

from typing import Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np

from metonymy.models import attention_masks
from metonymy.models import vit


def attention_weights(config: vit.ViTConfig, params, images: jnp.ndarray, layer: int,
                      part_ids: Optional[jnp.ndarray] = None,
                      num_parts: Optional[int] = None) -> Dict[str, np.ndarray]:
  """Attention weights of block `layer` (0-based) of the plain or early-masked forward.

  Args:
    config, params: a ViT (models/vit.py) and its parameters.
    images: float32 [B, H, W, 3], normalized with the backbone's mean/std.
    part_ids: int [B, h, w] in [0, K] on the patch grid (K = background): the early-masked
      forward (K+1 prefix copies, block-diagonal mask). None: the plain forward.

  Returns:
    {"weights": float32 [B, H, L, L] (rows: queries, summing to 1 over the allowed keys),
     "group_ids": int32 [B, L] (early forward; prefix copies first, then patches) or None,
     "num_prefix_tokens": tokens before the patches (P, or (K+1) P)}.
  """
  if not 0 <= layer < config.depth:
    raise ValueError(f"layer must be in [0, {config.depth}), got {layer}")
  # The natural token order and no padding, so the sown weights are over [prefix, patches].
  model = vit.VisionTransformer(config)
  _, state = model.apply({"params": params}, jnp.asarray(images, jnp.float32), part_ids=part_ids,
                         num_parts=num_parts, mutable=["intermediates"])
  weights, = state["intermediates"][f"blocks_{layer}"]["attn"]["attention_weights"]
  group_ids = None
  if part_ids is not None:
    if num_parts is None:  # As the forward infers it.
      num_parts = int(np.max(np.asarray(part_ids)))
    flat = part_ids.reshape(part_ids.shape[0], -1)
    group_ids = attention_masks.early_masking_group_ids(flat, num_parts, config.num_prefix)
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
