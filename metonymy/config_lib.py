"""Shared pieces that the files in configs/ compose. One definition each, no copies."""

import ml_collections

from metonymy.models import vit


def backbone(preset: str = "vit_b16", checkpoint: str = "", image_size: int = 0,
             family: str = "") -> ml_collections.ConfigDict:
  """Which backbone to build: a converted/PyTorch checkpoint, or a random-init preset.

  checkpoint: a converted folder (python -m metonymy.checkpoints convert) or a PyTorch /
    safetensors / Hugging Face checkpoint; empty means random weights of `preset`.
  image_size: input resolution in pixels; 0 means the backbone's own default.
  """
  return ml_collections.ConfigDict({
      "preset": preset,
      "checkpoint": checkpoint,
      "family": family,
      "image_size": image_size,
      "dtype": "float32",
  })


def build_backbone(config: ml_collections.ConfigDict, seed: int = 0):
  """(model, params, vit_config) for a `backbone()` config block."""
  import jax  # Imported here so configs stay importable without touching a JAX backend.
  from metonymy import checkpoints
  if config.checkpoint:
    model, params = checkpoints.load_backbone(config.checkpoint, family=config.family or None,
                                              image_size=config.image_size or None)
    return model, params, model.config
  vit_config = vit.get_config(config.preset)
  if config.image_size:
    vit_config = vit_config.replace(image_size=config.image_size)
  model, params = vit.init_params(vit_config, jax.random.PRNGKey(seed))
  return model, params, vit_config
