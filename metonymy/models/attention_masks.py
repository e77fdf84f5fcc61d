"""Early-masking layout: prefix copies per part, group ids, and block-diagonal attention masks.

The early-masked sequence is `[prefix copy 0, ..., prefix copy K, patch tokens]`, where each copy
holds the P prefix tokens (CLS + registers) and K is the background part. Every token belongs to
one group: prefix copy k to group k, a patch to its part id. A token attends only to tokens of
its own group, so part k's prefix tokens are a function of part k's pixels alone.
"""

from typing import Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np


def early_masking_group_ids(part_ids: jnp.ndarray, num_parts: int, num_prefix: int) -> jnp.ndarray:
  """Group id of every token of the early-masked sequence.

  Args:
    part_ids: int [B, N] (flattened patch grid) with values in [0, num_parts]; num_parts is the
      background.
    num_parts: K, the number of foreground parts (static).
    num_prefix: P, the prefix tokens per copy.

  Returns:
    int32 [B, (K + 1) * P + N].
  """
  batch = part_ids.shape[0]
  prefix_groups = jnp.repeat(jnp.arange(num_parts + 1, dtype=jnp.int32), num_prefix)
  prefix_groups = jnp.broadcast_to(prefix_groups, (batch, prefix_groups.shape[0]))
  return jnp.concatenate([prefix_groups, part_ids.astype(jnp.int32)], axis=1)


def block_attention_mask(group_ids: jnp.ndarray) -> jnp.ndarray:
  """Boolean [B, 1, L, L] mask, True where query and key share a group. group_ids: [B, L]."""
  return group_ids[:, None, :, None] == group_ids[:, None, None, :]


def mask_to_bias(mask: jnp.ndarray, dtype=jnp.float32) -> jnp.ndarray:
  """The additive form of a boolean mask: 0 where allowed, the dtype's lowest value where blocked.

  A finite floor (not -inf) keeps rows finite under any bias arithmetic; after the softmax's max
  subtraction exp() of it underflows to exactly 0, so blocked keys contribute exactly nothing.
  """
  return jnp.where(mask, jnp.zeros((), dtype), jnp.finfo(dtype).min)


def block_attention_bias(group_ids: jnp.ndarray, dtype=jnp.float32) -> jnp.ndarray:
  """Additive [B, 1, L, L] form of `block_attention_mask`."""
  return mask_to_bias(block_attention_mask(group_ids), dtype)


def soft_group_attention_bias(patch_part_probs: jnp.ndarray, num_prefix: int,
                              eps: float = 1e-10) -> jnp.ndarray:
  """Additive log-probability bias for soft part masks (Stage 2, "soft" variant).

  Token i's membership of part k is a_i^k: one-hot for prefix copies, the Stage-1 probability
  for patches. Query i may attend to key j with weight sum_k a_i^k a_j^k, so the bias is its
  log: a prefix copy of part k attending to patch j gets log a_j^k, patch i attending to patch j
  gets log sum_k a_i^k a_j^k. With one-hot probabilities this is exactly `block_attention_bias`
  up to the floor log(eps).

  Args:
    patch_part_probs: [B, N, K + 1] probabilities over parts (rows sum to 1).
    num_prefix: P, prefix tokens per copy.
    eps: floor inside the log.

  Returns:
    float [B, 1, L, L] with L = (K + 1) * P + N.
  """
  batch, _, groups = patch_part_probs.shape
  prefix_membership = jnp.repeat(jnp.eye(groups, dtype=patch_part_probs.dtype), num_prefix, axis=0)
  prefix_membership = jnp.broadcast_to(prefix_membership, (batch,) + prefix_membership.shape)
  membership = jnp.concatenate([prefix_membership, patch_part_probs], axis=1)  # [B, L, K+1]
  affinity = jnp.einsum("bik,bjk->bij", membership, membership)
  return jnp.log(affinity + eps)[:, None]


def selected_part_attention_bias(patch_part_probs: jnp.ndarray, part_ids: jnp.ndarray,
                                 num_prefix: int) -> jnp.ndarray:
  """Hard masks whose gradient reaches the selected parts only (Stage 2, "hard" with
  hard_gradient="selected"; paper Appendix F).

  Each patch j sits in the clique of its selected part k = part_ids[j], and every query of that
  clique weights key j by a_k(j) / SG(a_k(j)): the additive log-weight
  log a_k(j) - SG(log a_k(j)), which is exactly 0 in the forward pass. The bias therefore equals
  `block_attention_bias` value for value (0 inside a clique, the floor across cliques), while its
  gradient reaches a_k(j) for k = part_ids[j] and no other entry of a: Stage 2 can tell Stage 1
  that a patch should leave its part (shrink it), never that a patch should join another part.
  The weight is a_k / SG(a_k) rather than the soft masks' a_k so that its value is 1 (the hard
  forward, bit for bit); its gradient is the relative one, d log a_k(j). Prefix keys have
  weight 1.

  Args:
    patch_part_probs: [B, N, K + 1] probabilities over parts (rows sum to 1).
    part_ids: int [B, N], the selected part of every patch (the argmax of patch_part_probs,
      exactly the ids the hard mask is built from).
    num_prefix: P, prefix tokens per copy.

  Returns:
    float [B, 1, L, L] with L = (K + 1) * P + N, in patch_part_probs' dtype.
  """
  batch, _, groups = patch_part_probs.shape
  dtype = patch_part_probs.dtype
  selected = jnp.take_along_axis(patch_part_probs, part_ids[..., None], axis=-1)[..., 0]  # [B, N]
  # The argmax of a probability row is at least 1/(K+1); the floor only keeps the log of a
  # degenerate all-zero row finite (-inf - -inf would put a NaN into the forward pass).
  log_selected = jnp.log(jnp.maximum(selected, jnp.finfo(dtype).tiny))
  log_weight = log_selected - jax.lax.stop_gradient(log_selected)  # Exactly 0 forward.
  key_log_weight = jnp.concatenate([jnp.zeros((batch, groups * num_prefix), dtype), log_weight], 1)
  mask = block_attention_mask(early_masking_group_ids(part_ids, groups - 1, num_prefix))
  return jnp.where(mask, key_log_weight[:, None, None, :], jnp.finfo(dtype).min)


def checked_num_parts(part_ids: jnp.ndarray, num_parts: Optional[int],
                      shape: Tuple[int, ...]) -> int:
  """K for an encoder's `part_ids` [B, h, w] on its patch grid (`shape`): `num_parts`, or the
  largest id of concrete ids when None. A ValueError when the shape is not `shape`, when ids
  under jit come without `num_parts`, or when concrete ids fall outside [0, K]."""
  if part_ids.shape != tuple(shape):
    raise ValueError(f"part_ids must have shape [B, h, w] = {tuple(shape)} on the patch grid, "
                     f"got {part_ids.shape}.")
  traced = isinstance(part_ids, jax.core.Tracer)
  if num_parts is None:
    if traced:
      raise ValueError("num_parts must be given when part_ids is traced (e.g. under jit).")
    num_parts = int(np.max(np.asarray(part_ids)))
  if not traced:
    values = np.asarray(part_ids)
    low, high = int(values.min()), int(values.max())
    if low < 0 or high > num_parts:
      raise ValueError(f"part_ids must lie in [0, num_parts={num_parts}] (num_parts is the "
                       f"background id); got values in [{low}, {high}].")
  return num_parts
