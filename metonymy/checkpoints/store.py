"""Converted checkpoints: `DIR/arch.json` (the ViTConfig) and `DIR/params` (Orbax), no torch needed."""

import json
import os

import jax
import numpy as np
import orbax.checkpoint as ocp

from metonymy.checkpoints.io import CheckpointError
from metonymy.models import vit

ARCH_FILE = "arch.json"
PARAMS_DIR = "params"


def is_converted(path: str) -> bool:
  return os.path.isdir(path) and os.path.exists(os.path.join(path, ARCH_FILE))


def save_converted(directory: str, config: vit.ViTConfig, params, source: str = "") -> None:
  directory = os.path.abspath(directory)
  os.makedirs(directory, exist_ok=True)
  params_dir = os.path.join(directory, PARAMS_DIR)
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(params_dir, jax.tree_util.tree_map(np.asarray, params), force=True)
  checkpointer.wait_until_finished()
  with open(os.path.join(directory, ARCH_FILE), "w") as f:
    json.dump({"vit_config": config.to_dict(), "source": source}, f, indent=2, sort_keys=True)


def load_converted(directory: str):
  """(ViTConfig, params) of a converted folder, checked against the architecture's shapes."""
  with open(os.path.join(directory, ARCH_FILE)) as f:
    arch = json.load(f)
  if "vit_config" not in arch:
    raise CheckpointError(f"{directory}/{ARCH_FILE}: no 'vit_config' entry.")
  config = vit.ViTConfig.from_dict(arch["vit_config"])
  target = jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), vit.param_shapes(config))
  params_dir = os.path.join(os.path.abspath(directory), PARAMS_DIR)
  if not os.path.isdir(params_dir):
    raise CheckpointError(f"{directory}: missing the {PARAMS_DIR}/ folder of a converted checkpoint.")
  try:
    params = ocp.StandardCheckpointer().restore(params_dir, target)
  except Exception as e:  # Orbax reports tree/shape mismatches with several exception types.
    raise CheckpointError(f"{directory}: stored parameters do not fit {ARCH_FILE}: {e}") from e
  return config, params
