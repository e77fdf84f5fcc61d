"""SAM's ViT image encoder (Segment Anything, ViT-B/L/H) in Flax, for late-masked part features.

  model = SamImageEncoder(get_config("sam_vit_b16"))
  out = model.apply({"params": params}, images)   # images [B, H, W, 3], H, W multiples of 16
  out["patch_tokens"]     # [B, N, 256]: the neck's output, channels last, flattened row-major
  out["pre_neck_tokens"]  # [B, N, 768]: the last block's tokens (SAM has no final norm)
  out["prefix_tokens"]    # [B, 0, 256]: SAM has no CLS or register token

The network (segment_anything/modeling/image_encoder.py `ImageEncoderViT`, HF `SamVisionEncoder`,
timm `VisionTransformerSAM`): patch embedding, an absolute position table over the 64 x 64 grid
of a 1024 px input, pre-norm blocks whose attention runs in 14 x 14 windows except in the global
blocks (2, 5, 8, 11 for ViT-B) and adds decomposed relative position biases, then a neck:
conv 1x1 -> LayerNorm2d -> conv 3x3 -> LayerNorm2d, down to 256 channels. The LayerNorm, Mlp and
position-table resizing are the ViT's (vit.py, pos_embed.py); the attention keeps the ViT's
parameter layout (so weight import shares `mapping.attention`) and adds the relative biases.

Other input sizes (any multiple of 16, e.g. 224 for the leakage benchmark):
  * windowed blocks pad the grid with zeros (after norm1) to a multiple of the window, and the
    padding tokens take part in the window's attention as keys, exactly as SAM does;
  * the relative tables are resized by SAM's own `get_rel_pos`: torch `interpolate(mode="linear")`
    to length 2 * size - 1 (only the global blocks' tables change: 127 -> 27 at 224 px);
  * the absolute table is resized as timm's `resample_abs_pos_embed_nhwc` does (bicubic,
    antialias; "size_antialias"), the one reference that resizes it: SAM's and HF's code add the
    64 x 64 table as is and run at 1024 px only.

Early masking: SAM has no aggregation token whose copies could pool a part (paper Sec. 5.2), so
`part_ids` is refused unless the config opts into `part_pooling`: then every attention (inside
the windows and in the global blocks) is block-diagonal over the parts (a query sees the keys
of its own part, and SAM's zero padding tokens, which carry no image), the neck's 3x3 conv reads
only the centre token's part (other parts are zero padding to it), and part k's feature is the
mean of its own neck tokens. Changing pixels outside part k's patches leaves it bit-identical
(tests/test_import_sam.py). None of the paper's code does this; it is an extension.
"""

import dataclasses
import functools
from typing import Any, Dict, Optional, Tuple

import einops
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from metonymy.models import attention as attention_lib
from metonymy.models import attention_masks
from metonymy.models import pos_embed as pos_lib
from metonymy.models import vit

SAM_MEAN = (0.485, 0.456, 0.406)  # segment_anything's pixel_mean (123.675, 116.28, 103.53) / 255.
SAM_STD = (0.229, 0.224, 0.225)  # pixel_std (58.395, 57.12, 57.375) / 255.

EARLY_MASKING_REFUSAL = (
    "early masking needs an aggregation token (CLS) whose per-part copies pool each part; SAM's "
    "image encoder has none (paper Sec. 5.2), so only late masking is defined for it: set "
    "features.maskings=('late',), or opt into pooling each part's own tokens of a block-masked "
    "forward (not the paper's method) with SamEncoderConfig.part_pooling=True "
    "(--config.backbone.part_pooling=True).")


@dataclasses.dataclass(frozen=True)
class SamEncoderConfig(vit.ArchitectureConfig):
  """Architecture of SAM's image encoder. Hashable, JSON-serializable, saved beside weights.

  Field names follow ViTConfig where the meaning is the same (vit.Mlp and vit._layer_norm read
  `width`, `mlp_dim`, `activation`, `norm_eps`).
  """
  TUPLE_KEYS = ("global_blocks", "pos_embed_grid", "image_mean", "image_std")
  patch_size: int = 16
  width: int = 768
  depth: int = 12
  num_heads: int = 12
  mlp_dim: int = 3072
  window_size: int = 14
  global_blocks: Tuple[int, ...] = (2, 5, 8, 11)
  pos_embed_grid: Tuple[int, int] = (64, 64)  # Also the global blocks' relative-table grid.
  pos_embed_resize: str = "size_antialias"
  out_channels: int = 256
  qkv_bias: bool = True
  activation: str = "gelu"
  norm_eps: float = 1e-6  # Blocks' LayerNorms (SAM 1e-6; timm's samvit builds them with 1e-5).
  neck_eps: float = 1e-6  # LayerNorm2d of the neck.
  image_size: int = 1024
  image_mean: Tuple[float, float, float] = SAM_MEAN
  image_std: Tuple[float, float, float] = SAM_STD
  family: str = "sam"
  # Opt-in early masking by pooling each part's own tokens of a block-masked forward (module doc).
  part_pooling: bool = False

  def __post_init__(self):
    if self.width % self.num_heads:
      raise ValueError(f"width {self.width} is not divisible by num_heads {self.num_heads}")
    if self.pos_embed_resize not in pos_lib.RESIZE_MODES:
      raise ValueError(f"pos_embed_resize must be one of {pos_lib.RESIZE_MODES}, "
                       f"got {self.pos_embed_resize!r}")
    bad = [i for i in self.global_blocks if not 0 <= i < self.depth]
    if bad:
      raise ValueError(f"global_blocks {bad} are not blocks of a depth-{self.depth} encoder")
    if self.window_size < 1:
      raise ValueError(f"window_size must be positive, got {self.window_size}")

  @property
  def num_prefix(self) -> int:
    return 0  # No CLS, no registers.

  @property
  def early_masking(self) -> bool:
    """Whether `part_ids` is accepted (probe/benchmark.py asks before extracting)."""
    return self.part_pooling

  @property
  def head_dim(self) -> int:
    return self.width // self.num_heads

  def block_window(self, index: int) -> int:
    """The attention window of block `index`; 0 for a global block."""
    return 0 if index in self.global_blocks else self.window_size



PRESETS: Dict[str, SamEncoderConfig] = {
    "sam_tiny_test": SamEncoderConfig(width=64, depth=4, num_heads=4, mlp_dim=128, window_size=4,
                                      global_blocks=(1, 3), pos_embed_grid=(8, 8),
                                      out_channels=32, image_size=128),
    "sam_vit_b16": SamEncoderConfig(),
    "sam_vit_l16": SamEncoderConfig(width=1024, depth=24, num_heads=16, mlp_dim=4096,
                                    global_blocks=(5, 11, 17, 23)),
    "sam_vit_h16": SamEncoderConfig(width=1280, depth=32, num_heads=16, mlp_dim=5120,
                                    global_blocks=(7, 15, 23, 31)),
}


def get_config(name: str, **overrides) -> SamEncoderConfig:
  if name not in PRESETS:
    raise ValueError(f"Unknown SAM preset {name!r}; known presets: {sorted(PRESETS)}.")
  return PRESETS[name].replace(**overrides)


# ------------------------------------------------------------------------------------------------
# Relative position tables, resized and gathered as SAM's `get_rel_pos` does.


@functools.lru_cache(maxsize=64)
def linear_resize_matrix(in_size: int, out_size: int) -> np.ndarray:
  """[out, in] matrix of torch `interpolate(mode="linear", align_corners=False)` in float32.

  aten upsample_linear1d: source = scale * (i + 0.5) - 0.5 with scale = in / out, clamped at 0;
  taps floor(source) and the next one (clamped at the end), weights 1 - t and t.
  """
  matrix = np.zeros((out_size, in_size), np.float32)
  if in_size == out_size:
    np.fill_diagonal(matrix, 1.0)
    return matrix
  scale = np.float32(in_size / out_size)
  source = scale * (np.arange(out_size, dtype=np.float32) + np.float32(0.5)) - np.float32(0.5)
  source = np.maximum(source, np.float32(0.0))
  low = np.floor(source).astype(np.int64)
  high = np.minimum(low + 1, in_size - 1)
  t = (source - low).astype(np.float32)
  rows = np.arange(out_size)
  np.add.at(matrix, (rows, low), np.float32(1.0) - t)
  np.add.at(matrix, (rows, high), t)
  return matrix


@functools.lru_cache(maxsize=64)
def rel_pos_gather(size: int, table_length: int) -> np.ndarray:
  """[size, size, table_length] float32 G with R[i, j] = sum_l G[i, j, l] table[l], i.e. SAM's
  `get_rel_pos(size, size, table)`: the table resized to 2 * size - 1, read at i - j + size - 1."""
  resize = linear_resize_matrix(table_length, 2 * size - 1)
  offsets = np.arange(size)[:, None] - np.arange(size)[None, :] + size - 1
  return resize[offsets]


def decomposed_rel_pos_bias(q: jnp.ndarray, table_h: jnp.ndarray, table_w: jnp.ndarray,
                            grid: Tuple[int, int]) -> jnp.ndarray:
  """MViTv2's decomposed bias of SAM: [B, heads, L, L] from q [B, L, heads, head_dim] (unscaled).

  bias[b, h, (y, x), (ky, kx)] = q . Rh[y, ky] + q . Rw[x, kx].
  """
  height, width = grid
  batch, _, heads, head_dim = q.shape
  rh = jnp.einsum("ykl,lc->ykc", rel_pos_gather(height, table_h.shape[0]), table_h,
                  precision="highest").astype(q.dtype)
  rw = jnp.einsum("xkl,lc->xkc", rel_pos_gather(width, table_w.shape[0]), table_w,
                  precision="highest").astype(q.dtype)
  q = q.reshape(batch, height, width, heads, head_dim)
  rel_h = jnp.einsum("byxhc,ykc->bhyxk", q, rh)
  rel_w = jnp.einsum("byxhc,xkc->bhyxk", q, rw)
  bias = rel_h[..., :, None] + rel_w[..., None, :]
  return bias.reshape(batch, heads, height * width, height * width)


# ------------------------------------------------------------------------------------------------
# Windows.


def window_partition(x: jnp.ndarray, window: int, pad_value=0) -> jnp.ndarray:
  """[B, H, W, C] -> [B * nWindows, window * window, C], padded (zeros) to multiples of `window`."""
  height, width = x.shape[1:3]
  pad_h, pad_w = -height % window, -width % window
  x = jnp.pad(x, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), constant_values=pad_value)
  return einops.rearrange(x, "b (r h) (c w) d -> (b r c) (h w) d", h=window, w=window)


PAD_GROUP = -1  # Group id of the windows' padding tokens.


def part_mask(groups: jnp.ndarray) -> jnp.ndarray:
  """bool [B, 1, L, L] from group ids [B, L]: same part, or a padding token (id -1) on either
  side (SAM's zero padding holds no image, so every query may see it, as in SAM's forward)."""
  pad = groups == PAD_GROUP
  return ((groups[:, :, None] == groups[:, None, :]) | pad[:, :, None] | pad[:, None, :])[:, None]


def window_unpartition(windows: jnp.ndarray, window: int, grid: Tuple[int, int]) -> jnp.ndarray:
  """Inverse of `window_partition`: [B * nWindows, window * window, C] -> [B, H, W, C]."""
  height, width = grid
  rows, cols = -(-height // window), -(-width // window)
  x = einops.rearrange(windows, "(b r c) (h w) d -> b (r h) (c w) d", r=rows, c=cols, h=window)
  return x[:, :height, :width]


# ------------------------------------------------------------------------------------------------
# Modules.


class RelPosAttention(nn.Module):
  """Self-attention over a [B, h, w] grid with SAM's decomposed relative position biases.

  Parameters as vit.Attention (qkv_kernel [D, 3, heads, head_dim], qkv_bias, out_kernel,
  out_bias) plus rel_pos_h / rel_pos_w [2 * S - 1, head_dim], S the grid the block was trained on
  (the window, or the full 64 x 64 grid for a global block).
  """
  config: SamEncoderConfig
  table_grid: Tuple[int, int]
  dtype: Any = jnp.float32
  attention_impl: Optional[str] = None

  @nn.compact
  def __call__(self, x: jnp.ndarray, grid: Tuple[int, int],
               mask: Optional[jnp.ndarray] = None) -> jnp.ndarray:
    """x: [B, h * w, D] tokens of one window (or the whole grid), row-major; mask: optional
    bool [B, 1, L, L], True = attend (part pooling)."""
    cfg = self.config
    heads, head_dim = cfg.num_heads, cfg.head_dim
    kernel = self.param("qkv_kernel", nn.initializers.lecun_normal(batch_axis=()),
                        (cfg.width, 3, heads, head_dim))
    qkv = jnp.einsum("bld,dthe->blthe", x, kernel.astype(self.dtype))
    if cfg.qkv_bias:
      qkv = qkv + self.param("qkv_bias", nn.initializers.zeros, (3, heads, head_dim)).astype(
          self.dtype)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    table_h = self.param("rel_pos_h", nn.initializers.zeros, (2 * self.table_grid[0] - 1, head_dim))
    table_w = self.param("rel_pos_w", nn.initializers.zeros, (2 * self.table_grid[1] - 1, head_dim))
    bias = decomposed_rel_pos_bias(q, table_h, table_w, grid)
    out = attention_lib.dot_product_attention(q, k, v, mask=mask, bias=bias,
                                              implementation=self.attention_impl)
    out_kernel = self.param("out_kernel", nn.initializers.lecun_normal(batch_axis=()),
                            (heads, head_dim, cfg.width))
    batch, length = out.shape[:2]
    out = out.reshape(batch, length, heads * head_dim) @ out_kernel.reshape(
        heads * head_dim, cfg.width).astype(self.dtype)
    return out + self.param("out_bias", nn.initializers.zeros, (cfg.width,)).astype(self.dtype)


class SamBlock(nn.Module):
  """x += attn(norm1(x)) in windows (or globally); x += mlp(norm2(x)). x: [B, h, w, D];
  groups: optional int [B, h, w] part ids, for the block-masked forward of part pooling."""
  config: SamEncoderConfig
  window: int  # 0: global attention.
  dtype: Any = jnp.float32
  attention_impl: Optional[str] = None

  @nn.compact
  def __call__(self, x: jnp.ndarray, groups: Optional[jnp.ndarray] = None) -> jnp.ndarray:
    cfg = self.config
    batch, height, width, channels = x.shape
    table_grid = (self.window, self.window) if self.window else cfg.pos_embed_grid
    attn = RelPosAttention(cfg, table_grid, self.dtype, self.attention_impl, name="attn")
    layer_norm = functools.partial(vit._layer_norm, cfg)  # pylint: disable=protected-access
    y = layer_norm("norm1")(x)
    if self.window:
      mask = None if groups is None else part_mask(
          window_partition(groups[..., None], self.window, PAD_GROUP)[..., 0])
      y = attn(window_partition(y, self.window), (self.window, self.window), mask)
      y = window_unpartition(y, self.window, (height, width))
    else:
      mask = None if groups is None else part_mask(groups.reshape(batch, height * width))
      y = attn(y.reshape(batch, height * width, channels), (height, width), mask)
      y = y.reshape(batch, height, width, channels)
    x = x + y
    return x + vit.Mlp(cfg, self.dtype, name="mlp")(layer_norm("norm2")(x))


class SamImageEncoder(nn.Module):
  """SAM's image encoder with vit.VisionTransformer's plain-forward contract; `part_ids` only
  with the opt-in part pooling (the module docstring).

  Attributes:
    config: the architecture.
    dtype: compute dtype (parameters stay float32).
    attention_impl: None = attention.xla_attention; else `jax.nn.dot_product_attention`'s.
  """
  config: SamEncoderConfig
  dtype: Any = jnp.float32
  attention_impl: Optional[str] = None

  def patch_grid(self, image_shape) -> Tuple[int, int]:
    height, width = image_shape[1], image_shape[2]
    p = self.config.patch_size
    if height % p or width % p:
      raise ValueError(f"Image size {height}x{width} is not a multiple of the patch size {p}.")
    return height // p, width // p

  @nn.compact
  def __call__(self, images: jnp.ndarray, part_ids: Optional[jnp.ndarray] = None,
               num_parts: Optional[int] = None, return_intermediates: bool = False,
               **unsupported) -> Dict[str, Any]:
    """Plain forward of images float [B, H, W, 3] (normalized), or with part_ids the
    block-masked forward of part pooling (only when config.part_pooling).

    Args:
      images: float32 [B, H, W, 3], already normalized.
      part_ids: optional int [B, h, w] on the patch grid, values in [0, K]; K is the background.
      num_parts: K (static); required under jit, else inferred as max(part_ids).
      return_intermediates: also return every block's [B, N, D] tokens.

    Returns:
      `patch_tokens [B, N, out_channels]` (the neck's output), `pre_neck_tokens [B, N, D]`,
      `prefix_tokens [B, 0, out_channels]`; with part_ids, `part_tokens [B, K + 1, 1,
      out_channels]` (the mean of each part's own neck tokens; 0 for a part with no patch) and
      `prefix_tokens` = those, [B, K + 1, out_channels].
    """
    if unsupported:
      raise ValueError(f"SamImageEncoder takes no {sorted(unsupported)}: those are the ViT's "
                       "early-masking options.")
    cfg = self.config
    grid = self.patch_grid(images.shape)
    batch = images.shape[0]
    groups = None
    if part_ids is not None:
      if not cfg.part_pooling:
        raise ValueError(f"SamImageEncoder: {EARLY_MASKING_REFUSAL}")
      num_parts = attention_masks.checked_num_parts(part_ids, num_parts, (batch,) + grid)
      groups = jnp.asarray(part_ids, jnp.int32)
    x = nn.Conv(cfg.width, (cfg.patch_size,) * 2, strides=(cfg.patch_size,) * 2, padding="VALID",
                dtype=self.dtype, name="patch_embed")(images.astype(self.dtype))
    table = self.param("pos_embed", nn.initializers.zeros,
                       (1, cfg.pos_embed_grid[0] * cfg.pos_embed_grid[1], cfg.width))
    table = pos_lib.resize_grid_embedding(table, cfg.pos_embed_grid, grid, cfg.pos_embed_resize)
    x = x + table.reshape(1, grid[0], grid[1], cfg.width).astype(self.dtype)
    intermediates = []
    for i in range(cfg.depth):
      x = SamBlock(cfg, cfg.block_window(i), self.dtype, self.attention_impl,
                   name=f"blocks_{i}")(x, groups)
      if return_intermediates:
        intermediates.append(x.reshape(batch, -1, cfg.width))
    pre_neck = x.reshape(batch, -1, cfg.width)
    neck_norm = lambda name: nn.LayerNorm(epsilon=cfg.neck_eps, use_fast_variance=False, name=name)
    y = nn.Conv(cfg.out_channels, (1, 1), use_bias=False, dtype=self.dtype, name="neck_conv1")(x)
    y = neck_norm("neck_norm1")(y)
    conv2 = nn.Conv(cfg.out_channels, (3, 3), padding=((1, 1), (1, 1)), use_bias=False,
                    dtype=self.dtype, name="neck_conv2")
    if groups is None:
      y = conv2(y)
    else:  # Each part's tokens see only their own part's neighbours (others read as padding).
      parts = [(groups == g)[..., None] for g in range(num_parts + 1)]
      y = sum(jnp.where(inside, conv2(jnp.where(inside, y, 0)), 0) for inside in parts)
    y = neck_norm("neck_norm2")(y)
    patch_tokens = y.reshape(batch, -1, cfg.out_channels)
    out = {"patch_tokens": patch_tokens, "pre_neck_tokens": pre_neck,
           "prefix_tokens": jnp.zeros((batch, 0, cfg.out_channels), patch_tokens.dtype)}
    if groups is not None:
      onehot = (groups.reshape(batch, -1)[..., None] == jnp.arange(num_parts + 1)).astype(
          patch_tokens.dtype)  # [B, N, K + 1]
      pooled = jnp.einsum("bng,bnd->bgd", onehot, patch_tokens)
      pooled = pooled / jnp.maximum(onehot.sum(1), 1.0)[..., None]
      out["prefix_tokens"] = pooled
      out["part_tokens"] = pooled[:, :, None]
    if return_intermediates:
      out["intermediates"] = intermediates
    return out


def init_params(config: SamEncoderConfig, rng: Optional[jax.Array] = None,
                image_size: Optional[int] = None):
  """(model, random parameters) of `config`; position and relative tables start at zero as in
  SAM, so random-init runs add small noise to them (rng) to make positions matter."""
  rng = jax.random.PRNGKey(0) if rng is None else rng
  size = image_size or config.image_size
  size = size - size % config.patch_size or config.patch_size
  model = SamImageEncoder(config)
  init_rng, noise_rng = jax.random.split(rng)
  params = jax.jit(model.init)(init_rng, jnp.zeros((1, size, size, 3), jnp.float32))["params"]
  noise = np.random.default_rng(np.asarray(jax.random.key_data(noise_rng)).ravel().tolist())

  def add_noise(path, leaf):
    if any(n in jax.tree_util.keystr(path) for n in ("pos_embed", "rel_pos")):
      return leaf + jnp.asarray(0.02 * noise.standard_normal(leaf.shape), leaf.dtype)
    return leaf
  return model, jax.tree_util.tree_map_with_path(add_noise, params)


# Cached (the configs are frozen dataclasses): every load of a converted folder checks it against
# these, and tracing the model's init for them costs a fraction of a second each time. Callers
# must not change the returned tree.
@functools.lru_cache(maxsize=32)
def param_shapes(config: SamEncoderConfig, image_size: Optional[int] = None):
  """The parameter tree of `config` as ShapeDtypeStructs, without allocating anything."""
  size = image_size or config.patch_size * 2
  size = size - size % config.patch_size or config.patch_size
  model = SamImageEncoder(config)
  return jax.eval_shape(model.init, jax.random.PRNGKey(0),
                        jax.ShapeDtypeStruct((1, size, size, 3), jnp.float32))["params"]
