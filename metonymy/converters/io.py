"""Reading PyTorch-world checkpoints into flat {key: float32 numpy array} dicts.

Accepted inputs:
  * `.pth` / `.pt` / `.bin`: torch pickles, loaded with `weights_only=True` (needs torch);
  * `.safetensors` (no torch needed);
  * a Hugging Face folder: `config.json` plus `model.safetensors`, `pytorch_model.bin`, or a
    sharded `*.index.json`.

Training checkpoints are unwrapped (`model`, `state_dict`, `teacher`, `module`, ...) and the
`module.` / `backbone.` prefixes that DDP and the DINO heads add are stripped.
"""

import dataclasses
import json
import os
import zipfile
from typing import Any, Dict, Optional

import numpy as np
from safetensors import safe_open

TORCH_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt")
# Keys under which training scripts nest the backbone's state dict, in the order tried.
_WRAPPER_KEYS = ("model", "state_dict", "teacher", "model_state", "module", "net")
_STRIP_PREFIXES = ("module.", "backbone.", "_orig_mod.")


class CheckpointError(ValueError):
  """A checkpoint that cannot be read or does not fit the architecture."""


@dataclasses.dataclass
class RawCheckpoint:
  """Tensors of a checkpoint, plus what is known about where they came from."""
  tensors: Dict[str, np.ndarray]
  path: str
  file_format: str  # "torch", "safetensors" or "hf_folder".
  hf_config: Optional[Dict[str, Any]] = None


def _to_numpy(value) -> np.ndarray:
  if isinstance(value, np.ndarray):
    # Integer and bool buffers stay as they are; floats, including ml_dtypes' bfloat16 (kind
    # "V"), become float32.
    return value if value.dtype.kind in "iub" else value.astype(np.float32)
  if value.dtype.is_floating_point:  # A torch tensor.
    value = value.float()
  return value.detach().cpu().numpy()


def _unwrap(obj: Any, path: str) -> Dict[str, Any]:
  """Finds the flat tensor dict inside a training checkpoint."""
  for _ in range(3):
    if not isinstance(obj, dict):
      raise CheckpointError(f"{path}: expected a state dict (a mapping of names to tensors), "
                            f"found {type(obj).__name__}.")
    if any(hasattr(v, "shape") for v in obj.values()):
      break
    wrapper = next((k for k in _WRAPPER_KEYS if k in obj and isinstance(obj[k], dict)), None)
    if wrapper is None:
      raise CheckpointError(f"{path}: no tensors at the top level and none of the known wrapper "
                            f"keys {_WRAPPER_KEYS}; top-level keys: {sorted(obj)[:20]}")
    obj = obj[wrapper]
  tensors = {k: v for k, v in obj.items() if hasattr(v, "shape")}
  for prefix in _STRIP_PREFIXES:
    if tensors and all(k.startswith(prefix) for k in tensors):
      tensors = {k[len(prefix):]: v for k, v in tensors.items()}
  # DINO training checkpoints keep the projection head beside the backbone.
  if any(k.startswith("backbone.") for k in tensors):
    tensors = {k[len("backbone."):]: v for k, v in tensors.items() if k.startswith("backbone.")}
  return tensors


def _is_torchscript_archive(path: str) -> bool:
  """TorchScript zips carry compiled code (`<name>/code/...`) beside their tensors."""
  if not zipfile.is_zipfile(path):
    return False
  with zipfile.ZipFile(path) as archive:
    return any("/code/" in name for name in archive.namelist())


def _read_torch(path: str) -> Dict[str, np.ndarray]:
  try:
    import torch
  except ImportError as e:
    raise CheckpointError(f"{path}: reading a torch pickle needs PyTorch (pip install torch). "
                          "Convert it once with `python -m metonymy.converters convert` on a "
                          "machine with torch, or use a .safetensors file.") from e
  if _is_torchscript_archive(path):
    # OpenAI's released CLIP files are TorchScript archives, which weights_only refuses. A
    # TorchScript archive holds serialized TorchScript code, not arbitrary Python pickles.
    try:
      obj = torch.jit.load(path, map_location="cpu").state_dict()
    except Exception as e:
      raise CheckpointError(f"{path}: not a loadable TorchScript archive: {e}") from e
    return {k: _to_numpy(v) for k, v in _unwrap(obj, path).items()}
  try:
    obj = torch.load(path, map_location="cpu", weights_only=True)
  except Exception as e:  # torch raises many types for corrupt or unsafe files.
    raise CheckpointError(f"{path}: torch.load(weights_only=True) failed: {e}") from e
  return {k: _to_numpy(v) for k, v in _unwrap(obj, path).items()}


def _read_safetensors(path: str) -> Dict[str, np.ndarray]:
  tensors = {}
  try:
    with safe_open(path, framework="np") as f:
      for key in f.keys():
        tensors[key] = _to_numpy(f.get_tensor(key))
  except Exception as e:
    raise CheckpointError(f"{path}: not a readable safetensors file: {e}") from e
  return _unwrap(tensors, path)


def _read_hf_folder(path: str) -> RawCheckpoint:
  config_path = os.path.join(path, "config.json")
  with open(config_path) as f:
    hf_config = json.load(f)
  candidates = ["model.safetensors", "pytorch_model.bin"]
  for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
    index_path = os.path.join(path, index_name)
    if os.path.exists(index_path):
      with open(index_path) as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
      tensors = {}
      for shard in shards:
        tensors.update(read_file(os.path.join(path, shard)))
      return RawCheckpoint(tensors, path, "hf_folder", hf_config)
  for name in candidates:
    file_path = os.path.join(path, name)
    if os.path.exists(file_path):
      return RawCheckpoint(read_file(file_path), path, "hf_folder", hf_config)
  raise CheckpointError(f"{path}: a Hugging Face folder needs one of {candidates} (or a sharded "
                        f"index) beside config.json; found {sorted(os.listdir(path))}")


def read_file(path: str) -> Dict[str, np.ndarray]:
  """Flat float32 tensors of one weights file."""
  if not os.path.exists(path):
    raise CheckpointError(f"Checkpoint not found: {path}")
  if path.endswith(".safetensors"):
    return _read_safetensors(path)
  if path.endswith(TORCH_SUFFIXES):
    return _read_torch(path)
  raise CheckpointError(f"{path}: unknown checkpoint format; expected .pth/.pt/.bin/.ckpt, "
                        ".safetensors, or a Hugging Face folder with config.json.")


def read_checkpoint(path: str) -> RawCheckpoint:
  """Reads a weights file or a Hugging Face folder."""
  if os.path.isdir(path):
    if os.path.exists(os.path.join(path, "config.json")):
      return _read_hf_folder(path)
    raise CheckpointError(f"{path}: a folder must be a Hugging Face model (config.json + weights) "
                          "or a converted metonymy checkpoint (arch.json + params/).")
  file_format = "safetensors" if path.endswith(".safetensors") else "torch"
  return RawCheckpoint(read_file(path), path, file_format)
