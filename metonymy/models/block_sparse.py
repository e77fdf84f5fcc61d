"""Work the block-diagonal part mask makes useless, removed: sorted layout, background dropping,
tiled attention.

The early-masked sequence `[prefix copy 0..K, patches]` (attention_masks.py) attends within
groups only. Sorted by group (stable, so each group is its prefix copy followed by its patches in
raster order) the mask becomes block diagonal with contiguous blocks, which pays twice:

  * Foreground and background windows (hard masks): the background group K sorts last, so the
    foreground is the first `K P + N_fg` tokens and the background the rest. A window is cut to
    the smallest of a few static capacity buckets that holds it for every image of the batch
    (picked at run time by a switch: one compiled program per bucket, only the chosen one
    runs); the block mask keeps a window's stray tokens of the other side out. At inference,
    `drop_background` encodes the foreground window alone. `split_background` encodes both
    windows: the full forward whose foreground computation is exactly the dropped one, so the
    two agree bit for bit. (Cutting one sequence shorter is not enough for that: a program's
    float results depend on its shapes, measured on XLA:CPU for the qkv einsum and the
    attention.) Without either, the sorted sequence is one window.
  * Tiled attention: query tile t (T consecutive tokens) can only see keys of the groups it
    touches, a contiguous range of the sorted sequence. Each tile attends to a key window of
    static width W starting there instead of to all L keys: L W instead of L^2 score and value
    work. W is the smallest bucket that covers every tile's range, chosen at run time; when no
    bucket is small enough the dense path runs. Blocked keys inside a window get exactly zero
    weight, as in the dense path, so the isolation guarantee is unchanged.
"""

import math
from typing import NamedTuple, Sequence, Tuple

import einops
import jax
import jax.numpy as jnp
import numpy as np

from metonymy.models import attention
from metonymy.models import attention_masks

# Group id of padding tokens in the sorted layout: larger than any part, so padding sorts last
# and forms its own group.
PAD_GROUP = np.iinfo(np.int32).max


class SortedGroups(NamedTuple):
  """Passed to the attention layers instead of a boolean mask: the group id of every token of a
  sorted sequence, non-decreasing along each row. int32 [B, L]."""
  group_ids: jnp.ndarray


def sort_order(group_ids: jnp.ndarray) -> Tuple[jnp.ndarray, jnp.ndarray]:
  """(order, inverse) int32 [B, L]: tokens[order] is group-major, prefix copy first in each group
  (the natural layout puts every prefix copy before the patches, and the sort is stable)."""
  order = jnp.argsort(group_ids, axis=1, stable=True).astype(jnp.int32)
  inverse = jnp.argsort(order, axis=1).astype(jnp.int32)
  return order, inverse


def gather_tokens(x: jnp.ndarray, order: jnp.ndarray) -> jnp.ndarray:
  """x [B, L, ...] reordered along axis 1 by order [B, L]."""
  index = order.reshape(order.shape + (1,) * (x.ndim - 2))
  return jnp.take_along_axis(x, index, axis=1)


def gather_bias(bias: jnp.ndarray, order: jnp.ndarray) -> jnp.ndarray:
  """An additive bias [B, 1|H, L, L] over the natural layout, reordered on both token axes."""
  rows = jnp.take_along_axis(bias, order[:, None, :, None], axis=2)
  return jnp.take_along_axis(rows, order[:, None, None, :], axis=3)


def capacities(length: int, buckets: Sequence[float], multiple: int = 8) -> Tuple[int, ...]:
  """Static sequence lengths to cut to: each fraction of `length` rounded up to `multiple`,
  deduplicated, ending with `length` itself."""
  sizes = {min(length, int(math.ceil(f * length / multiple)) * multiple) for f in buckets
           if 0 < f < 1}
  return tuple(sorted(sizes | {length}))


def bucket_index(needed: jnp.ndarray, sizes: Sequence[int]) -> jnp.ndarray:
  """int32 []: the first of the increasing `sizes` that is >= needed (the last one otherwise)."""
  below = jnp.asarray(sizes[:-1], jnp.int32) < needed
  return jnp.sum(below.astype(jnp.int32))


def foreground_length(part_ids: jnp.ndarray, num_parts: int, num_prefix: int) -> jnp.ndarray:
  """int32 []: the longest foreground (K prefix copies + non-background patches) in the batch.
  part_ids: [B, N] with K the background."""
  patches = jnp.sum((part_ids != num_parts).astype(jnp.int32), axis=1)
  return num_parts * num_prefix + jnp.max(patches)


def background_length(part_ids: jnp.ndarray, num_parts: int, num_prefix: int) -> jnp.ndarray:
  """int32 []: the longest background (its prefix copy + background patches) in the batch."""
  patches = jnp.sum((part_ids == num_parts).astype(jnp.int32), axis=1)
  return num_prefix + jnp.max(patches)


def _group_spans(group_ids: jnp.ndarray) -> Tuple[jnp.ndarray, jnp.ndarray]:
  """For sorted group ids [B, L]: the first position of each token's group and one past its
  last, both int32 [B, L]."""
  length = group_ids.shape[1]
  position = jnp.arange(length, dtype=jnp.int32)
  change = group_ids[:, 1:] != group_ids[:, :-1]
  is_first = jnp.concatenate([jnp.ones_like(change[:, :1]), change], axis=1)
  is_last = jnp.concatenate([change, jnp.ones_like(change[:, :1])], axis=1)
  first = jax.lax.cummax(jnp.where(is_first, position, 0), axis=1)
  last = jax.lax.cummin(jnp.where(is_last, position, length - 1), axis=1, reverse=True)
  return first, last + 1


def window_sizes(length: int, tile: int) -> Tuple[int, ...]:
  """Key-window widths tried for `length` tokens in tiles of `tile`: 1/8, 1/4 and 1/2 of the
  (tile-padded) sequence in whole tiles, wider than one tile; the dense path is the fallback."""
  padded = int(math.ceil(length / tile)) * tile
  sizes = {int(math.ceil(padded * f / tile)) * tile for f in (0.125, 0.25, 0.5)}
  return tuple(sorted(w for w in sizes if tile < w < padded))


def tiled_attention(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, group_ids: jnp.ndarray,
                    tile: int, implementation=None) -> jnp.ndarray:
  """Block-diagonal attention over a sorted sequence, computed tile by tile.

  Args:
    q, k, v: [B, L, H, hd].
    group_ids: int32 [B, L], non-decreasing along each row; tokens attend within their group.
    tile: queries per tile.
    implementation: for the dense fallback (`attention.dot_product_attention`).

  Returns:
    [B, L, H, hd]; equal to dense masked attention up to float rounding.
  """
  batch, length, heads, head_dim = q.shape
  padded = int(math.ceil(length / tile)) * tile

  def dense(q, k, v, group_ids):  # Inside the branch: the [L, L] mask only when it runs.
    return attention.dot_product_attention(
        q, k, v, mask=attention_masks.block_attention_mask(group_ids),
        implementation=implementation)

  windows = window_sizes(length, tile)
  if not windows:
    return dense(q, k, v, group_ids)
  pad = padded - length
  pad_rows = lambda x: jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2))
  groups = jnp.pad(group_ids, ((0, 0), (0, pad)), constant_values=PAD_GROUP)
  first, end = _group_spans(groups)
  tiles = padded // tile
  tile_first = first[:, ::tile]                     # [B, tiles]: where the tile's keys begin
  tile_end = end[:, tile - 1::tile]                 # [B, tiles]: one past where they end
  needed = jnp.max(tile_end - tile_first)

  def windowed(width, q, k, v, group_ids):
    qp, kp, vp = pad_rows(q), pad_rows(k), pad_rows(v)
    start = jnp.minimum(tile_first, padded - width)
    index = start[..., None] + jnp.arange(width, dtype=jnp.int32)     # [B, tiles, W]
    take = jax.vmap(lambda x, i: x[i])
    k_win, v_win, g_win = take(kp, index), take(vp, index), take(groups, index)
    # Head-major products and the softmax normalised after the value product, as in
    # attention.xla_attention.
    q_tiles = einops.rearrange(qp, "b (n t) h e -> b n h t e", t=tile)
    k_win, v_win = (einops.rearrange(x, "b n w h e -> b n h w e") for x in (k_win, v_win))
    scale = np.float32(1.0 / np.sqrt(head_dim)).astype(q.dtype)
    logits = jnp.matmul(q_tiles * scale, jnp.swapaxes(k_win, -1, -2)).astype(jnp.float32)
    allowed = groups.reshape(batch, tiles, tile)[..., :, None] == g_win[..., None, :]
    logits = jnp.where(allowed[:, :, None], logits, jnp.finfo(jnp.float32).min)
    weights = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))         # [B,n,H,T,W]
    out = jnp.matmul(weights.astype(q.dtype), v_win).astype(jnp.float32)
    out = (out / jnp.sum(weights, axis=-1, keepdims=True)).astype(q.dtype)
    return einops.rearrange(out, "b n h t e -> b (n t) h e")[:, :length]

  branches = [lambda *a, w=w: windowed(w, *a) for w in windows] + [dense]
  index = bucket_index(needed, windows + (padded,))
  return jax.lax.switch(index, branches, q, k, v, group_ids)
