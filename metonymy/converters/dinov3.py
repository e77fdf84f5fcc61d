"""DINOv3 ViT state dicts: the original facebookresearch/dinov3 .pth, timm's Eva port, and HF.

All three hold the same network (docs/checkpoints.md, "Weight layouts"): sequence
[CLS, 4 storage/register tokens, patches], no absolute position table, 2D RoPE on the patch
tokens' q and k (y angles then x angles, `rotate_half`), LayerScale, a qkv bias whose k third is
zero, eps 1e-5, exact GELU, one final norm over every token.

| layout          | told apart by                                  | RoPE periods                  |
|-----------------|------------------------------------------------|-------------------------------|
| dinov3/original | `blocks.i.ls1.gamma`, no `pos_embed`           | the file's rope_embed.periods |
| dinov3/timm     | `blocks.i.gamma_1`, no `pos_embed`             | fp32, base 100                |
| dinov3/hf       | `embeddings.patch_embeddings.weight`, `q_proj` | fp32, `rope_theta`            |

The released .pth files may hold `periods` rounded to bf16 while timm and HF recompute them in
float32; the original model loads the buffer with `strict=True` and uses it, so the file's values
are kept exactly as stored.

Variants our `ViTConfig` cannot express are refused with a precise error instead of converted
approximately: SwiGLU FFNs (ViT-S+/L+/H+/7B; original `mlp.w1/w2/w3`, HF `gate_proj`, timm
`fc1_g/fc1_x`) and a separate CLS/storage-token final norm (`cls_norm`, untie_cls_and_patch_norms).
"""

from typing import Dict, Optional, Tuple

import numpy as np

from metonymy.converters import mapping
from metonymy.converters.io import CheckpointError, RawCheckpoint
from metonymy.converters.registry import Layout, register
from metonymy.models import pos_embed as pos_lib
from metonymy.models.vit import ViTConfig

FAMILY = "dinov3"
NORM_EPS = 1e-5  # Every released DINOv3 ViT uses norm_layer="layernormbf16" (eps 1e-5).
ROPE_BASE = 100.0
IMAGE_SIZE = 224
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

ORIGINAL_BLOCK_NAMES = {
    "norm1": "blocks.{i}.norm1", "norm2": "blocks.{i}.norm2", "qkv": "blocks.{i}.attn.qkv",
    "proj": "blocks.{i}.attn.proj", "fc1": "blocks.{i}.mlp.fc1", "fc2": "blocks.{i}.mlp.fc2",
    "ls1": "blocks.{i}.ls1.gamma", "ls2": "blocks.{i}.ls2.gamma",
}
TIMM_BLOCK_NAMES = dict(ORIGINAL_BLOCK_NAMES, ls1="blocks.{i}.gamma_1", ls2="blocks.{i}.gamma_2")


def _refuse(raw: RawCheckpoint, layout: str, why: str) -> None:
  raise CheckpointError(f"{raw.path}: this {layout} checkpoint cannot be expressed by ViTConfig: "
                        f"{why}. Converting it would not reproduce the reference outputs.")


def _config(width: int, depth: int, num_heads: int, mlp_dim: int, patch: int, num_registers: int,
            periods, qkv_bias: bool, k_bias: bool, eps: float = NORM_EPS,
            image_size: int = IMAGE_SIZE) -> ViTConfig:
  return ViTConfig(
      patch_size=patch, width=width, depth=depth, num_heads=num_heads, mlp_dim=mlp_dim,
      num_registers=num_registers, pos_embed_grid=None,
      rope_periods=tuple(float(p) for p in np.asarray(periods, np.float32)),
      layer_scale=True, qkv_bias=qkv_bias, k_bias=k_bias, patch_bias=True, norm_eps=eps,
      image_size=image_size, image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD, family=FAMILY)


def _check_head_dim(raw: RawCheckpoint, width: int, num_heads: int) -> int:
  if width % num_heads or (width // num_heads) % 4:
    raise CheckpointError(f"{raw.path}: width {width} with {num_heads} heads gives no head dim "
                          "divisible by 4, which 2D RoPE needs.")
  return width // num_heads


def _embeddings(reader: mapping.KeyReader, names: Dict[str, Optional[str]], width: int
                ) -> Tuple[Dict[str, np.ndarray], int]:
  """cls, registers, patch embedding and final norm; names: cls, registers, patch, norm."""
  params = {
      "cls_token": reader.get(names["cls"], (1, 1, width)),
      "patch_embed": mapping.conv_patch_embed(
          reader.get(names["patch"] + ".weight", (width, 3, -1, -1)),
          reader.get(names["patch"] + ".bias", (width,))),
      "norm": mapping.layer_norm(reader.get(names["norm"] + ".weight", (width,)),
                                 reader.get(names["norm"] + ".bias", (width,))),
  }
  num_registers = 0
  if names["registers"] and reader.has(names["registers"]):
    registers = reader.get(names["registers"], (1, -1, width))
    num_registers = registers.shape[1]
    if num_registers:  # HF keeps a (1, 0, D) tensor when a model has no registers.
      params["register_tokens"] = registers
  return params, num_registers


# --- dinov3/original -------------------------------------------------------------------------


def _is_original(raw: RawCheckpoint) -> bool:
  keys = raw.tensors
  return ("patch_embed.proj.weight" in keys and "cls_token" in keys and "pos_embed" not in keys
          and "blocks.0.ls1.gamma" in keys and "blocks.0.attn.qkv.weight" in keys)


def _original_qkv_bias(reader: mapping.KeyReader, raw: RawCheckpoint, index: int, width: int
                       ) -> Tuple[Optional[np.ndarray], bool]:
  """(qkv bias [3D], k_bias) of block `index`: `bias * bias_mask`, as LinearKMaskedBias adds it."""
  prefix = f"blocks.{index}.attn.qkv"
  if not reader.has(prefix + ".bias"):
    return None, False
  bias = reader.get(prefix + ".bias", (3 * width,))
  mask = reader.optional(prefix + ".bias_mask", (3 * width,))
  if mask is None:  # mask_k_bias=False: a plain Linear whose k bias is real.
    return bias, True
  if not np.all(np.isfinite(mask)):
    # LinearKMaskedBias starts its mask as NaN; a NaN mask would make the reference output NaN.
    raise CheckpointError(f"{raw.path}: {prefix}.bias_mask has non-finite values "
                          "(an uninitialized buffer).")
  effective = bias * mask
  # The k third multiplied by a zero mask is structurally zero: that is our k_bias=False.
  return effective, bool(np.any(mask[width:2 * width] != 0))


def convert_original(reader: mapping.KeyReader, raw: RawCheckpoint) -> Tuple[ViTConfig, dict]:
  tensors = raw.tensors
  if "cls_norm.weight" in tensors:
    _refuse(raw, "dinov3/original", "it has `cls_norm` (untie_cls_and_patch_norms): CLS and "
            "storage tokens get their own final LayerNorm, while our model applies one norm to "
            "every token")
  if "blocks.0.mlp.w1.weight" in tensors:
    _refuse(raw, "dinov3/original", "its FFN is SwiGLU (`mlp.w1/w2/w3`, the ViT-S+/L+/H+/7B "
            "models); our Mlp is fc1 -> exact GELU -> fc2")
  patch_weight = reader.get("patch_embed.proj.weight", (-1, 3, -1, -1))
  width, _, patch, _ = patch_weight.shape
  depth = reader.count("blocks.{}.norm1.weight")
  mlp_dim = tensors["blocks.0.mlp.fc1.weight"].shape[0] if depth else 4 * width
  periods = reader.optional("rope_embed.periods", (-1,))
  if periods is not None:
    # periods has head_dim / 4 entries; this also covers the 7B's head dim of 128.
    num_heads = width // (4 * periods.shape[0]) if width % (4 * periods.shape[0]) == 0 else 0
    if not num_heads:
      raise CheckpointError(f"{raw.path}: rope_embed.periods has {periods.shape[0]} entries, which "
                            f"does not divide width {width} into heads of dim 4 x that.")
  else:
    num_heads = mapping.infer_heads(width)
    periods = pos_lib.rope_periods(_check_head_dim(raw, width, num_heads), ROPE_BASE)
  _check_head_dim(raw, width, num_heads)
  params, num_registers = _embeddings(
      reader, {"cls": "cls_token", "registers": "storage_tokens", "patch": "patch_embed.proj",
               "norm": "norm"}, width)
  qkv_bias = "blocks.0.attn.qkv.bias" in tensors
  k_biases = set()
  for i in range(depth):
    # The fused layout fits mapping.block except for the masked bias, read here and passed in.
    bias, k_bias = _original_qkv_bias(reader, raw, i, width)
    k_biases.add(k_bias)
    block = mapping.block(reader, ORIGINAL_BLOCK_NAMES, i, width, num_heads, mlp_dim,
                          qkv_bias=False, layer_scale=True)
    if bias is not None:
      block["attn"]["qkv_bias"] = bias.reshape(3, num_heads, width // num_heads)
    params[f"blocks_{i}"] = block
  if len(k_biases) > 1:
    raise CheckpointError(f"{raw.path}: some blocks mask the k bias and others do not.")
  k_bias = k_biases.pop() if k_biases else False
  # mask_token only replaces masked patches in training; local_cls_norm is never used in eval.
  reader.ignore("mask_token", "local_cls_norm.*")
  return _config(width, depth, num_heads, mlp_dim, patch, num_registers, periods,
                 qkv_bias=qkv_bias, k_bias=k_bias), params


# --- dinov3/timm -----------------------------------------------------------------------------


def _is_timm(raw: RawCheckpoint) -> bool:
  keys = raw.tensors
  return ("patch_embed.proj.weight" in keys and "cls_token" in keys and "pos_embed" not in keys
          and "blocks.0.gamma_1" in keys and "blocks.0.attn.qkv.weight" in keys
          and "storage_tokens" not in keys)


def convert_timm(reader: mapping.KeyReader, raw: RawCheckpoint) -> Tuple[ViTConfig, dict]:
  """timm `vit_*_patch16_dinov3` (no qkv bias: timm found the distilled models' biases all zero)
  and `vit_*_patch16_dinov3_qkvb` (`attn.q_bias`, `attn.v_bias`; k_bias is a zero buffer)."""
  tensors = raw.tensors
  if "blocks.0.mlp.fc1_g.weight" in tensors or "blocks.0.mlp.w12.weight" in tensors:
    _refuse(raw, "dinov3/timm", "its FFN is SwiGLU (`mlp.fc1_g/fc1_x` or `w12/w3`); our Mlp is "
            "fc1 -> exact GELU -> fc2")
  if "blocks.0.attn.q_proj.weight" in tensors:
    _refuse(raw, "dinov3/timm", "unfused q/k/v projections are not a DINOv3 timm layout we know")
  patch_weight = reader.get("patch_embed.proj.weight", (-1, 3, -1, -1))
  width, _, patch, _ = patch_weight.shape
  depth = reader.count("blocks.{}.norm1.weight")
  mlp_dim = tensors["blocks.0.mlp.fc1.weight"].shape[0] if depth else 4 * width
  num_heads = mapping.infer_heads(width)
  head_dim = _check_head_dim(raw, width, num_heads)
  params, num_registers = _embeddings(
      reader, {"cls": "cls_token", "registers": "reg_token", "patch": "patch_embed.proj",
               "norm": "norm"}, width)
  qkv_bias = "blocks.0.attn.q_bias" in tensors
  for i in range(depth):
    block = mapping.block(reader, TIMM_BLOCK_NAMES, i, width, num_heads, mlp_dim,
                          qkv_bias=False, layer_scale=True)
    if qkv_bias:
      # EvaAttention adds cat(q_bias, k_bias, v_bias), k_bias a zero buffer.
      bias = np.stack([reader.get(f"blocks.{i}.attn.q_bias", (width,)),
                       np.zeros((width,), np.float32),
                       reader.get(f"blocks.{i}.attn.v_bias", (width,))])
      block["attn"]["qkv_bias"] = bias.reshape(3, num_heads, head_dim)
    params[f"blocks_{i}"] = block
  # Classifier heads; timm's rope periods are a non-persistent buffer, never in the file, and
  # recomputed in fp32 from rope_temperature=100 (RotaryEmbeddingDinoV3._compute_periods).
  reader.ignore("head.*", "fc_norm.*", "head_drop.*", "blocks.*.attn.k_bias", "rope.*")
  return _config(width, depth, num_heads, mlp_dim, patch, num_registers,
                 pos_lib.rope_periods(head_dim, ROPE_BASE), qkv_bias=qkv_bias, k_bias=False), params


# --- dinov3/hf -------------------------------------------------------------------------------


def _hf_prefixes(keys) -> Optional[Tuple[str, str]]:
  """(prefix, layer prefix) of an HF DINOv3ViT state dict, or None if it is not one.

  Hub files (and save_pretrained) write `layer.i`; transformers v5 renames that to `model.layer.i`
  in memory, so a torch.save of `state_dict()` has `embeddings.*` beside `model.layer.i`. A wrapper
  may add `model.` in front of everything.
  """
  for prefix in ("", "model."):
    if prefix + "embeddings.patch_embeddings.weight" not in keys:
      continue
    for layers in (prefix + "layer.", prefix + "model.layer."):
      if layers + "0.attention.q_proj.weight" in keys:
        return prefix, layers
  return None


def _is_hf(raw: RawCheckpoint) -> bool:
  if raw.hf_config and raw.hf_config.get("model_type") not in (None, "dinov3_vit"):
    return False
  return _hf_prefixes(raw.tensors) is not None


def convert_hf(reader: mapping.KeyReader, raw: RawCheckpoint) -> Tuple[ViTConfig, dict]:
  tensors = raw.tensors
  hf_config = raw.hf_config or {}
  prefixes = _hf_prefixes(tensors)
  if prefixes is None:  # Named explicitly but not an HF DINOv3: let the key check speak.
    prefixes = ("", "layer.")
  prefix, layers = prefixes
  if hf_config.get("use_gated_mlp") or layers + "0.mlp.gate_proj.weight" in tensors:
    _refuse(raw, "dinov3/hf", "it uses the gated MLP (`mlp.gate_proj`, use_gated_mlp=True: the "
            "ViT-S+/H+/7B SwiGLU); our Mlp is fc1 -> exact GELU -> fc2")
  if hf_config.get("hidden_act", "gelu") != "gelu":
    _refuse(raw, "dinov3/hf", f"hidden_act is {hf_config['hidden_act']!r}; we implement only "
            "exact 'gelu'")
  patch_weight = reader.get(prefix + "embeddings.patch_embeddings.weight", (-1, 3, -1, -1))
  width, _, patch, _ = patch_weight.shape
  depth = reader.count(layers + "{}.norm1.weight")
  mlp_dim = tensors[layers + "0.mlp.up_proj.weight"].shape[0] if depth else 4 * width
  num_heads = mapping.infer_heads(width, hf_config)
  head_dim = _check_head_dim(raw, width, num_heads)
  params, num_registers = _embeddings(
      reader, {"cls": prefix + "embeddings.cls_token",
               "registers": prefix + "embeddings.register_tokens",
               "patch": prefix + "embeddings.patch_embeddings", "norm": prefix + "norm"}, width)
  first = layers + "0.attention."
  qkv_bias = any(first + f"{p}_proj.bias" in tensors for p in "qkv")
  k_bias = first + "k_proj.bias" in tensors
  for i in range(depth):
    layer = f"{layers}{i}."
    linear = lambda name, shape: reader.get(layer + name + ".weight", shape)
    bias = lambda name, shape: reader.optional(layer + name + ".bias", shape)
    qkv_weight, qkv_b = mapping.fuse_qkv(
        [linear(f"attention.{p}_proj", (width, width)) for p in "qkv"],
        [bias(f"attention.{p}_proj", (width,)) for p in "qkv"])
    params[f"blocks_{i}"] = {
        "norm1": mapping.layer_norm(reader.get(layer + "norm1.weight", (width,)),
                                    reader.get(layer + "norm1.bias", (width,))),
        "norm2": mapping.layer_norm(reader.get(layer + "norm2.weight", (width,)),
                                    reader.get(layer + "norm2.bias", (width,))),
        "attn": mapping.attention(qkv_weight, qkv_b if qkv_bias else None,
                                  linear("attention.o_proj", (width, width)),
                                  reader.get(layer + "attention.o_proj.bias", (width,)), num_heads),
        "mlp": {"fc1": mapping.dense(linear("mlp.up_proj", (mlp_dim, width)),
                                     reader.get(layer + "mlp.up_proj.bias", (mlp_dim,))),
                "fc2": mapping.dense(linear("mlp.down_proj", (width, mlp_dim)),
                                     reader.get(layer + "mlp.down_proj.bias", (width,)))},
        "ls1": {"gamma": reader.get(layer + "layer_scale1.lambda1", (width,))},
        "ls2": {"gamma": reader.get(layer + "layer_scale2.lambda1", (width,))},
    }
  reader.ignore(prefix + "embeddings.mask_token", prefix + "rope_embeddings.*")
  # HF recomputes inv_freq = 1 / rope_theta ** (4 i / head_dim) in float32: the same periods.
  periods = pos_lib.rope_periods(head_dim, float(hf_config.get("rope_theta", ROPE_BASE)))
  image_size = hf_config.get("image_size", IMAGE_SIZE)
  image_size = image_size if isinstance(image_size, int) else IMAGE_SIZE
  eps = float(hf_config.get("layer_norm_eps", NORM_EPS))
  return _config(width, depth, num_heads, mlp_dim, patch, num_registers, periods,
                 qkv_bias=qkv_bias, k_bias=k_bias, eps=eps, image_size=image_size), params


register(Layout(family=FAMILY, name="original", detect=_is_original, convert=convert_original,
                description="facebookresearch/dinov3 hub .pth (ViT-S/B/L 16, storage tokens, "
                            "rope_embed.periods)"))
register(Layout(family=FAMILY, name="timm", detect=_is_timm, convert=convert_timm,
                description="timm vit_*_patch16_dinov3 and *_dinov3_qkvb (Eva)"))
register(Layout(family=FAMILY, name="hf", detect=_is_hf, convert=convert_hf,
                description="transformers DINOv3ViTModel (hub folder, save_pretrained or "
                            "state_dict)"))
