"""Weight import: PyTorch checkpoints (original repos, timm, Hugging Face) -> Flax backbone params.

  model, params = load_backbone("dinov2_vitb14_reg4_pretrain.pth")
  model, params = load_backbone("facebook-dinov2-base/")          # HF folder
  model, params = load_backbone("converted/dinov2_vitb14_reg4/")  # after `convert`, no torch
  model, params = load_backbone("sam_vit_b_01ec64.pth")          # a SamImageEncoder

Every family converts to a `vit.VisionTransformer` except SAM (`sam_encoder.SamImageEncoder`);
`architecture(config)` gives the module class and the parameter shapes of either config.

Every load is strict: one error lists the missing, unexpected and shape-mismatched keys.
"""

from typing import Optional, Tuple, Union

import jax
import numpy as np

from metonymy.converters import registry
from metonymy.converters import store
from metonymy.converters.io import CheckpointError, RawCheckpoint, read_checkpoint
from metonymy.converters.mapping import KeyReader
from metonymy.models import sam_encoder
from metonymy.models import vit

# Layout modules register themselves on import.
from metonymy.converters import timm_style  # noqa: F401  pylint: disable=unused-import
from metonymy.converters import hf_vit  # noqa: F401  pylint: disable=unused-import
from metonymy.converters import dinov3  # noqa: F401  pylint: disable=unused-import
from metonymy.converters import clip  # noqa: F401  pylint: disable=unused-import
from metonymy.converters import sam  # noqa: F401  pylint: disable=unused-import

__all__ = ["CheckpointError", "check_against_model", "convert_checkpoint", "load_backbone",
           "save_converted"]

save_converted = store.save_converted
architecture = store.architecture
BackboneConfig = Union[vit.ViTConfig, sam_encoder.SamEncoderConfig]


def check_against_model(config: BackboneConfig, params, source: str) -> None:
  """Compares the converted tree with what the config's module declares."""
  expected = jax.tree_util.tree_flatten_with_path(architecture(config)[1](config))[0]
  got = jax.tree_util.tree_flatten_with_path(params)[0]
  expected = {jax.tree_util.keystr(p): tuple(s.shape) for p, s in expected}
  got = {jax.tree_util.keystr(p): tuple(np.shape(x)) for p, x in got}
  missing = sorted(set(expected) - set(got))
  unexpected = sorted(set(got) - set(expected))
  mismatched = [f"{k}: converted {got[k]}, model expects {expected[k]}"
                for k in sorted(set(got) & set(expected)) if got[k] != expected[k]]
  if missing or unexpected or mismatched:
    raise CheckpointError(f"{source}: converted parameters do not fit the model: missing "
                          f"{missing}, unexpected {unexpected}, mismatched {mismatched}")


def convert_raw(raw: RawCheckpoint, family: Optional[str] = None):
  """(config, numpy params, layout full name) of an already-read checkpoint."""
  layout = registry.find_layout(raw, family)
  reader = KeyReader(raw.tensors, raw.path)
  config, params = layout.convert(reader, raw)
  reader.finish(layout.full_name)
  params = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float32), params)
  check_against_model(config, params, raw.path)
  return config, params, layout.full_name


def convert_checkpoint(path: str, family: Optional[str] = None,
                       image_size: Optional[int] = None) -> Tuple[BackboneConfig, dict, str]:
  """Reads and converts a PyTorch / safetensors / HF checkpoint: (config, params, layout)."""
  config, params, layout = convert_raw(read_checkpoint(path), family)
  if image_size:
    config = _with_image_size(config, image_size)
  return config, params, layout


def _with_image_size(config: BackboneConfig, image_size: int) -> BackboneConfig:
  if image_size % config.patch_size:
    raise ValueError(f"image_size {image_size} is not a multiple of the patch size {config.patch_size}.")
  return config.replace(image_size=image_size)


def load_backbone(path: str, family: Optional[str] = None, image_size: Optional[int] = None,
                  **model_kwargs):
  """(model, params) from a converted folder or any supported PyTorch checkpoint.

  Args:
    path: a converted folder (arch.json + params/), a .pth/.pt/.bin/.safetensors file, or a
      Hugging Face folder (config.json + weights).
    family: "dino", "dinov2", "dinov3", "clip", "mae", "rad_dino", "timm_vit", "sam", optionally
      with a layout ("dinov2/original"); detected from the keys when None.
    image_size: the default input resolution; the position table is resized on the fly, the way
      the checkpoint's reference implementation does it, whenever inputs differ from its grid.
    **model_kwargs: passed to the module (dtype, attention_impl; pad_to_multiple for ViTs).

  Returns:
    (model, params): a `vit.VisionTransformer`, or a `sam_encoder.SamImageEncoder` for SAM.
  """
  if store.is_converted(path):
    config, params = store.load_converted(path)
    if image_size:
      config = _with_image_size(config, image_size)
  else:
    config, params, _ = convert_checkpoint(path, family, image_size)
  params = jax.tree_util.tree_map(jax.numpy.asarray, params)
  return architecture(config)[0](config, **model_kwargs), params
