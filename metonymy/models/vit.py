"""One Flax ViT family for DINOv1/v2/v3, CLIP, MAE and plain timm ViTs, with early masking.

Pure functional: `VisionTransformer(config).apply({"params": params}, images, ...)`.

Two forwards share every weight:
  * plain:  `[prefix (CLS + registers), patches]`, full attention;
  * early-masked (`part_ids=...`): the prefix is replicated once per part (K foreground parts +
    background) and every layer applies the block-diagonal mask of
    `attention_masks.block_attention_mask`, so part k's prefix copy only ever sees part k's patches.

Parity with the PyTorch references (docs/checkpoints.md, "Parity") rests on three details:
exact (erf) GELU, two-pass LayerNorm variance, and position-table resizing done the way each
checkpoint's own code does it (`pos_embed.py`).
"""

import dataclasses
import functools
from typing import Any, Dict, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from metonymy.models import attention as attention_lib
from metonymy.models import attention_masks
from metonymy.models import block_sparse
from metonymy.models import pos_embed as pos_lib


class ArchitectureConfig:
  """JSON round trip of a frozen dataclass architecture config (ViTConfig, SamEncoderConfig).
  `TUPLE_KEYS` name the fields that JSON turns into lists."""
  TUPLE_KEYS: Tuple[str, ...] = ()

  def to_dict(self) -> Dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: Dict[str, Any]):
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
      raise ValueError(f"Unknown {cls.__name__} keys {unknown}; known keys are {sorted(known)}.")
    d = dict(d)
    for key in cls.TUPLE_KEYS:
      if d.get(key) is not None:
        d[key] = tuple(d[key])
    return cls(**d)

  def replace(self, **kwargs):
    return dataclasses.replace(self, **kwargs)


@dataclasses.dataclass(frozen=True)
class ViTConfig(ArchitectureConfig):
  """Architecture of one backbone. Hashable, JSON-serializable; saved next to converted weights."""
  TUPLE_KEYS = ("pos_embed_grid", "rope_periods", "image_mean", "image_std")
  patch_size: int = 16
  width: int = 768
  depth: int = 12
  num_heads: int = 12
  mlp_dim: int = 3072
  num_registers: int = 0
  # Learned absolute position table over the patch grid it was trained on (the CLS position is
  # folded into the CLS token at import); None for RoPE-only models (DINOv3).
  pos_embed_grid: Optional[Tuple[int, int]] = (14, 14)
  pos_embed_resize: str = "size"
  rope_periods: Optional[Tuple[float, ...]] = None  # DINOv3 2D RoPE, read from the checkpoint.
  layer_scale: bool = False
  qkv_bias: bool = True
  k_bias: bool = True  # DINOv3 masks the key bias to zero.
  patch_bias: bool = True  # CLIP's conv1 has none.
  ln_pre: bool = False  # CLIP normalizes the embedded sequence before block 0.
  activation: str = "gelu"  # "gelu" (exact erf) or "quick_gelu" (CLIP).
  norm_eps: float = 1e-6
  projection_dim: Optional[int] = None  # CLIP's visual projection of the normed CLS.
  image_size: int = 224  # Default input resolution (pixels, square).
  image_mean: Tuple[float, float, float] = (0.485, 0.456, 0.406)
  image_std: Tuple[float, float, float] = (0.229, 0.224, 0.225)
  family: str = "vit"  # Informational: which checkpoint family this came from.

  def __post_init__(self):
    if self.width % self.num_heads:
      raise ValueError(f"width {self.width} is not divisible by num_heads {self.num_heads}")
    if self.activation not in ("gelu", "quick_gelu"):
      raise ValueError(f"activation must be 'gelu' or 'quick_gelu', got {self.activation!r}")
    if self.pos_embed_resize not in pos_lib.RESIZE_MODES:
      raise ValueError(f"pos_embed_resize must be one of {pos_lib.RESIZE_MODES}, "
                       f"got {self.pos_embed_resize!r}")

  @property
  def num_prefix(self) -> int:
    return 1 + self.num_registers

  @property
  def head_dim(self) -> int:
    return self.width // self.num_heads



# Architectures by name, for random-init runs and benchmarks. Imported checkpoints carry their own.
PRESETS: Dict[str, ViTConfig] = {
    "vit_tiny_test": ViTConfig(patch_size=8, width=64, depth=2, num_heads=4, mlp_dim=128,
                               pos_embed_grid=(4, 4), image_size=32),
    "vit_s16": ViTConfig(patch_size=16, width=384, depth=12, num_heads=6, mlp_dim=1536),
    "vit_b16": ViTConfig(),
    "vit_b14_reg4": ViTConfig(patch_size=14, num_registers=4, pos_embed_grid=(37, 37),
                              pos_embed_resize="size_antialias", layer_scale=True, image_size=224),
    "vit_b16_dinov3": ViTConfig(num_registers=4, pos_embed_grid=None,
                                rope_periods=pos_lib.rope_periods(64), layer_scale=True,
                                k_bias=False, norm_eps=1e-5),
}


def get_config(name: str, **overrides) -> ViTConfig:
  if name not in PRESETS:
    raise ValueError(f"Unknown ViT preset {name!r}; known presets: {sorted(PRESETS)}.")
  return PRESETS[name].replace(**overrides)


def _layer_norm(config: ViTConfig, name: str) -> nn.LayerNorm:
  # use_fast_variance=False: E[x^2]-E[x]^2 loses ~3e-4 on real activations with large means.
  return nn.LayerNorm(epsilon=config.norm_eps, use_fast_variance=False, name=name)


def attention_weights(q: jnp.ndarray, k: jnp.ndarray, mask=None, bias=None) -> jnp.ndarray:
  """softmax(q k^T / sqrt(d) + bias, masked), float32 [B, H, L, S], scored as
  attention.xla_attention scores (which normalises after the value product, so never holds them).

  q, k: [B, L, H, d]; mask: bool [B, 1|H, L, S], True = attend; bias: float [B, 1|H, L, S].
  """
  scale = np.float32(1.0 / np.sqrt(q.shape[-1])).astype(q.dtype)
  q, k = jnp.swapaxes(q, 1, 2), jnp.swapaxes(k, 1, 2)                 # [B, H, L, d]
  scores = jnp.matmul(q * scale, jnp.swapaxes(k, -1, -2)).astype(jnp.float32)
  if bias is not None:
    scores = scores + bias.astype(jnp.float32)
  if mask is not None:
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
  return jax.nn.softmax(scores, axis=-1)


class Attention(nn.Module):
  """Multi-head self-attention with a fused qkv projection, optional RoPE on the patch tokens.

  With `mutable=["intermediates"]` it also sows its attention weights (`attention_weights`, over
  the sequence it attends: padding included, in the sorted order under token_order="sorted").
  The attention itself never holds them (xla_attention normalises after the value product, the
  fused kernels keep them on chip), so they are computed apart, and only when asked; the tiled
  path (attention_tiles > 0), which never forms the [L, L] scores, sows none.
  """
  config: ViTConfig
  dtype: Any = jnp.float32
  attention_impl: Optional[str] = None
  attention_tiles: int = 0

  @nn.compact
  def __call__(self, x, mask=None, bias=None, rope=None, straight_through=False):
    """x: [B, L, D]; mask: bool [B, 1, L, L], or block_sparse.SortedGroups for a sorted sequence
    (attended tile by tile when attention_tiles > 0); bias: float [B, 1|H, L, L]; rope: (sin, cos).

    straight_through: the output is that of the boolean `mask` in the forward pass and gets the
    gradient of the additive `bias` in the backward pass: SG(H_hard) + H_soft - SG(H_soft),
    per layer (paper §4.0.2). `H_soft - SG(H_soft)` is exactly 0 forward, so the forward is the
    hard-masked value bit for bit.
    """
    cfg = self.config
    heads, head_dim = cfg.num_heads, cfg.head_dim
    kernel = self.param("qkv_kernel", nn.initializers.lecun_normal(batch_axis=()),
                        (cfg.width, 3, heads, head_dim))
    qkv = jnp.einsum("bld,dthe->blthe", x, kernel.astype(self.dtype))
    if cfg.qkv_bias:
      qkv_bias = self.param("qkv_bias", nn.initializers.zeros, (3, heads, head_dim))
      if not cfg.k_bias:
        qkv_bias = qkv_bias * jnp.array([1.0, 0.0, 1.0])[:, None, None]
      qkv = qkv + qkv_bias.astype(self.dtype)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    if rope is not None:
      # Patch tokens are always the last N tokens; prefix tokens are not rotated.
      sin, cos = rope
      num_patches = sin.shape[-2]
      q = jnp.concatenate([q[:, :-num_patches], pos_lib.apply_rope(q[:, -num_patches:], sin, cos)], 1)
      k = jnp.concatenate([k[:, :-num_patches], pos_lib.apply_rope(k[:, -num_patches:], sin, cos)], 1)
    if isinstance(mask, block_sparse.SortedGroups):
      out = block_sparse.tiled_attention(q, k, v, mask.group_ids, self.attention_tiles,
                                         self.attention_impl)
    elif straight_through:
      hard = attention_lib.dot_product_attention(q, k, v, mask=mask,
                                                 implementation=self.attention_impl)
      soft = attention_lib.dot_product_attention(q, k, v, bias=bias,
                                                 implementation=self.attention_impl)
      out = jax.lax.stop_gradient(hard) + (soft - jax.lax.stop_gradient(soft))
    else:
      out = attention_lib.dot_product_attention(q, k, v, mask=mask, bias=bias,
                                                implementation=self.attention_impl)
    if self.is_mutable_collection("intermediates") and not isinstance(
        mask, block_sparse.SortedGroups):
      # The weights of the values this forward returns: the boolean mask's under the STE.
      self.sow("intermediates", "attention_weights",
               attention_weights(q, k, mask, None if straight_through else bias))
    out_kernel = self.param("out_kernel", nn.initializers.lecun_normal(batch_axis=()),
                            (heads, head_dim, cfg.width))
    # One [B L, H e] x [H e, D] product: XLA:CPU runs the two-axis contraction of the equivalent
    # einsum ~1.5x slower.
    batch, length = out.shape[:2]
    out = out.reshape(batch, length, heads * head_dim) @ out_kernel.reshape(
        heads * head_dim, cfg.width).astype(self.dtype)
    out_bias = self.param("out_bias", nn.initializers.zeros, (cfg.width,))
    return out + out_bias.astype(self.dtype)


class Mlp(nn.Module):
  config: ViTConfig
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(self.config.mlp_dim, dtype=self.dtype, name="fc1")(x)
    if self.config.activation == "quick_gelu":
      x = x * jax.nn.sigmoid(1.702 * x)
    else:
      x = jax.nn.gelu(x, approximate=False)
    return nn.Dense(self.config.width, dtype=self.dtype, name="fc2")(x)


class LayerScale(nn.Module):
  width: int

  @nn.compact
  def __call__(self, x):
    return x * self.param("gamma", nn.initializers.constant(1e-5), (self.width,)).astype(x.dtype)


class Block(nn.Module):
  """Pre-norm transformer block: x += ls1 * attn(norm1(x)); x += ls2 * mlp(norm2(x))."""
  config: ViTConfig
  dtype: Any = jnp.float32
  attention_impl: Optional[str] = None
  attention_tiles: int = 0

  @nn.compact
  def __call__(self, x, mask=None, bias=None, rope=None, straight_through=False):
    cfg = self.config
    y = Attention(cfg, self.dtype, self.attention_impl, self.attention_tiles, name="attn")(
        _layer_norm(cfg, "norm1")(x), mask, bias, rope, straight_through)
    if cfg.layer_scale:
      y = LayerScale(cfg.width, name="ls1")(y)
    x = x + y
    y = Mlp(cfg, self.dtype, name="mlp")(_layer_norm(cfg, "norm2")(x))
    if cfg.layer_scale:
      y = LayerScale(cfg.width, name="ls2")(y)
    return x + y


class VisionTransformer(nn.Module):
  """ViT backbone with plain and early-masked forwards.

  Attributes:
    config: the architecture.
    dtype: compute dtype (parameters stay float32).
    attention_impl: None = attention.xla_attention; otherwise passed to
      `jax.nn.dot_product_attention` ("cudnn" on GPUs, "xla" for JAX's own XLA path).
    pad_to_multiple: pad the sequence with masked-out tokens to a multiple of this (with
      attention_impl="cudnn" at least 2: cuDNN wants even lengths with masks). Padding never
      changes the real tokens' values.
    token_order: layout of the early-masked sequence: "natural" (`[prefix copies, patches]`) or
      "sorted" (group by group: each part's prefix copy, then its patches; block_sparse.py).
      Outputs are returned in the natural layout either way.
    attention_tiles: > 0: with hard masks, attend tile by tile over the sorted sequence, skipping
      key tiles no query of the tile may see (implies "sorted"). 0: dense masked attention.
    split_background: with hard masks in the sorted layout, encode the foreground and the
      background as two windows, each cut to a capacity bucket (no attention work between them,
      at the price of up to a bucket of padding each). The foreground window is exactly what
      `drop_background=True` runs, so this is the full forward whose foreground outputs dropping
      reproduces bit for bit. False: one window of the whole sorted sequence.
    capacity_buckets: the window lengths (fractions of the full sequence) the foreground and
      background windows are cut to; one compiled program each, the smallest that fits runs.
  """
  config: ViTConfig
  dtype: Any = jnp.float32
  attention_impl: Optional[str] = None
  pad_to_multiple: int = 1
  token_order: str = "natural"
  attention_tiles: int = 0
  split_background: bool = False
  capacity_buckets: Tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)

  def setup(self):
    cfg = self.config
    self.patch_embed = nn.Conv(cfg.width, (cfg.patch_size,) * 2, strides=(cfg.patch_size,) * 2,
                               padding="VALID", use_bias=cfg.patch_bias, dtype=self.dtype,
                               name="patch_embed")
    init = nn.initializers.normal(0.02)
    self.cls_token = self.param("cls_token", init, (1, 1, cfg.width))
    if cfg.num_registers:
      self.register_tokens = self.param("register_tokens", init, (1, cfg.num_registers, cfg.width))
    if cfg.pos_embed_grid is not None:
      grid_h, grid_w = cfg.pos_embed_grid
      self.pos_embed = self.param("pos_embed", init, (1, grid_h * grid_w, cfg.width))
    if cfg.ln_pre:
      self.ln_pre = _layer_norm(cfg, "ln_pre")
    if self.token_order not in ("natural", "sorted"):
      raise ValueError(f"token_order must be 'natural' or 'sorted', got {self.token_order!r}")
    self.blocks = [Block(cfg, self.dtype, self.attention_impl, self.attention_tiles,
                         name=f"blocks_{i}")
                   for i in range(cfg.depth)]
    self.norm = _layer_norm(cfg, "norm")
    if cfg.projection_dim:
      self.projection = self.param("projection", nn.initializers.lecun_normal(),
                                   (cfg.width, cfg.projection_dim))

  def patch_grid(self, image_shape: Sequence[int]) -> Tuple[int, int]:
    """(h, w) patch grid of images [B, H, W, 3]; H and W must be multiples of the patch size."""
    height, width = image_shape[1], image_shape[2]
    p = self.config.patch_size
    if height % p or width % p:
      raise ValueError(f"Image size {height}x{width} is not a multiple of the patch size {p}.")
    return height // p, width // p

  def embed(self, images: jnp.ndarray, token_mask: Optional[jnp.ndarray] = None,
            mask_token: Optional[jnp.ndarray] = None):
    """Tokens before the first block.

    Args:
      images: float [B, H, W, 3], already normalized.
      token_mask: optional bool [B, N]: patches whose embedding is replaced by `mask_token` [D]
        before the position embedding is added (masked-image modelling: iBOT, SimMIM). The mask
        token belongs to the pretraining that learns it, not to the backbone.

    Returns:
      prefix_tokens [B, P, D], patch_tokens [B, N, D], and rope (sin, cos) [N, head_dim] or None.
    """
    cfg = self.config
    grid = self.patch_grid(images.shape)
    patches = self.patch_embed(images.astype(self.dtype))
    batch = patches.shape[0]
    patches = patches.reshape(batch, grid[0] * grid[1], cfg.width)
    if token_mask is not None:
      patches = jnp.where(token_mask[..., None], mask_token.astype(self.dtype), patches)
    if cfg.pos_embed_grid is not None:
      table = pos_lib.resize_grid_embedding(self.pos_embed, cfg.pos_embed_grid, grid,
                                            cfg.pos_embed_resize)
      patches = patches + table.astype(self.dtype)
    prefix = [self.cls_token]
    if cfg.num_registers:
      prefix.append(self.register_tokens)
    prefix = jnp.broadcast_to(jnp.concatenate(prefix, axis=1).astype(self.dtype),
                              (batch, cfg.num_prefix, cfg.width))
    rope = None
    if cfg.rope_periods is not None:
      rope = tuple(jnp.asarray(t) for t in pos_lib.rope_sin_cos(grid, cfg.rope_periods))
    return prefix, patches, rope

  def encode(self, tokens: jnp.ndarray, rope=None, mask=None, bias=None,
             return_intermediates: bool = False, straight_through: bool = False):
    """Runs the blocks and the final norm on an embedded sequence.

    Args:
      tokens: [B, L, D]: prefix tokens first, patch tokens last.
      rope: (sin, cos) of shape [N, head_dim] or [B, N, head_dim] for the last N tokens.
      mask: bool [B, 1, L, L], True = attend; or block_sparse.SortedGroups (group ids of a
        sorted sequence). bias: additive float [B, 1|H, L, L].
      straight_through: forward with `mask`, gradient of `bias` (see `Attention`).
      return_intermediates: also return every block's output (before the final norm).

    Returns:
      normed tokens [B, L, D], and a list of [B, L, D] intermediates (empty unless requested).
    """
    length = tokens.shape[1]
    # cuDNN's fused attention wants even sequence lengths when a mask or bias is present.
    multiple = max(self.pad_to_multiple, 2 if self.attention_impl == "cudnn" else 1)
    padded = -length % multiple
    if padded:
      tokens = jnp.pad(tokens, ((0, 0), (0, padded), (0, 0)))
      if rope is not None:  # Rotary tables cover the last tokens: padding gets the identity.
        sin, cos = rope
        pad_rows = [(0, 0)] * (sin.ndim - 2) + [(0, padded), (0, 0)]
        rope = (jnp.pad(sin, pad_rows), jnp.pad(cos, pad_rows, constant_values=1.0))
      valid = jnp.arange(length + padded) < length
      key_mask = jnp.broadcast_to(valid[None, None, None, :], (tokens.shape[0], 1, 1, length + padded))
      if isinstance(mask, block_sparse.SortedGroups):  # Padding: one more group, sorted last.
        mask = block_sparse.SortedGroups(jnp.pad(mask.group_ids, ((0, 0), (0, padded)),
                                                 constant_values=block_sparse.PAD_GROUP))
      elif mask is None:
        mask = key_mask
      else:
        mask = jnp.pad(mask, ((0, 0), (0, 0), (0, padded), (0, padded))) & key_mask
      if bias is not None:  # Padded keys are blocked in the bias too (the STE soft path).
        bias = jnp.pad(bias, ((0, 0), (0, 0), (0, padded), (0, padded)))
        bias = jnp.where(valid[None, None, None, :], bias, jnp.finfo(bias.dtype).min)
    if isinstance(mask, block_sparse.SortedGroups) and not self.attention_tiles:
      mask = attention_masks.block_attention_mask(mask.group_ids)  # Once, not once per layer.
    x = tokens
    if self.config.ln_pre:
      x = self.ln_pre(x)
    intermediates = []
    for block in self.blocks:
      x = block(x, mask, bias, rope, straight_through)
      if return_intermediates:
        intermediates.append(x[:, :length])
    return self.norm(x)[:, :length], intermediates

  def _encode_sorted(self, tokens, rope, group_ids, flat_ids, num_parts: int, attention_bias,
                     straight_through_bias, drop_background: bool, return_intermediates: bool):
    """`encode` of the early-masked sequence in the sorted layout (block_sparse.py); tokens and
    intermediates come back in the natural layout."""
    batch, length = group_ids.shape
    order, inverse = block_sparse.sort_order(group_ids)
    tokens = block_sparse.gather_tokens(tokens, order)
    groups = block_sparse.gather_tokens(group_ids, order)
    if rope is not None:  # Per-token tables in the sorted order; prefix tokens get the identity.
      sin, cos = rope
      num_prefix = length - sin.shape[0]
      sin = jnp.concatenate([jnp.zeros((num_prefix, sin.shape[1]), sin.dtype), sin])
      cos = jnp.concatenate([jnp.ones((num_prefix, cos.shape[1]), cos.dtype), cos])
      rope = tuple(block_sparse.gather_tokens(jnp.broadcast_to(t, (batch,) + t.shape), order)
                   for t in (sin, cos))
    bias = attention_bias if straight_through_bias is None else straight_through_bias
    if bias is not None:
      bias = block_sparse.gather_bias(bias, order)
    if attention_bias is not None:
      mask = None
    elif straight_through_bias is not None:
      mask = attention_masks.block_attention_mask(groups)
    else:
      mask = block_sparse.SortedGroups(groups)

    def run(size, from_end=False):
      """Encodes a window of `size` tokens (the first ones, or the last ones) and pads the
      outputs back to the full length."""
      window = slice(length - size, None) if from_end else slice(0, size)
      padding = (length - size, 0) if from_end else (0, length - size)

      def branch(module, tokens, rope, groups):
        cut = lambda x: x[:, window]
        window_mask = block_sparse.SortedGroups(cut(groups)) if isinstance(
            mask, block_sparse.SortedGroups) else mask
        x, inter = module.encode(cut(tokens), None if rope is None else tuple(map(cut, rope)),
                                 mask=window_mask, bias=bias,
                                 return_intermediates=return_intermediates,
                                 straight_through=straight_through_bias is not None)
        grow = lambda y: jnp.pad(y, ((0, 0), padding, (0, 0)))
        return grow(x), [grow(y) for y in inter]
      return branch

    def segment(needed, from_end=False):
      """The shortest capacity bucket holding `needed` tokens, picked at run time."""
      sizes = block_sparse.capacities(length, self.capacity_buckets)
      if self.is_initializing() or len(sizes) == 1:
        return run(length)(self, tokens, rope, groups)
      return nn.switch(block_sparse.bucket_index(needed, sizes),
                       [run(size, from_end) for size in sizes], self, tokens, rope, groups)

    hard = isinstance(mask, block_sparse.SortedGroups)
    if not hard or not (drop_background or self.split_background):  # One window.
      x, intermediates = run(length)(self, tokens, rope, groups)
    else:
      if self.is_mutable_collection("intermediates"):
        # Each window's attention would sow weights of its own bucket's length, which
        # nn.switch's branches cannot return.
        raise ValueError("attention weights (mutable=['intermediates']) are sown over one "
                         "sequence; split_background and drop_background encode windows: ask "
                         "without them.")
      # Hard masks: the foreground (first K P + N_fg tokens) and the background (the rest) are
      # two independent windows. Encoding them apart skips the attention between them, and
      # makes the foreground a computation of its own, so dropping the background leaves it
      # bit for bit unchanged (a program's float results depend on its shapes).
      needed = block_sparse.foreground_length(flat_ids, num_parts, self.config.num_prefix)
      foreground = (groups != num_parts)[..., None]
      x, intermediates = segment(needed)
      if drop_background:
        background_x, background_inter = jnp.zeros_like(x), [jnp.zeros_like(y) for y in intermediates]
      else:
        background_x, background_inter = segment(
            block_sparse.background_length(flat_ids, num_parts, self.config.num_prefix),
            from_end=True)
      x = jnp.where(foreground, x, background_x)
      intermediates = [jnp.where(foreground, y, z) for y, z in zip(intermediates, background_inter)]
    unsort = lambda y: block_sparse.gather_tokens(y, inverse)
    return unsort(x), [unsort(y) for y in intermediates]

  def __call__(self, images: jnp.ndarray, part_ids: Optional[jnp.ndarray] = None,
               num_parts: Optional[int] = None, attention_bias: Optional[jnp.ndarray] = None,
               straight_through_bias: Optional[jnp.ndarray] = None,
               return_intermediates: bool = False,
               drop_background: bool = False, token_mask: Optional[jnp.ndarray] = None,
               mask_token: Optional[jnp.ndarray] = None) -> Dict[str, Any]:
    """Plain or early-masked forward.

    Args:
      images: float32 [B, H, W, 3], already normalized.
      part_ids: optional int [B, h, w] on the patch grid, values in [0, K]; K is the background.
        Switches on early masking: K + 1 prefix copies and a block-diagonal mask in every layer.
      num_parts: K (static). Required under jit; inferred as max(part_ids) for concrete inputs.
      attention_bias: optional additive bias [B, 1|H, L, L] over the early-masked sequence,
        used instead of the boolean block mask (Stage 2's soft masks). Needs part_ids for layout.
      straight_through_bias: optional additive bias like `attention_bias`, for Stage 2's STE
        masks: every layer's forward uses the boolean block mask of `part_ids` exactly, and the
        backward pass takes this bias's gradient.
      return_intermediates: also return per-block tokens (before the final norm).
      drop_background: inference with hard masks: skip the background group (its prefix copy
        and patches, block_sparse.py). Foreground outputs are bit-identical to the
        split_background forward's; the background's prefix and patch tokens come back as zeros.
      token_mask, mask_token: masked-image modelling (`embed`); plain forward only.

    Returns:
      A dict with `prefix_tokens [B, P, D]` (plain) or `[B, (K+1) P, D]` (early), `patch_tokens
      [B, N, D]`, in the early forward `part_tokens [B, K+1, P, D]`, with `projection` `[B, E]`
      (or `[B, K+1, E]`) for models with a CLS projection, and `intermediates` when asked.
    """
    cfg = self.config
    if token_mask is not None and part_ids is not None:
      raise ValueError("token_mask is for the plain forward (pretraining), not early masking.")
    prefix, patches, rope = self.embed(images, token_mask, mask_token)
    batch, num_patches = patches.shape[:2]
    out = {}
    if part_ids is None:
      if attention_bias is not None or straight_through_bias is not None:
        raise ValueError("attention_bias / straight_through_bias need part_ids: they are laid out "
                         "over the early-masked sequence.")
      tokens, intermediates = self.encode(jnp.concatenate([prefix, patches], 1), rope,
                                          return_intermediates=return_intermediates)
      out["prefix_tokens"] = tokens[:, :cfg.num_prefix]
      cls = tokens[:, 0]
    else:
      grid = self.patch_grid(images.shape)
      num_parts = attention_masks.checked_num_parts(part_ids, num_parts, (batch,) + grid)
      groups = num_parts + 1
      flat_ids = part_ids.reshape(batch, num_patches)
      prefix_copies = jnp.tile(prefix, (1, groups, 1))  # [B, (K+1) P, D], copy-major.
      group_ids = attention_masks.early_masking_group_ids(flat_ids, num_parts, cfg.num_prefix)
      if attention_bias is not None and straight_through_bias is not None:
        raise ValueError("Pass attention_bias (soft) or straight_through_bias (STE), not both.")
      bias = attention_bias if straight_through_bias is None else straight_through_bias
      if drop_background and bias is not None:
        raise ValueError("drop_background is for hard masks at inference; soft and STE biases "
                         "let the background reach the foreground's gradients or values.")
      tokens = jnp.concatenate([prefix_copies, patches], 1)
      if self.token_order == "natural" and not self.attention_tiles and not drop_background:
        mask = attention_masks.block_attention_mask(group_ids) if attention_bias is None else None
        tokens, intermediates = self.encode(
            tokens, rope, mask=mask, bias=bias, return_intermediates=return_intermediates,
            straight_through=straight_through_bias is not None)
      else:
        tokens, intermediates = self._encode_sorted(
            tokens, rope, group_ids, flat_ids, num_parts, attention_bias, straight_through_bias,
            drop_background, return_intermediates)
      num_prefix_tokens = groups * cfg.num_prefix
      out["prefix_tokens"] = tokens[:, :num_prefix_tokens]
      out["part_tokens"] = out["prefix_tokens"].reshape(batch, groups, cfg.num_prefix, cfg.width)
      cls = out["part_tokens"][:, :, 0]
    out["patch_tokens"] = tokens[:, -num_patches:]
    if cfg.projection_dim:
      out["projection"] = cls @ self.projection.astype(cls.dtype)
    if return_intermediates:
      out["intermediates"] = intermediates
    return out


def init_params(config: ViTConfig, rng: Optional[jax.Array] = None, image_size: Optional[int] = None):
  """Random parameters for `config` (shape inference only touches one small image)."""
  rng = jax.random.PRNGKey(0) if rng is None else rng
  size = image_size or config.image_size
  model = VisionTransformer(config)
  return model, jax.jit(model.init)(rng, jnp.zeros((1, size, size, 3), jnp.float32))["params"]


# Cached (the configs are frozen dataclasses): every load of a converted folder checks it against
# these, and tracing the model's init for them costs a fraction of a second each time. Callers
# must not change the returned tree.
@functools.lru_cache(maxsize=32)
def param_shapes(config: ViTConfig, image_size: Optional[int] = None):
  """The parameter tree of `config` as ShapeDtypeStructs, without allocating anything."""
  size = image_size or config.image_size
  size = size - size % config.patch_size or config.patch_size
  model = VisionTransformer(config)
  return jax.eval_shape(model.init, jax.random.PRNGKey(0),
                        jax.ShapeDtypeStruct((1, size, size, 3), jnp.float32))["params"]


def with_registers(config: ViTConfig, params: Dict, count: int, rng: jax.Array
                   ) -> Tuple[ViTConfig, Dict]:
  """(config, params) of a trained ViT given `count` register tokens (Darcet et al. 2024) it did
  not have: every trained weight kept, the new tokens drawn as the ViT initialises its prefix
  tokens (normal, std 0.02), so a stage that continues the ViT can learn to use them.

  Args:
    config: the ViT's architecture, without registers.
    params: its parameters (`VisionTransformer` tree, no "register_tokens").
    count: how many register tokens to add (> 0).
    rng: key of the new tokens.

  Returns:
    the architecture with `num_registers=count` and its parameters, "register_tokens" [1, count,
    width] added.
  """
  if count <= 0:
    raise ValueError(f"with_registers: count must be positive, got {count}.")
  if config.num_registers or "register_tokens" in params:
    raise ValueError(f"with_registers: the ViT already has {config.num_registers} register "
                     "tokens; adding registers to registers is not supported.")
  registers = 0.02 * jax.random.normal(rng, (1, count, config.width), jnp.float32)
  return (dataclasses.replace(config, num_registers=int(count)),
          dict(params, register_tokens=registers.astype(params["cls_token"].dtype)))
