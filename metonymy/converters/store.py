"""Converted checkpoints: `DIR/arch.json` (the config) and `DIR/params` (Orbax), no torch needed.

arch.json holds `vit_config` (a vit.ViTConfig) or `sam_encoder_config` (SAM's image encoder).
"""

import json

import jax
import numpy as np
import orbax.checkpoint as ocp

from metonymy.converters.io import CheckpointError
from metonymy.models import sam_encoder
from metonymy.models import vit
from metonymy.workdir.layout import as_path, write_text

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


def is_converted(path) -> bool:
  """Whether `path` (local or gs://) is a converted folder."""
  return (as_path(path) / ARCH_FILE).exists()


def save_converted(directory, config, params, source: str = "") -> None:
  """A converted folder (local or gs://): the parameters (Orbax) and the architecture."""
  directory = as_path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(directory / PARAMS_DIR, jax.tree_util.tree_map(np.asarray, params),
                    force=True)
  checkpointer.wait_until_finished()
  write_text(directory / ARCH_FILE, json.dumps({_arch_key(config): config.to_dict(),
                                                "source": source}, indent=2, sort_keys=True))


def load_converted(directory):
  """(config, params) of a converted folder (local or gs://), checked against the
  architecture's shapes."""
  directory = as_path(directory)
  arch = json.loads((directory / ARCH_FILE).read_text())
  key = next((k for k in _ARCHITECTURES if k in arch), None)
  if key is None:
    raise CheckpointError(f"{directory}/{ARCH_FILE}: no {' or '.join(map(repr, _ARCHITECTURES))} "
                          "entry.")
  config_class, _, shapes = _ARCHITECTURES[key]
  config = config_class.from_dict(arch[key])
  target = jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), shapes(config))
  params_dir = directory / PARAMS_DIR
  if not params_dir.is_dir():
    raise CheckpointError(f"{directory}: missing the {PARAMS_DIR}/ folder of a converted checkpoint.")
  try:
    params = ocp.StandardCheckpointer().restore(params_dir, target)
  except Exception as e:  # Orbax reports tree/shape mismatches with several exception types.
    raise CheckpointError(f"{directory}: stored parameters do not fit {ARCH_FILE}: {e}") from e
  return config, params
