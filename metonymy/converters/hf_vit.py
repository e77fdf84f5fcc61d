"""Hugging Face ViT-family layouts: DINOv1 (`ViTModel`), DINOv2 (`Dinov2Model`,
`Dinov2WithRegistersModel`) and RAD-DINO (a `Dinov2Model` checkpoint).

All three keep q, k and v as separate Linear layers (fused here), a CLS position inside
`embeddings.position_embeddings` (folded into the CLS token here) and a final `layernorm`.

| layout      | told apart by                                        | resize (transformers 5.24)       |
|-------------|------------------------------------------------------|----------------------------------|
| rad_dino/hf | DINOv2 keys + config.json / preprocessor naming it   | size, no antialias               |
| dinov2/hf   | `encoder.layer.i.norm1`, `layer_scale1.lambda1`      | size; antialias with registers   |
| dino/hf     | `layernorm_before` / `layernorm_after`               | size, no antialias               |

Resize evidence (transformers 5.24.0, `interpolate_pos_encoding`): `models/vit/modeling_vit.py`
l.118-123 and `models/dinov2/modeling_dinov2.py` l.116-121 call `interpolate(size=(h, w),
mode="bicubic", align_corners=False)`; `models/dinov2_with_registers/
modeling_dinov2_with_registers.py` l.120-126 adds `antialias=True`. The mode follows the model
class (config `model_type`, else the presence of `embeddings.register_tokens`).

Key names come in two spellings and both load:
  * hub files, and what `save_pretrained` of transformers 5.x writes (it converts back):
    `encoder.layer.i.attention.attention.{query,key,value}`, `attention.output.dense`, and for
    ViT `intermediate.dense` / `output.dense`;
  * the 5.x in-memory `state_dict()` (e.g. saved with safetensors directly): DINOv2
    `encoder.layer.i.attention.{q,k,v,o}_proj`; ViT `layers.i.{attention.{q,k,v,o}_proj,
    layernorm_before, layernorm_after, mlp.fc1, mlp.fc2}`.
`*ForImageClassification` files (backbone under `vit.` / `dinov2.` / `dinov2_with_registers.`)
load too; their `classifier.*` is dropped, as are `pooler.*` and `embeddings.mask_token`.

With config.json (an HF folder) the architecture comes from it: width, depth, heads, MLP size,
patch, image size (hence the position grid), LayerNorm eps (HF `facebook/dino-vitb16` says
1e-12, not the original's 1e-6: we keep what the config says), qkv bias and activation, and
every tensor is checked against those shapes. A bare `.safetensors` gets the same from the
tensor shapes, heads = width / 64 and the HF default eps (ViT 1e-12, DINOv2 1e-6).
"""

import json
import os
from typing import Any, Dict, Optional, Tuple

import numpy as np

from metonymy.converters import mapping
from metonymy.converters.io import CheckpointError, RawCheckpoint
from metonymy.converters.registry import Layout, register
from metonymy.models.vit import ViTConfig

# Prefixes under which HF puts the backbone: none for `*Model`, the base-model prefix for heads.
_BASE_PREFIXES = ("", "vit.", "dinov2.", "dinov2_with_registers.")
_PATCH_KEY = "embeddings.patch_embeddings.projection.weight"

# Block roles -> key templates relative to the (base-prefixed) block prefix.
_ATTN_HUB = {"q": "attention.attention.query", "k": "attention.attention.key",
             "v": "attention.attention.value", "proj": "attention.output.dense"}
_ATTN_V5 = {"q": "attention.q_proj", "k": "attention.k_proj", "v": "attention.v_proj",
            "proj": "attention.o_proj"}
_BLOCK_NAMES = {
    ("vit", "hub"): dict(block="encoder.layer.{i}.", norm1="layernorm_before",
                         norm2="layernorm_after", fc1="intermediate.dense", fc2="output.dense",
                         **_ATTN_HUB),
    ("vit", "v5"): dict(block="layers.{i}.", norm1="layernorm_before", norm2="layernorm_after",
                        fc1="mlp.fc1", fc2="mlp.fc2", **_ATTN_V5),
    ("dinov2", "hub"): dict(block="encoder.layer.{i}.", norm1="norm1", norm2="norm2",
                            fc1="mlp.fc1", fc2="mlp.fc2", ls1="layer_scale1.lambda1",
                            ls2="layer_scale2.lambda1", **_ATTN_HUB),
    ("dinov2", "v5"): dict(block="encoder.layer.{i}.", norm1="norm1", norm2="norm2",
                           fc1="mlp.fc1", fc2="mlp.fc2", ls1="layer_scale1.lambda1",
                           ls2="layer_scale2.lambda1", **_ATTN_V5),
}
# HF config defaults when a bare weights file arrives without config.json.
_DEFAULT_EPS = {"vit": 1e-12, "dinov2": 1e-6}
_ACTIVATIONS = {"gelu": "gelu", "quick_gelu": "quick_gelu"}  # HF "gelu" is the exact erf GELU.

# microsoft/rad-dino preprocessor_config.json: image_mean [0.5307] * 3, image_std [0.2583] * 3
# (grayscale X-ray statistics replicated over RGB). Used when the folder has no processor file.
RAD_DINO_MEAN = (0.5307, 0.5307, 0.5307)
RAD_DINO_STD = (0.2583, 0.2583, 0.2583)


def _base_prefix(raw: RawCheckpoint) -> Optional[str]:
  return next((p for p in _BASE_PREFIXES if p + _PATCH_KEY in raw.tensors), None)


def _scheme(raw: RawCheckpoint) -> Optional[Tuple[str, str, str]]:
  """(base prefix, kind "vit" | "dinov2", naming "hub" | "v5"), or None if not an HF ViT layout.

  Told apart by block 0's first norm, which exists in every spelling; the attention naming then
  follows from whichever q / output projection keys are present.
  """
  base = _base_prefix(raw)
  if base is None:
    return None
  keys = raw.tensors
  if base + "encoder.layer.0.layernorm_before.weight" in keys:
    return base, "vit", "hub"
  if base + "layers.0.layernorm_before.weight" in keys:
    return base, "vit", "v5"
  if base + "encoder.layer.0.norm1.weight" in keys:
    block = base + "encoder.layer."
    v5 = any(k.startswith(block) and (".attention.q_proj." in k or ".attention.o_proj." in k)
             for k in keys)
    return base, "dinov2", "v5" if v5 else "hub"
  return None


def _hf_config(raw: RawCheckpoint) -> Dict[str, Any]:
  return raw.hf_config or {}


def _has_registers(raw: RawCheckpoint, base: str) -> bool:
  model_type = _hf_config(raw).get("model_type")
  if model_type is not None:
    return model_type == "dinov2_with_registers"
  return base + "embeddings.register_tokens" in raw.tensors


def processor_stats(raw: RawCheckpoint) -> Optional[Tuple[Tuple[float, ...], Tuple[float, ...]]]:
  """(image_mean, image_std) from an HF folder's preprocessor_config.json, if it has one."""
  if raw.file_format != "hf_folder":
    return None
  path = os.path.join(raw.path, "preprocessor_config.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    processor = json.load(f)
  if processor.get("do_normalize") is False:
    return (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
  mean, std = processor.get("image_mean"), processor.get("image_std")
  if mean is None or std is None:
    return None
  as_rgb = lambda v: tuple(float(x) for x in (v if isinstance(v, (list, tuple)) else [v] * 3))
  mean, std = as_rgb(mean), as_rgb(std)
  if len(mean) != 3 or len(std) != 3:
    raise CheckpointError(f"{path}: expected 3 channel statistics, got mean {mean}, std {std}.")
  return mean, std


def _is_rad_dino(raw: RawCheckpoint) -> bool:
  """RAD-DINO's keys are plain DINOv2's: only the folder's metadata can name it."""
  config = _hf_config(raw)
  names = " ".join(str(config.get(k, "")) for k in ("_name_or_path", "name_or_path")).lower()
  if "rad-dino" in names or "rad_dino" in names:
    return True
  stats = processor_stats(raw)
  return stats is not None and bool(np.allclose(stats[0], RAD_DINO_MEAN, atol=1e-4)
                                    and np.allclose(stats[1], RAD_DINO_STD, atol=1e-4))


def _pair(value, what: str, source: str) -> Tuple[int, int]:
  if isinstance(value, (list, tuple)):
    if len(value) != 2:
      raise CheckpointError(f"{source}: config {what} {value} is not a pair.")
    return int(value[0]), int(value[1])
  return int(value), int(value)


def _norm(reader: mapping.KeyReader, prefix: str, width: int) -> Dict[str, np.ndarray]:
  return mapping.layer_norm(reader.get(prefix + ".weight", (width,)),
                            reader.get(prefix + ".bias", (width,)))


def _linear(reader: mapping.KeyReader, prefix: str, out_dim: int, in_dim: int,
            bias: bool = True) -> Tuple[np.ndarray, Optional[np.ndarray]]:
  return (reader.get(prefix + ".weight", (out_dim, in_dim)),
          reader.get(prefix + ".bias", (out_dim,)) if bias else None)


def _architecture(raw: RawCheckpoint, base: str, kind: str, names: Dict[str, str]
                  ) -> Dict[str, Any]:
  """ViTConfig fields from config.json, else from the tensor shapes."""
  tensors, config, source = raw.tensors, _hf_config(raw), raw.path
  patch_weight = tensors[base + _PATCH_KEY]
  width = int(config.get("hidden_size", patch_weight.shape[0]))
  patch = _pair(config.get("patch_size", patch_weight.shape[-1]), "patch_size", source)
  if patch[0] != patch[1]:
    raise CheckpointError(f"{source}: non-square patches {patch} are not supported.")
  patch = patch[0]
  if int(config.get("num_channels", 3)) != 3:
    raise CheckpointError(f"{source}: num_channels {config['num_channels']}; only RGB is "
                          "supported.")
  swiglu_keys = [k for k in tensors if ".mlp.weights_in." in k or ".mlp.gate_proj." in k]
  if config.get("use_swiglu_ffn") or swiglu_keys:
    raise CheckpointError(f"{source}: DINOv2 SwiGLU MLPs (ViT-g) are not supported by the "
                          "Flax ViT.")
  activation = config.get("hidden_act", "gelu")
  if activation not in _ACTIVATIONS:
    raise CheckpointError(f"{source}: hidden_act {activation!r} is not supported; "
                          f"expected one of {sorted(_ACTIVATIONS)}.")
  heads = mapping.infer_heads(width, config or None)
  head_dim = config.get("head_dim")
  if head_dim is not None and int(head_dim) * heads != width:
    raise CheckpointError(f"{source}: head_dim {head_dim} x {heads} heads != "
                          f"width {width}.")
  block0 = base + names["block"].format(i=0)
  if "num_hidden_layers" in config:
    depth = int(config["num_hidden_layers"])
  else:
    depth = mapping.KeyReader(tensors, source).count(
        (base + names["block"] + names["norm1"] + ".weight").replace("{i}", "{}"))
  if "intermediate_size" in config and kind == "vit":
    mlp_dim = int(config["intermediate_size"])
  elif "mlp_ratio" in config and kind == "dinov2":
    mlp_dim = int(width * config["mlp_ratio"])  # As Dinov2MLP: int(hidden_size * mlp_ratio).
  elif block0 + names["fc1"] + ".weight" in tensors:
    mlp_dim = int(tensors[block0 + names["fc1"] + ".weight"].shape[0])
  else:
    mlp_dim = 4 * width
  if "image_size" in config:
    size = _pair(config["image_size"], "image_size", source)
    grid = (size[0] // patch, size[1] // patch)
    image_size = size[0]
  else:
    table = tensors.get(base + "embeddings.position_embeddings")
    if table is None or table.ndim != 3:
      raise CheckpointError(f"{source}: no 3D embeddings.position_embeddings to infer the "
                            "grid from.")
    grid = mapping.square_grid(table.shape[1] - 1, source)
    image_size = grid[0] * patch
  if "qkv_bias" in config:
    qkv_bias = bool(config["qkv_bias"])
  else:
    qkv_bias = block0 + names["q"] + ".bias" in tensors
  registers = _has_registers(raw, base)
  register_key = base + "embeddings.register_tokens"
  if config.get("model_type") is not None:
    # As HF builds the model: a plain Dinov2Model has no registers even if the file holds some
    # (the strict load then reports them as unexpected).
    num_registers = int(config.get("num_register_tokens", 4)) if registers else 0
  elif register_key in tensors and tensors[register_key].ndim == 3:
    num_registers = int(tensors[register_key].shape[1])
  else:
    num_registers = 0
  return dict(
      patch_size=patch, width=width, depth=depth, num_heads=heads, mlp_dim=mlp_dim,
      num_registers=num_registers, pos_embed_grid=grid,
      pos_embed_resize="size_antialias" if registers else "size",
      layer_scale=kind == "dinov2", qkv_bias=qkv_bias, activation=_ACTIVATIONS[activation],
      norm_eps=float(config.get("layer_norm_eps", _DEFAULT_EPS[kind])), image_size=image_size)


def _block(reader: mapping.KeyReader, names: Dict[str, str], prefix: str, arch: Dict[str, Any]
           ) -> Dict[str, Any]:
  """One HF pre-norm block -> our `blocks_i` params (q, k, v fused as rows [q; k; v])."""
  width, mlp_dim, qkv_bias = arch["width"], arch["mlp_dim"], arch["qkv_bias"]
  qkv = [_linear(reader, prefix + names[r], width, width, qkv_bias) for r in ("q", "k", "v")]
  qkv_weight, qkv_b = mapping.fuse_qkv([w for w, _ in qkv], [b for _, b in qkv])
  proj_weight, proj_bias = _linear(reader, prefix + names["proj"], width, width)
  params = {
      "norm1": _norm(reader, prefix + names["norm1"], width),
      "norm2": _norm(reader, prefix + names["norm2"], width),
      "attn": mapping.attention(qkv_weight, qkv_b, proj_weight, proj_bias, arch["num_heads"]),
      "mlp": {"fc1": mapping.dense(*_linear(reader, prefix + names["fc1"], mlp_dim, width)),
              "fc2": mapping.dense(*_linear(reader, prefix + names["fc2"], width, mlp_dim))},
  }
  if arch["layer_scale"]:
    params["ls1"] = {"gamma": reader.get(prefix + names["ls1"], (width,))}
    params["ls2"] = {"gamma": reader.get(prefix + names["ls2"], (width,))}
  return params


def convert_hf(reader: mapping.KeyReader, raw: RawCheckpoint, family: str,
               image_stats: Optional[Tuple[Tuple[float, ...], Tuple[float, ...]]] = None
               ) -> Tuple[ViTConfig, dict]:
  """Any HF ViT / DINOv2 (+registers) checkpoint -> (ViTConfig, params).

  Args:
    reader: the strict reader over `raw.tensors`.
    raw: the checkpoint (its `hf_config`, when present, fixes the architecture).
    family: recorded in the config ("dino", "dinov2", "rad_dino").
    image_stats: (mean, std) to use when the folder has no preprocessor_config.json.
  """
  scheme = _scheme(raw)
  if scheme is None:
    sample = sorted(raw.tensors)[:12]
    raise CheckpointError(f"{raw.path}: not a Hugging Face ViT / DINOv2 checkpoint (no "
                          f"'{_PATCH_KEY}' with ViT or DINOv2 block keys). First keys: {sample}")
  base, kind, naming = scheme
  names = _BLOCK_NAMES[kind, naming]
  arch = _architecture(raw, base, kind, names)
  width, patch, grid = arch["width"], arch["patch_size"], arch["pos_embed_grid"]
  stats = processor_stats(raw) or image_stats
  if stats is not None:
    arch["image_mean"], arch["image_std"] = stats
  config = ViTConfig(family=family, **arch)

  emb = base + "embeddings."
  # position_embeddings [1, 1 + h*w, D] cover [CLS, patches]; registers get none (HF inserts them
  # after adding positions), so the CLS position folds exactly into the CLS token.
  table = reader.get(emb + "position_embeddings", (1, 1 + grid[0] * grid[1], width))
  params = {
      "patch_embed": mapping.conv_patch_embed(
          reader.get(emb + "patch_embeddings.projection.weight", (width, 3, patch, patch)),
          reader.get(emb + "patch_embeddings.projection.bias", (width,))),
      "cls_token": reader.get(emb + "cls_token", (1, 1, width)) + table[:, :1],
      "pos_embed": table[:, 1:],
      "norm": _norm(reader, base + "layernorm", width),
  }
  if arch["num_registers"]:
    params["register_tokens"] = reader.get(emb + "register_tokens",
                                     (1, arch["num_registers"], width))
  for i in range(arch["depth"]):
    params[f"blocks_{i}"] = _block(reader, names, base + names["block"].format(i=i), arch)
  # Not part of the backbone: masked-image-modelling token, ViT pooler, classification heads.
  ignored = [emb + "mask_token", base + "pooler.*"]
  registers = reader.tensors.get(emb + "register_tokens")
  if not arch["num_registers"] and registers is not None and registers.size == 0:
    ignored.append(emb + "register_tokens")  # A registers model configured with 0 registers.
  if base:
    ignored.append("classifier.*")
  reader.ignore(*ignored)
  return config, params


def _is_kind(raw: RawCheckpoint, kind: str) -> bool:
  scheme = _scheme(raw)
  return scheme is not None and scheme[1] == kind


# Order matters: RAD-DINO is a DINOv2 checkpoint, so it must be tried before dinov2/hf.
register(Layout(
    family="rad_dino", name="hf",
    detect=lambda raw: (_is_kind(raw, "dinov2") and not _has_registers(raw, _base_prefix(raw))
                        and _is_rad_dino(raw)),
    convert=lambda reader, raw: convert_hf(reader, raw, "rad_dino",
                                           (RAD_DINO_MEAN, RAD_DINO_STD)),
    description="microsoft/rad-dino (HF Dinov2Model folder; detected from config.json "
                "_name_or_path or its preprocessor statistics, else --family rad_dino)"))
register(Layout(
    family="dinov2", name="hf", detect=lambda raw: _is_kind(raw, "dinov2"),
    convert=lambda reader, raw: convert_hf(reader, raw, "dinov2"),
    description="HF Dinov2Model / Dinov2WithRegistersModel (facebook/dinov2-base, "
                "facebook/dinov2-with-registers-base), hub or transformers-5 key names"))
register(Layout(
    family="dino", name="hf", detect=lambda raw: _is_kind(raw, "vit"),
    convert=lambda reader, raw: convert_hf(reader, raw, "dino"),
    description="HF ViTModel (facebook/dino-vitb16; eps from config.json, 1e-12 there)"))
