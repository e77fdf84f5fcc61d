"""SAM image encoders: the original `sam_vit_*.pth`, Hugging Face `SamModel` / `SamVisionModel`,
and timm's `samvit_*_patch16`.

| layout       | keys                                                              | block eps |
|--------------|-------------------------------------------------------------------|-----------|
| sam/original | `[image_encoder.]{patch_embed.proj, pos_embed, blocks.i.{norm1,    | 1e-6      |
|              | attn.{qkv, proj, rel_pos_h, rel_pos_w}, norm2, mlp.lin1, mlp.lin2},|           |
|              | neck.{0, 1, 2, 3}}`                                               |           |
| sam/hf       | `[vision_encoder.]{patch_embed.projection, pos_embed, layers.i.{   | config    |
|              | layer_norm1, attn.*, layer_norm2, mlp.lin1, mlp.lin2}, neck.{conv1,|           |
|              | layer_norm1, conv2, layer_norm2}}`                                |           |
| sam/timm     | the original's names without the prefix, `mlp.fc1` / `mlp.fc2`     | 1e-5      |

The full SAM checkpoint's prompt encoder and mask decoder (HF: also `shared_image_embedding`)
are dropped, as is timm's classifier `head`. `pos_embed` is stored [1, 64, 64, D] (NHWC).

What the keys do not say, and where it comes from:
  * which blocks are global: HF's config (`global_attn_indexes`); otherwise the blocks whose
    relative tables are longer than the windowed ones (2 * 64 - 1 = 127 against 2 * 14 - 1 = 27);
  * the window: HF's `window_size`; otherwise (L + 1) / 2 of the windowed blocks' tables;
  * heads: width / the tables' head dimension (HF: `num_attention_heads`);
  * the blocks' LayerNorm eps: SAM's `build_sam` uses 1e-6; timm's `VisionTransformerSAM` passes
    `nn.LayerNorm` (1e-5) to its blocks, so sam/timm computes with 1e-5 to match timm; the neck's
    LayerNorm2d is 1e-6 everywhere.
The absolute table is resized like timm's (see models/sam_encoder.py) in every layout, so the same
weights give the same features whichever file they come from (up to the eps above).
"""

from typing import Dict, Optional, Tuple

import numpy as np

from metonymy.converters import mapping
from metonymy.converters.io import CheckpointError, RawCheckpoint
from metonymy.converters.registry import Layout, register
from metonymy.models.sam_encoder import SamEncoderConfig

# Our role -> key template (after the layout's prefix), per layout.
_NAMES = {
    "original": {
        "patch": "patch_embed.proj", "blocks": "blocks.{}", "norm1": "norm1", "norm2": "norm2",
        "attn": "attn", "fc1": "mlp.lin1", "fc2": "mlp.lin2",
        "neck": ("neck.0", "neck.1", "neck.2", "neck.3"),
    },
    "timm": {
        "patch": "patch_embed.proj", "blocks": "blocks.{}", "norm1": "norm1", "norm2": "norm2",
        "attn": "attn", "fc1": "mlp.fc1", "fc2": "mlp.fc2",
        "neck": ("neck.0", "neck.1", "neck.2", "neck.3"),
    },
    "hf": {
        "patch": "patch_embed.projection", "blocks": "layers.{}", "norm1": "layer_norm1",
        "norm2": "layer_norm2", "attn": "attn", "fc1": "mlp.lin1", "fc2": "mlp.lin2",
        "neck": ("neck.conv1", "neck.layer_norm1", "neck.conv2", "neck.layer_norm2"),
    },
}
_PREFIXES = {"original": ("image_encoder.", ""), "timm": ("",), "hf": ("vision_encoder.", "")}
# Keys of the full models that are not the image encoder.
_IGNORED = {
    "original": ("prompt_encoder.*", "mask_decoder.*", "pixel_mean", "pixel_std"),
    "timm": ("head.*",),
    "hf": ("prompt_encoder.*", "mask_decoder.*", "shared_image_embedding.*"),
}
_TIMM_BLOCK_EPS = 1e-5


def _prefix(raw: RawCheckpoint, layout: str) -> Optional[str]:
  names = _NAMES[layout]
  block0 = names["blocks"].format(0)
  for prefix in _PREFIXES[layout]:
    if all(prefix + k in raw.tensors for k in (
        names["patch"] + ".weight", "pos_embed", f"{block0}.attn.rel_pos_h",
        f"{block0}.{names['fc1']}.weight", names["neck"][0] + ".weight")):
      return prefix
  return None


def _hf_vision_config(raw: RawCheckpoint) -> dict:
  config = raw.hf_config or {}
  return config.get("vision_config") or config


def _windows(reader: mapping.KeyReader, p: str, names: Dict, depth: int, grid: Tuple[int, int],
             hf: dict) -> Tuple[int, Tuple[int, ...]]:
  """(window size, global block indices), from the HF config or the relative tables' lengths."""
  if "window_size" in hf and "global_attn_indexes" in hf:
    return int(hf["window_size"]), tuple(int(i) for i in hf["global_attn_indexes"])
  lengths = []
  for i in range(depth):
    table = reader.tensors.get(p + names["blocks"].format(i) + ".attn.rel_pos_h")
    lengths.append(None if table is None else table.shape[0])
  known = [n for n in lengths if n is not None]
  if not known:
    raise CheckpointError(f"{reader.source}: no relative position tables (`rel_pos_h`); SAM's "
                          "encoder needs them")
  global_length = 2 * grid[0] - 1
  windowed = [n for n in known if n != global_length]
  window = (min(windowed) + 1) // 2 if windowed else grid[0]
  global_blocks = tuple(i for i, n in enumerate(lengths) if n == global_length and windowed)
  return window, global_blocks


def convert(reader: mapping.KeyReader, raw: RawCheckpoint, layout: str
            ) -> Tuple[SamEncoderConfig, dict]:
  names = _NAMES[layout]
  p = _prefix(raw, layout)
  if p is None:  # Named explicitly but the anchors are absent: say which.
    p = _PREFIXES[layout][0]
    anchor = p + names["patch"] + ".weight"
    if not reader.has(anchor):
      raise CheckpointError(f"{reader.source}: layout sam/{layout} needs {anchor!r}; first keys: "
                            f"{sorted(reader.tensors)[:12]}")
  hf = _hf_vision_config(raw) if layout == "hf" else {}
  if hf.get("hidden_act", "gelu") != "gelu":
    raise CheckpointError(f"{reader.source}: hidden_act {hf['hidden_act']!r}; SAM's encoder here "
                          "has the exact GELU")
  for flag, expected in (("use_abs_pos", True), ("use_rel_pos", True)):
    if hf.get(flag, expected) != expected:
      raise CheckpointError(f"{reader.source}: {flag}={hf[flag]} is not supported")
  patch_weight = reader.get(p + names["patch"] + ".weight", (-1, 3, -1, -1))
  width, _, patch, _ = patch_weight.shape
  table = reader.get(p + "pos_embed", (1, -1, -1, width))
  grid = tuple(table.shape[1:3])
  block = lambda i: p + names["blocks"].format(i)
  depth = reader.count(f"{p}{names['blocks']}.{names['norm1']}.weight")
  fc1 = reader.tensors.get(block(0) + f".{names['fc1']}.weight")
  mlp_dim = fc1.shape[0] if fc1 is not None else 4 * width
  rel0 = reader.tensors.get(block(0) + ".attn.rel_pos_h")
  if "num_attention_heads" in hf:
    num_heads = int(hf["num_attention_heads"])
  elif rel0 is not None and rel0.ndim == 2 and width % rel0.shape[1] == 0:
    num_heads = width // rel0.shape[1]
  else:
    num_heads = mapping.infer_heads(width)
  head_dim = width // num_heads
  window, global_blocks = _windows(reader, p, names, depth, grid, hf)
  qkv_bias = reader.has(block(0) + ".attn.qkv.bias")
  neck = [p + n for n in names["neck"]]
  out_channels = reader.tensors[neck[0] + ".weight"].shape[0] if reader.has(
      neck[0] + ".weight") else 256
  eps = float(hf.get("layer_norm_eps", _TIMM_BLOCK_EPS if layout == "timm" else 1e-6))
  config = SamEncoderConfig(
      patch_size=patch, width=width, depth=depth, num_heads=num_heads, mlp_dim=mlp_dim,
      window_size=window, global_blocks=global_blocks, pos_embed_grid=grid,
      out_channels=out_channels, qkv_bias=qkv_bias, norm_eps=eps, image_size=grid[0] * patch)
  norm = lambda key, n: mapping.layer_norm(reader.get(key + ".weight", (n,)),
                                           reader.get(key + ".bias", (n,)))
  linear = lambda key, shape: mapping.dense(reader.get(key + ".weight", shape),
                                            reader.get(key + ".bias", shape[:1]))
  conv = lambda key, shape: {"kernel": np.ascontiguousarray(
      reader.get(key + ".weight", shape).transpose(2, 3, 1, 0))}
  params = {
      "patch_embed": mapping.conv_patch_embed(
          patch_weight, reader.optional(p + names["patch"] + ".bias", (width,))),
      "pos_embed": table.reshape(1, grid[0] * grid[1], width),
      "neck_conv1": conv(neck[0], (out_channels, width, 1, 1)),
      "neck_norm1": norm(neck[1], out_channels),
      "neck_conv2": conv(neck[2], (out_channels, out_channels, 3, 3)),
      "neck_norm2": norm(neck[3], out_channels),
  }
  for i in range(depth):
    b = block(i)
    size = grid if i in global_blocks else (window, window)
    attn = mapping.attention(
        reader.get(b + ".attn.qkv.weight", (3 * width, width)),
        reader.get(b + ".attn.qkv.bias", (3 * width,)) if qkv_bias else None,
        reader.get(b + ".attn.proj.weight", (width, width)),
        reader.get(b + ".attn.proj.bias", (width,)), num_heads)
    attn["rel_pos_h"] = reader.get(b + ".attn.rel_pos_h", (2 * size[0] - 1, head_dim))
    attn["rel_pos_w"] = reader.get(b + ".attn.rel_pos_w", (2 * size[1] - 1, head_dim))
    params[f"blocks_{i}"] = {
        "norm1": norm(f"{b}.{names['norm1']}", width),
        "norm2": norm(f"{b}.{names['norm2']}", width),
        "attn": attn,
        "mlp": {"fc1": linear(f"{b}.{names['fc1']}", (mlp_dim, width)),
                "fc2": linear(f"{b}.{names['fc2']}", (width, mlp_dim))},
    }
  if p or layout != "original":
    reader.ignore(*_IGNORED[layout])
  return config, params


def _layout(name: str, description: str, detect=None) -> Layout:
  return register(Layout(
      family="sam", name=name, description=description,
      detect=detect or (lambda raw: _prefix(raw, name) is not None),
      convert=lambda reader, raw: convert(reader, raw, name)))


_layout("original", "facebookresearch/segment-anything sam_vit_{b,l,h}_*.pth (`image_encoder.*`, "
        "or the encoder's own state dict)")
_layout("hf", "HF SamModel / SamVisionModel (`vision_encoder.*`); windows from config.json")
_layout("timm", "timm samvit_{base,large,huge}_patch16 (block LayerNorm eps 1e-5, as timm)")
