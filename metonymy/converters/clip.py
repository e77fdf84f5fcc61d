"""CLIP ViT image towers: OpenAI's state dict, Hugging Face CLIP, and timm's CLIP ViTs.

All three hold the same network (ln_pre before block 0, no patch bias, eps 1e-5, a final
ln_post applied to every token, a bias-free projection of the normed CLS) under different names:

| layout         | keys                                                     | act    | resize     |
|----------------|----------------------------------------------------------|--------|------------|
| clip/openai    | `[visual.]{conv1, class_embedding, positional_embedding, | QGELU  | size       |
|                | ln_pre, transformer.resblocks.i.*, ln_post, proj}`       |        |            |
| clip/hf        | `[vision_model.]{embeddings.*, pre_layrnorm,             | config | size       |
|                | encoder.layers.i.*, post_layernorm}`, `visual_projection`|        |            |
| clip/timm      | timm ViT keys + `norm_pre` (`vit_*_clip_quickgelu_*`)    | QGELU  | size_antia.|
| clip/timm_gelu | the same keys (`vit_*_clip_*`), explicit family only     | GELU   | size_antia.|

(size_antia. = "size_antialias").

Our outputs: `prefix_tokens` / `patch_tokens` are after ln_post (OpenAI and HF apply it to the
CLS only; HF's `last_hidden_state` is *before* `post_layernorm`), and `projection` is
`ln_post(CLS) @ proj`, i.e. OpenAI's `encode_image` and HF's `image_embeds`.

Position-table resizing at another resolution:
  * OpenAI's `clip/model.py` adds `positional_embedding` as is and cannot run at another size; we
    follow Hugging Face (`size=(h, w)`, bicubic, `align_corners=False`, no antialias), so the two
    layouts of the same weights agree everywhere.
  * HF: `CLIPVisionEmbeddings.interpolate_pos_encoding` (transformers 5.24,
    models/clip/modeling_clip.py, the `nn.functional.interpolate(..., size=(new_height,
    new_width), mode="bicubic", align_corners=False)` call): "size".
  * timm: `resample_abs_pos_embed` (timm/layers/pos_embed.py) defaults to `antialias=True`, both
    for `dynamic_img_size` and when loading at another `img_size`: "size_antialias".

Activation: the keys cannot tell QuickGELU from exact GELU. OpenAI's weights are all QuickGELU.
HF configs say it (`hidden_act`). timm ships the same weights files under two architectures:
`vit_base_patch16_clip_quickgelu_224` (QuickGELU; right for OpenAI and MetaCLIP weights, and
DFN's ViT-L/H) and `vit_base_patch16_clip_224` (exact GELU; right for open_clip's LAION-2B /
DataComp weights, DFN's ViT-B/16 and their ImageNet fine-tunes). The hub repository always has
the plain name (`timm/vit_base_patch16_clip_224.openai`): the quickgelu spelling exists only in
timm's `create_model`. Detection picks `clip/timm` (QuickGELU); pass `--family clip/timm_gelu`
for GELU-trained weights.

OpenAI's released `ViT-B-16.pt` is a TorchScript archive, which `torch.load(weights_only=True)`
refuses; `io.read_file` then reads it with `torch.jit.load(...).state_dict()`.
"""

from typing import Dict, Optional, Tuple

import numpy as np

from metonymy.converters import mapping
from metonymy.converters.io import CheckpointError, RawCheckpoint
from metonymy.converters.registry import Layout, register
from metonymy.converters.timm_style import BLOCK_NAMES as TIMM_BLOCK_NAMES
from metonymy.models.vit import ViTConfig

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
CLIP_EPS = 1e-5

# OpenAI full-model keys that belong to the text tower or the contrastive head.
_OPENAI_TEXT = ("transformer.*", "token_embedding.*", "positional_embedding", "ln_final.*",
                "text_projection", "logit_scale")
# Scalars a TorchScript archive keeps beside the weights (clip/model.py `build_model` drops them).
_OPENAI_META = ("input_resolution", "context_length", "vocab_size")
_HF_IGNORED = ("text_model.*", "text_projection.*", "logit_scale", "*position_ids")
_HF_ACTIVATIONS = {"quick_gelu": "quick_gelu", "gelu": "gelu"}  # HF "gelu" is the exact erf GELU.


def _require(reader: mapping.KeyReader, key: str, layout: str) -> None:
  """Fails early, with the keys that are there, when a layout's anchor key is absent.

  Without it a wrong layout would read zeros of placeholder shapes and fail on a derived
  quantity (heads of width 1) instead of naming the missing key.
  """
  if not reader.has(key):
    raise CheckpointError(f"{reader.source}: layout {layout} needs {key!r}; first keys: "
                          f"{sorted(reader.tensors)[:12]}")


def _norm(reader: mapping.KeyReader, prefix: str, width: int) -> Dict[str, np.ndarray]:
  return mapping.layer_norm(reader.get(prefix + ".weight", (width,)),
                            reader.get(prefix + ".bias", (width,)))


def _linear(reader: mapping.KeyReader, prefix: str, shape: Tuple[int, int]
            ) -> Dict[str, np.ndarray]:
  """torch Linear `prefix.{weight,bias}` of torch shape (out, in) -> Flax Dense."""
  return mapping.dense(reader.get(prefix + ".weight", shape),
                       reader.get(prefix + ".bias", shape[:1]))


def _block(reader: mapping.KeyReader, names: Dict[str, str], qkv: Tuple[np.ndarray, np.ndarray],
           width: int, num_heads: int, mlp_dim: int) -> Dict[str, object]:
  """One pre-norm block whose q/k/v were already read (fused (3D, D) weight, (3D,) bias).

  `names` holds full prefixes (block index filled in) for norm1, norm2, proj, fc1, fc2.
  """
  proj_weight = reader.get(names["proj"] + ".weight", (width, width))
  proj_bias = reader.get(names["proj"] + ".bias", (width,))
  return {
      "norm1": _norm(reader, names["norm1"], width),
      "norm2": _norm(reader, names["norm2"], width),
      "attn": mapping.attention(qkv[0], qkv[1], proj_weight, proj_bias, num_heads),
      "mlp": {"fc1": _linear(reader, names["fc1"], (mlp_dim, width)),
              "fc2": _linear(reader, names["fc2"], (width, mlp_dim))},
  }


def _split_table(reader: mapping.KeyReader, cls: np.ndarray, table: np.ndarray
                 ) -> Tuple[np.ndarray, np.ndarray, Tuple[int, int]]:
  """(cls + its position [1, 1, D], patch table [1, N, D], grid) from a [1 + N, D] table."""
  cls_token = (cls.reshape(-1) + table[0]).reshape(1, 1, -1)
  patch_table = table[None, 1:]
  return cls_token, patch_table, mapping.square_grid(patch_table.shape[1], reader.source)


def _config(patch: int, width: int, depth: int, num_heads: int, mlp_dim: int,
            grid: Tuple[int, int], resize: str, activation: str, projection_dim: Optional[int],
            patch_bias: bool = False, layer_scale: bool = False, eps: float = CLIP_EPS
            ) -> ViTConfig:
  return ViTConfig(
      patch_size=patch, width=width, depth=depth, num_heads=num_heads, mlp_dim=mlp_dim,
      pos_embed_grid=grid, pos_embed_resize=resize, layer_scale=layer_scale, qkv_bias=True,
      patch_bias=patch_bias, ln_pre=True, activation=activation, norm_eps=eps,
      projection_dim=projection_dim, image_size=grid[0] * patch, image_mean=CLIP_MEAN,
      image_std=CLIP_STD, family="clip")


# --- OpenAI ------------------------------------------------------------------------------------

def _openai_prefix(raw: RawCheckpoint) -> Optional[str]:
  """"visual." for a full CLIP model, "" for the image tower alone, None if neither.

  `class_embedding` keeps OpenAI's ResNet CLIPs (which also have `visual.conv1`) out.
  """
  for prefix in ("visual.", ""):
    if all(prefix + k in raw.tensors for k in
           ("conv1.weight", "class_embedding", "transformer.resblocks.0.attn.in_proj_weight")):
      return prefix
  return None


def convert_openai(reader: mapping.KeyReader, raw: RawCheckpoint) -> Tuple[ViTConfig, dict]:
  """OpenAI `clip/model.py` VisionTransformer (full model or `visual.` only) -> config, params."""
  p = _openai_prefix(raw)
  if p is None:
    p = "visual."
    _require(reader, p + "conv1.weight", "clip/openai")
  conv = reader.get(p + "conv1.weight", (-1, 3, -1, -1))
  width, _, patch, _ = conv.shape
  cls_token, patch_table, grid = _split_table(
      reader, reader.get(p + "class_embedding", (width,)),
      reader.get(p + "positional_embedding", (-1, width)))
  blocks = p + "transformer.resblocks.{}"
  depth = reader.count(blocks + ".ln_1.weight")
  mlp_key = blocks.format(0) + ".mlp.c_fc.weight"
  mlp_dim = raw.tensors[mlp_key].shape[0] if mlp_key in raw.tensors else 4 * width
  num_heads = mapping.infer_heads(width)  # clip/model.py: vision_heads = vision_width // 64.
  params = {
      "patch_embed": mapping.conv_patch_embed(conv, None),
      "cls_token": cls_token,
      "pos_embed": patch_table,
      "ln_pre": _norm(reader, p + "ln_pre", width),
      "norm": _norm(reader, p + "ln_post", width),
  }
  for i in range(depth):
    b = blocks.format(i)
    qkv = (reader.get(b + ".attn.in_proj_weight", (3 * width, width)),
           reader.get(b + ".attn.in_proj_bias", (3 * width,)))
    names = {"norm1": b + ".ln_1", "norm2": b + ".ln_2", "proj": b + ".attn.out_proj",
             "fc1": b + ".mlp.c_fc", "fc2": b + ".mlp.c_proj"}
    params[f"blocks_{i}"] = _block(reader, names, qkv, width, num_heads, mlp_dim)
  # `proj` is used as `x @ proj`: already (in, out), no transpose.
  proj = reader.optional(p + "proj", (width, -1))
  if proj is not None:
    params["projection"] = proj
  if p:  # Only a full model has a text tower; in a visual-only dict these names are the image's.
    reader.ignore(*_OPENAI_TEXT)
  reader.ignore(*_OPENAI_META)
  config = _config(patch, width, depth, num_heads, mlp_dim, grid, "size", "quick_gelu",
                   None if proj is None else proj.shape[1])
  return config, params


# --- Hugging Face ------------------------------------------------------------------------------

def _hf_prefix(raw: RawCheckpoint) -> Optional[str]:
  """"vision_model." (CLIPModel, CLIPVisionModelWithProjection, hub CLIPVisionModel files) or ""
  (CLIPVisionModel saved by transformers >= 5, which strips the prefix); None if neither."""
  for prefix in ("vision_model.", ""):
    if (prefix + "embeddings.class_embedding" in raw.tensors
        and prefix + "embeddings.patch_embedding.weight" in raw.tensors):
      return prefix
  return None


def _hf_vision_config(raw: RawCheckpoint) -> dict:
  """The vision part of an HF config: nested in CLIPModel's, top level in CLIPVisionModel's."""
  config = raw.hf_config or {}
  return config.get("vision_config") or config


def convert_hf(reader: mapping.KeyReader, raw: RawCheckpoint) -> Tuple[ViTConfig, dict]:
  """HF CLIPVisionModel / CLIPVisionModelWithProjection / CLIPModel -> config, params."""
  p = _hf_prefix(raw)
  if p is None:
    p = "vision_model."
    _require(reader, p + "embeddings.patch_embedding.weight", "clip/hf")
  hf = _hf_vision_config(raw)
  act = hf.get("hidden_act", "quick_gelu")  # CLIPVisionConfig's default.
  if act not in _HF_ACTIVATIONS:
    raise CheckpointError(f"{reader.source}: hidden_act {act!r} is not supported; the ViT has "
                          f"{sorted(_HF_ACTIVATIONS)}.")
  eps = float(hf.get("layer_norm_eps", CLIP_EPS))
  conv = reader.get(p + "embeddings.patch_embedding.weight", (-1, 3, -1, -1))
  width, _, patch, _ = conv.shape
  cls_token, patch_table, grid = _split_table(
      reader, reader.get(p + "embeddings.class_embedding", (width,)),
      reader.get(p + "embeddings.position_embedding.weight", (-1, width)))
  layers = p + "encoder.layers.{}"
  depth = reader.count(layers + ".layer_norm1.weight")
  mlp_key = layers.format(0) + ".mlp.fc1.weight"
  mlp_dim = raw.tensors[mlp_key].shape[0] if mlp_key in raw.tensors else 4 * width
  num_heads = mapping.infer_heads(width, hf or None)
  params = {
      "patch_embed": mapping.conv_patch_embed(conv, None),
      "cls_token": cls_token,
      "pos_embed": patch_table,
      "ln_pre": _norm(reader, p + "pre_layrnorm", width),  # Sic: HF spells it "layrnorm".
      "norm": _norm(reader, p + "post_layernorm", width),
  }
  for i in range(depth):
    a = layers.format(i) + ".self_attn."
    qkv = mapping.fuse_qkv(
        [reader.get(a + n + "_proj.weight", (width, width)) for n in "qkv"],
        [reader.get(a + n + "_proj.bias", (width,)) for n in "qkv"])
    b = layers.format(i)
    names = {"norm1": b + ".layer_norm1", "norm2": b + ".layer_norm2", "proj": a + "out_proj",
             "fc1": b + ".mlp.fc1", "fc2": b + ".mlp.fc2"}
    params[f"blocks_{i}"] = _block(reader, names, qkv, width, num_heads, mlp_dim)
  # An nn.Linear without bias: (out, in) -> (in, out).
  proj = reader.optional("visual_projection.weight", (-1, width))
  if proj is not None:
    params["projection"] = np.ascontiguousarray(proj.T)
  reader.ignore(*_HF_IGNORED)
  config = _config(patch, width, depth, num_heads, mlp_dim, grid, "size", _HF_ACTIVATIONS[act],
                   None if proj is None else proj.shape[0], eps=eps)
  return config, params


# --- timm ----------------------------------------------------------------------------------------

def _is_timm_clip(raw: RawCheckpoint) -> bool:
  """timm's ViT keys plus `norm_pre` (timm's ln_pre, `pre_norm=True`): only CLIP towers have it.

  timm_style's `_is_timm_style` accepts these keys too; `norm_pre.weight` is what tells them apart.
  """
  keys = raw.tensors
  return all(k in keys for k in ("patch_embed.proj.weight", "blocks.0.attn.qkv.weight",
                                 "cls_token", "pos_embed", "norm_pre.weight"))


def _timm_projection(reader: mapping.KeyReader, width: int) -> Optional[np.ndarray]:
  """The CLIP projection when `head` is one, else None (a classifier head is dropped).

  timm stores OpenAI's `proj` as `head.weight = proj.T` with `head.bias = 0`
  (vision_transformer.py `_convert_openai_clip`), applied to the normed CLS (global_pool="token",
  no fc_norm). A head with a non-zero bias, or after an `fc_norm`, is an ImageNet classifier.
  """
  weight = reader.tensors.get("head.weight")
  bias = reader.tensors.get("head.bias")
  if (weight is None or weight.ndim != 2 or reader.has("fc_norm.weight")
      or (bias is not None and np.any(bias != 0))):
    return None
  weight = reader.get("head.weight", (-1, width))
  reader.optional("head.bias", (weight.shape[0],))  # Zero: nothing to keep.
  return np.ascontiguousarray(weight.T)


def convert_timm(reader: mapping.KeyReader, raw: RawCheckpoint, activation: str
                 ) -> Tuple[ViTConfig, dict]:
  """timm `vit_*_clip_*` state dict -> config, params."""
  _require(reader, "patch_embed.proj.weight", "clip/timm")
  conv = reader.get("patch_embed.proj.weight", (-1, 3, -1, -1))
  width, _, patch, _ = conv.shape
  patch_bias = reader.optional("patch_embed.proj.bias", (width,))
  cls_token, patch_table, grid = _split_table(
      reader, reader.get("cls_token", (1, 1, width)), reader.get("pos_embed", (1, -1, width))[0])
  depth = reader.count("blocks.{}.norm1.weight")
  mlp_key = "blocks.0.mlp.fc1.weight"
  mlp_dim = raw.tensors[mlp_key].shape[0] if mlp_key in raw.tensors else 4 * width
  num_heads = mapping.infer_heads(width)
  layer_scale = reader.has("blocks.0.ls1.gamma")
  params = {
      "patch_embed": mapping.conv_patch_embed(conv, patch_bias),
      "cls_token": cls_token,
      "pos_embed": patch_table,
      "ln_pre": _norm(reader, "norm_pre", width),
      "norm": _norm(reader, "norm", width),
  }
  for i in range(depth):
    params[f"blocks_{i}"] = mapping.block(reader, TIMM_BLOCK_NAMES, i, width, num_heads, mlp_dim,
                                          qkv_bias=True, layer_scale=layer_scale)
  proj = _timm_projection(reader, width)
  if proj is not None:
    params["projection"] = proj
  reader.ignore("head.*", "fc_norm.*")
  config = _config(patch, width, depth, num_heads, mlp_dim, grid, "size_antialias", activation,
                   None if proj is None else proj.shape[1], patch_bias=patch_bias is not None,
                   layer_scale=layer_scale)
  return config, params


register(Layout(
    family="clip", name="openai", detect=lambda raw: _openai_prefix(raw) is not None,
    convert=convert_openai,
    description="openai/CLIP ViT state dict (full model or `visual.` tower), QuickGELU; "
                "resized like HF"))
register(Layout(
    family="clip", name="hf", detect=lambda raw: _hf_prefix(raw) is not None, convert=convert_hf,
    description="HF CLIPModel / CLIPVisionModel(WithProjection); activation from config.json"))
register(Layout(
    family="clip", name="timm", detect=_is_timm_clip,
    convert=lambda reader, raw: convert_timm(reader, raw, "quick_gelu"),
    description="timm vit_*_clip_quickgelu_* (OpenAI, MetaCLIP weights), QuickGELU"))
register(Layout(
    family="clip", name="timm_gelu", detect=lambda raw: False,
    convert=lambda reader, raw: convert_timm(reader, raw, "gelu"),
    description="timm vit_*_clip_* with exact GELU (open_clip LAION/DataComp weights); "
                "explicit --family clip/timm_gelu only"))
