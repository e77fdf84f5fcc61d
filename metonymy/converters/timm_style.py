"""timm-style ViT state dicts: DINOv1, MAE and DINOv2 (original repos and timm), plain timm ViTs.

These share one key scheme (`cls_token`, `pos_embed`, `patch_embed.proj`, `blocks.i.{norm1,
attn.qkv, attn.proj, ls1.gamma, norm2, mlp.fc1, mlp.fc2, ls2.gamma}`, `norm`) and differ in
what the keys cannot say: how the position table is resized at another resolution.

| layout          | told apart by                              | resize                              |
|-----------------|--------------------------------------------|-------------------------------------|
| dinov2/original | LayerScale + `mask_token`/`register_tokens`| 0.1 offset; antialias with registers|
| dinov2/timm     | LayerScale, no `mask_token`                | antialias                           |
| mae/original    | fixed 2D sin-cos table, torch file         | size, no antialias (MAE's util)     |
| mae/timm        | fixed 2D sin-cos table, safetensors        | antialias                           |
| dino/original   | neither, torch file                        | 0.1 offset                          |
| dino/timm       | neither, safetensors (timm hub files)      | antialias                           |
| timm_vit/timm   | only when asked (`--family timm_vit`)      | antialias                           |

DINOv1 original and timm files hold identical keys; only the file type separates them, so pass
`--family dino/timm` for a timm .pth (the outputs at native resolution are the same either way).
"""

from typing import Optional, Tuple

import numpy as np

from metonymy.converters import mapping
from metonymy.converters.io import CheckpointError, RawCheckpoint
from metonymy.converters.registry import Layout, register
from metonymy.models.vit import ViTConfig

BLOCK_NAMES = {
    "norm1": "blocks.{i}.norm1", "norm2": "blocks.{i}.norm2", "qkv": "blocks.{i}.attn.qkv",
    "proj": "blocks.{i}.attn.proj", "fc1": "blocks.{i}.mlp.fc1", "fc2": "blocks.{i}.mlp.fc2",
    "ls1": "blocks.{i}.ls1.gamma", "ls2": "blocks.{i}.ls2.gamma",
}
# Keys a backbone never uses: classifier heads, masked-modelling tokens.
IGNORED = ("head.*", "mask_token", "fc_norm.*", "head_drop.*")


def sincos_2d_table(grid: int, width: int) -> np.ndarray:
  """MAE's fixed 2D sin-cos table [grid * grid, width] (patch positions only)."""
  def one_axis(dim, positions):
    omega = 1.0 / 10000 ** (np.arange(dim // 2, dtype=np.float64) / (dim / 2.0))
    angles = np.einsum("m,d->md", positions.reshape(-1), omega)
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)
  gw, gh = np.meshgrid(np.arange(grid, dtype=np.float64), np.arange(grid, dtype=np.float64))
  # MAE stacks (w, h) and embeds the first with half the width, the second with the other half.
  return np.concatenate([one_axis(width // 2, gw), one_axis(width // 2, gh)], axis=1)


def _is_timm_style(raw: RawCheckpoint) -> bool:
  keys = raw.tensors
  # DINOv3 shares these names but has no absolute table (RoPE), so pos_embed is required;
  # timm's CLIP towers are the only timm ViTs with a pre-norm (`norm_pre`): clip.py takes them.
  return ("patch_embed.proj.weight" in keys and "blocks.0.attn.qkv.weight" in keys
          and "cls_token" in keys and "pos_embed" in keys and "norm_pre.weight" not in keys)


def _has_layer_scale(raw: RawCheckpoint) -> bool:
  return "blocks.0.ls1.gamma" in raw.tensors


def _has_sincos_table(raw: RawCheckpoint) -> bool:
  table = raw.tensors.get("pos_embed")
  if table is None or table.ndim != 3:
    return False
  num, width = table.shape[1:]
  side = int(round((num - 1) ** 0.5))
  if side * side != num - 1 or width % 4:
    return False
  return bool(np.allclose(table[0, 1:], sincos_2d_table(side, width), atol=1e-5))


def _positions(reader: mapping.KeyReader, width: int, num_registers: int
               ) -> Tuple[np.ndarray, Optional[np.ndarray], Tuple[int, int], np.ndarray]:
  """cls (with its position folded in), registers, patch grid and patch table."""
  cls = reader.get("cls_token", (1, 1, width))
  table = reader.get("pos_embed", (1, -1, width))
  num = table.shape[1]
  side = int(round(num ** 0.5))
  if side * side == num:  # timm's no_embed_class: the CLS position already lives in cls_token.
    patch_table = table
  else:
    grid_side = int(round((num - 1) ** 0.5))
    if grid_side * grid_side != num - 1:
      raise CheckpointError(f"{reader.source}: pos_embed has {num} positions: neither a square grid "
                            "nor a square grid plus CLS.")
    cls = cls + table[:, :1]
    patch_table = table[:, 1:]
  grid = mapping.square_grid(patch_table.shape[1], reader.source)
  registers = None
  if num_registers:
    key = mapping.first_present(reader, ("register_tokens", "reg_token"))
    registers = reader.get(key, (1, num_registers, width))
  return cls, registers, grid, patch_table


def convert_timm_style(reader: mapping.KeyReader, raw: RawCheckpoint, family: str,
                       resize: str, resize_with_registers: Optional[str] = None
                       ) -> Tuple[ViTConfig, dict]:
  tensors = raw.tensors
  patch_weight = reader.get("patch_embed.proj.weight", (-1, 3, -1, -1))
  width, _, patch, _ = patch_weight.shape
  depth = reader.count("blocks.{}.norm1.weight")
  mlp_dim = tensors["blocks.0.mlp.fc1.weight"].shape[0] if depth else 4 * width
  num_heads = mapping.infer_heads(width)
  reg_key = next((k for k in ("register_tokens", "reg_token") if k in tensors), None)
  num_registers = tensors[reg_key].shape[1] if reg_key else 0
  layer_scale = "blocks.0.ls1.gamma" in tensors
  qkv_bias = "blocks.0.attn.qkv.bias" in tensors
  cls, registers, grid, patch_table = _positions(reader, width, num_registers)
  if num_registers and resize_with_registers:
    resize = resize_with_registers
  config = ViTConfig(
      patch_size=patch, width=width, depth=depth, num_heads=num_heads, mlp_dim=mlp_dim,
      num_registers=num_registers, pos_embed_grid=grid, pos_embed_resize=resize,
      layer_scale=layer_scale, qkv_bias=qkv_bias, norm_eps=1e-6, image_size=grid[0] * patch,
      family=family)
  params = {
      "patch_embed": mapping.conv_patch_embed(patch_weight,
                                              reader.optional("patch_embed.proj.bias", (width,))),
      "cls_token": cls,
      "pos_embed": patch_table,
      "norm": mapping.layer_norm(reader.get("norm.weight", (width,)), reader.get("norm.bias", (width,))),
  }
  if registers is not None:
    params["register_tokens"] = registers
  for i in range(depth):
    params[f"blocks_{i}"] = mapping.block(reader, BLOCK_NAMES, i, width, num_heads, mlp_dim,
                                          qkv_bias=qkv_bias, layer_scale=layer_scale)
  reader.ignore(*IGNORED)
  return config, params


def _layout(family, name, detect, resize, resize_with_registers=None, description=""):
  return register(Layout(
      family=family, name=name, detect=detect, description=description,
      convert=lambda reader, raw: convert_timm_style(reader, raw, family, resize,
                                                     resize_with_registers)))


_torch_file = lambda raw: raw.file_format == "torch"

_layout("dinov2", "original",
        lambda raw: (_is_timm_style(raw) and _has_layer_scale(raw)
                     and ("mask_token" in raw.tensors or "register_tokens" in raw.tensors)),
        "scale_offset", resize_with_registers="size_antialias",
        description="facebookresearch/dinov2 hub .pth (ViT-B/14, optionally 4 registers)")
_layout("dinov2", "timm", lambda raw: _is_timm_style(raw) and _has_layer_scale(raw),
        "size_antialias", description="timm vit_base_patch14_(reg4_)dinov2")
_layout("mae", "original",
        lambda raw: _is_timm_style(raw) and _torch_file(raw) and _has_sincos_table(raw),
        "size", description="facebookresearch/mae mae_pretrain_vit_base.pth (encoder under 'model')")
_layout("mae", "timm", lambda raw: _is_timm_style(raw) and _has_sincos_table(raw),
        "size_antialias", description="timm vit_base_patch16_224.mae")
_layout("dino", "original", lambda raw: _is_timm_style(raw) and _torch_file(raw),
        "scale_offset", description="facebookresearch/dino dino_vitbase16_pretrain.pth")
_layout("dino", "timm", _is_timm_style, "size_antialias",
        description="timm vit_base_patch16_224.dino (safetensors)")
_layout("timm_vit", "timm", lambda raw: False, "size_antialias",
        description="any plain timm ViT state dict (SelfPatch, DenseSSL, CLIPpy-style); "
                    "explicit --family timm_vit only")
