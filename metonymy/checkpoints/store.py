"""Converted checkpoints: `DIR/arch.json` (the config) and `DIR/params` (Orbax), no torch needed.

arch.json holds `vit_config` (a vit.ViTConfig) or `sam_encoder_config` (SAM's image encoder).
"""

import json
import os

import jax
import numpy as np
import orbax.checkpoint as ocp

from metonymy.checkpoints.io import CheckpointError
from metonymy.models import sam_encoder
from metonymy.models import vit

ARCH_FILE = "arch.json"
PARAMS_DIR = "params"
# arch.json key -> (config class, module class, param_shapes).
_ARCHITECTURES = {
    "vit_config": (vit.ViTConfig, vit.VisionTransformer, vit.param_shapes),
    "sam_encoder_config": (sam_encoder.SamEncoderConfig, sam_encoder.SamImageEncoder,
                           sam_encoder.param_shapes),
}


def _arch_key(config) -> str:
  for key, (config_class, _, _) in _ARCHITECTURES.items():
    if isinstance(config, config_class):
      return key
  raise TypeError(f"no backbone architecture takes a {type(config).__name__}")


def architecture(config):
  """(module class, param_shapes function) of a backbone config."""
  return _ARCHITECTURES[_arch_key(config)][1:]


def is_converted(path: str) -> bool:
  return os.path.isdir(path) and os.path.exists(os.path.join(path, ARCH_FILE))


def save_converted(directory: str, config, params, source: str = "") -> None:
  directory = os.path.abspath(directory)
  os.makedirs(directory, exist_ok=True)
  params_dir = os.path.join(directory, PARAMS_DIR)
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(params_dir, jax.tree_util.tree_map(np.asarray, params), force=True)
  checkpointer.wait_until_finished()
  with open(os.path.join(directory, ARCH_FILE), "w") as f:
    json.dump({_arch_key(config): config.to_dict(), "source": source}, f, indent=2, sort_keys=True)


def load_converted(directory: str):
  """(config, params) of a converted folder, checked against the architecture's shapes."""
  with open(os.path.join(directory, ARCH_FILE)) as f:
    arch = json.load(f)
  key = next((k for k in _ARCHITECTURES if k in arch), None)
  if key is None:
    raise CheckpointError(f"{directory}/{ARCH_FILE}: no {' or '.join(map(repr, _ARCHITECTURES))} "
                          "entry.")
  config_class, _, shapes = _ARCHITECTURES[key]
  config = config_class.from_dict(arch[key])
  target = jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), shapes(config))
  params_dir = os.path.join(os.path.abspath(directory), PARAMS_DIR)
  if not os.path.isdir(params_dir):
    raise CheckpointError(f"{directory}: missing the {PARAMS_DIR}/ folder of a converted checkpoint.")
  try:
    params = ocp.StandardCheckpointer().restore(params_dir, target)
  except Exception as e:  # Orbax reports tree/shape mismatches with several exception types.
    raise CheckpointError(f"{directory}: stored parameters do not fit {ARCH_FILE}: {e}") from e
  return config, params
