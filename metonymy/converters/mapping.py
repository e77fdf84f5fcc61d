"""Strict key bookkeeping and the tensor transforms shared by every layout.

Every layout reads its tensors through a `KeyReader`, which records what was missing, what had
the wrong shape, and what was never used; `finish()` raises one `CheckpointError` listing all
three. A checkpoint is converted completely or not at all.
"""

import fnmatch
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from metonymy.converters.io import CheckpointError


class KeyReader:
  """Reads tensors by name and keeps the books for a strict load."""

  def __init__(self, tensors: Dict[str, np.ndarray], source: str):
    self.tensors = tensors
    self.source = source
    self.used = set()
    self.missing: List[str] = []
    self.mismatched: List[str] = []
    self.ignored: List[str] = []

  def has(self, key: str) -> bool:
    return key in self.tensors

  def get(self, key: str, shape: Optional[Sequence[int]] = None) -> np.ndarray:
    """The tensor `key` (float32), checked against `shape` when given (-1 matches any size)."""
    if key not in self.tensors:
      self.missing.append(key + (f" {tuple(shape)}" if shape is not None else ""))
      return np.zeros([max(s, 1) for s in shape] if shape is not None else (1,), np.float32)
    self.used.add(key)
    value = self.tensors[key]
    if shape is not None:
      shape = tuple(shape)
      if len(shape) != value.ndim or any(s not in (-1, v) for s, v in zip(shape, value.shape)):
        self.mismatched.append(f"{key}: checkpoint {tuple(value.shape)}, expected {shape}")
        if -1 not in shape:  # A placeholder of the right shape lets conversion go on to report
          return np.zeros(shape, np.float32)  # every problem at once in finish().
    return np.asarray(value, np.float32)

  def optional(self, key: str, shape: Optional[Sequence[int]] = None) -> Optional[np.ndarray]:
    return self.get(key, shape) if key in self.tensors else None

  def ignore(self, *patterns: str) -> None:
    """Marks keys the backbone does not use (heads, mask tokens, buffers) as deliberately dropped."""
    for key in self.tensors:
      if key not in self.used and any(fnmatch.fnmatchcase(key, p) for p in patterns):
        self.used.add(key)
        self.ignored.append(key)

  def count(self, pattern: str) -> int:
    """How many distinct integers fill the `{}` of pattern (e.g. 'blocks.{}.norm1.weight')."""
    prefix, suffix = pattern.split("{}")
    found = set()
    for key in self.tensors:
      if key.startswith(prefix) and key.endswith(suffix):
        middle = key[len(prefix):len(key) - len(suffix)]
        if middle.isdigit():
          found.add(int(middle))
    if found and found != set(range(len(found))):
      raise CheckpointError(f"{self.source}: layer indices of {pattern!r} are not contiguous: "
                            f"{sorted(found)}")
    return len(found)

  def finish(self, layout: str) -> None:
    unexpected = sorted(set(self.tensors) - self.used)
    if self.missing or self.mismatched or unexpected:
      lines = [f"{self.source}: the checkpoint does not fit layout {layout!r}."]
      for title, items in (("missing keys", self.missing), ("shape mismatches", self.mismatched),
                           ("unexpected keys", unexpected)):
        if items:
          shown = items[:25] + ([f"... and {len(items) - 25} more"] if len(items) > 25 else [])
          lines.append(f"  {len(items)} {title}:\n    " + "\n    ".join(shown))
      raise CheckpointError("\n".join(lines))


def dense(weight: np.ndarray, bias: Optional[np.ndarray] = None) -> Dict[str, np.ndarray]:
  """torch Linear (out, in) -> Flax Dense {'kernel': (in, out), 'bias'}."""
  out = {"kernel": np.ascontiguousarray(weight.T)}
  if bias is not None:
    out["bias"] = bias
  return out


def layer_norm(weight: np.ndarray, bias: np.ndarray) -> Dict[str, np.ndarray]:
  return {"scale": weight, "bias": bias}


def conv_patch_embed(weight: np.ndarray, bias: Optional[np.ndarray]) -> Dict[str, np.ndarray]:
  """torch Conv2d OIHW -> Flax Conv HWIO."""
  out = {"kernel": np.ascontiguousarray(weight.transpose(2, 3, 1, 0))}
  if bias is not None:
    out["bias"] = bias
  return out


def attention(qkv_weight: np.ndarray, qkv_bias: Optional[np.ndarray], proj_weight: np.ndarray,
              proj_bias: np.ndarray, num_heads: int) -> Dict[str, np.ndarray]:
  """Fused torch qkv (3D, D) rows [q; k; v], heads contiguous -> our attention params."""
  width = proj_weight.shape[0]
  head_dim = width // num_heads
  out = {
      "qkv_kernel": np.ascontiguousarray(qkv_weight.T.reshape(width, 3, num_heads, head_dim)),
      "out_kernel": np.ascontiguousarray(proj_weight.T.reshape(num_heads, head_dim, width)),
      "out_bias": proj_bias,
  }
  if qkv_bias is not None:
    out["qkv_bias"] = qkv_bias.reshape(3, num_heads, head_dim)
  return out


def fuse_qkv(weights: Sequence[np.ndarray], biases: Sequence[Optional[np.ndarray]]
             ) -> Tuple[np.ndarray, Optional[np.ndarray]]:
  """Separate q, k, v Linear tensors -> one fused (3D, D) weight and (3D,) bias.

  A missing bias (DINOv3's k) is zero; if all three are missing the bias is None.
  """
  weight = np.concatenate(list(weights), axis=0)
  if all(b is None for b in biases):
    return weight, None
  width = weights[0].shape[0]
  bias = np.concatenate([np.zeros((width,), np.float32) if b is None else b for b in biases])
  return weight, bias


def block(reader: KeyReader, names: Dict[str, str], index: int, width: int, num_heads: int,
          mlp_dim: int, qkv_bias: bool = True, layer_scale: bool = False) -> Dict[str, object]:
  """One pre-norm block from a fused-qkv layout; `names` maps our roles to key templates.

  Roles: norm1, norm2 (prefixes of .weight/.bias), qkv, proj, fc1, fc2 (Linear prefixes),
  ls1, ls2 (full keys of LayerScale vectors). Templates contain `{i}` for the block index.
  """
  key = lambda role: names[role].format(i=index)
  params = {
      "norm1": layer_norm(reader.get(key("norm1") + ".weight", (width,)),
                          reader.get(key("norm1") + ".bias", (width,))),
      "norm2": layer_norm(reader.get(key("norm2") + ".weight", (width,)),
                          reader.get(key("norm2") + ".bias", (width,))),
      "attn": attention(reader.get(key("qkv") + ".weight", (3 * width, width)),
                        reader.get(key("qkv") + ".bias", (3 * width,)) if qkv_bias else None,
                        reader.get(key("proj") + ".weight", (width, width)),
                        reader.get(key("proj") + ".bias", (width,)), num_heads),
      "mlp": {"fc1": dense(reader.get(key("fc1") + ".weight", (mlp_dim, width)),
                           reader.get(key("fc1") + ".bias", (mlp_dim,))),
              "fc2": dense(reader.get(key("fc2") + ".weight", (width, mlp_dim)),
                           reader.get(key("fc2") + ".bias", (width,)))},
  }
  if layer_scale:
    params["ls1"] = {"gamma": reader.get(key("ls1"), (width,))}
    params["ls2"] = {"gamma": reader.get(key("ls2"), (width,))}
  return params


def infer_heads(width: int, hf_config: Optional[dict] = None, default_head_dim: int = 64) -> int:
  """Number of heads: from an HF config when there is one, else width / 64 (every ViT here)."""
  if hf_config:
    for key in ("num_attention_heads", "num_heads"):
      if key in hf_config:
        return int(hf_config[key])
  if width % default_head_dim:
    raise CheckpointError(f"Cannot infer the number of heads for width {width}; pass an HF config.")
  return width // default_head_dim


def square_grid(num_positions: int, source: str) -> Tuple[int, int]:
  side = int(round(num_positions ** 0.5))
  if side * side != num_positions:
    raise CheckpointError(f"{source}: {num_positions} patch positions is not a square grid.")
  return side, side


def first_present(reader: KeyReader, keys: Iterable[str]) -> Optional[str]:
  return next((k for k in keys if reader.has(k)), None)
