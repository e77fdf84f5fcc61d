"""Runtime loading: a backbone from a config's `backbone` block, a part-discovery model from a
config, and a trained one from its workdir.

The one place that turns configs into weights. Configs (configs/, config_lib.py) never import
it, so reading a config touches neither Flax nor a checkpoint; models/ holds modules only.

  model, params, arch = loading.build_backbone(config.backbone, seed)
  model, frozen = loading.build_model(config, num_attributes)   # Stage 1 or two-stage
  trained = loading.load_trained_part_model(workdir)           # trained_part_model
"""

import os
from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp
import ml_collections

from metonymy import converters
from metonymy import trained_part_model
from metonymy.models import part_model
from metonymy.models import sam_encoder
from metonymy.models import stage1
from metonymy.models import two_stage
from metonymy.models import vit
from metonymy.workdir import Workdir
from metonymy.workdir import trained_params

# config.model.name -> the module whose `build(config, backbone, num_attributes)` makes it.
MODELS = {"stage1": stage1, "two_stage": two_stage}


def build_backbone(config: ml_collections.ConfigDict, seed: int = 0):
  """(model, params, arch config) for a `config_lib.backbone()` block; the model computes in
  `config.dtype` with `config.attention_impl`."""
  model, params, arch = _load_backbone(config, seed)
  if config.get("part_pooling"):
    if not hasattr(arch, "part_pooling"):
      raise ValueError("backbone.part_pooling is SAM's opt-in early masking; this backbone has a "
                       "CLS token and masks early on its own.")
    arch = arch.replace(part_pooling=True)
    model = model.clone(config=arch)
  model = model.clone(dtype=jnp.dtype(config.get("dtype") or "float32"),
                      attention_impl=config.get("attention_impl") or None)
  return model, params, arch


def _load_backbone(config: ml_collections.ConfigDict, seed: int):
  if config.checkpoint and Workdir(config.checkpoint).is_training_workdir():
    masks = load_trained_part_model(config.checkpoint)  # A training workdir: its Stage-2 ViT.
    if "stage2" not in masks.params:
      raise ValueError(f"{config.checkpoint} is a single-stage workdir: its backbone is frozen; "
                       "pass that backbone's own checkpoint instead.")
    model = vit.VisionTransformer(masks.model.stage2.backbone)
    return model, masks.params["stage2"]["backbone"], model.config
  if config.checkpoint:
    model, params = converters.load_backbone(config.checkpoint, family=config.family or None,
                                              image_size=config.image_size or None)
    return model, params, model.config
  if config.preset.startswith("sam_"):
    arch = sam_encoder.get_config(config.preset)
    if config.image_size:
      arch = arch.replace(image_size=config.image_size)
    model, params = sam_encoder.init_params(arch, jax.random.PRNGKey(seed))
    return model, params, arch
  arch = vit.get_config(config.preset)
  if "arch" in config:  # Random-init runs may override preset fields (random_backbone()).
    arch = arch.replace(**{k: tuple(v) if isinstance(v, list) else v
                           for k, v in config.arch.to_dict().items()})
  if config.image_size:
    arch = arch.replace(image_size=config.image_size)
  model, params = vit.init_params(arch, jax.random.PRNGKey(seed))
  return model, params, arch


def build_model(config: ml_collections.ConfigDict,
                num_attributes: int) -> Tuple[part_model.PartModel, Any]:
  """(model, frozen backbone parameters) for a config with `backbone`, `model` and `seed`;
  `config.model.name` picks the model ("stage1" or "two_stage")."""
  name = config.model.name
  if name not in MODELS:
    raise ValueError(f"config.model.name={name!r} is not a part-discovery model; expected one of "
                     f"{sorted(MODELS)}.")
  backbone, frozen, _ = build_backbone(config.backbone, config.seed)
  return MODELS[name].build(config, backbone, num_attributes), frozen


def load_trained_part_model(workdir, step: Optional[int] = None
                            ) -> trained_part_model.TrainedPartModel:
  """The part-discovery model trained in `workdir` (local or gs://; its latest checkpoint, or
  `step`): part maps, part ids on any patch grid, pixel labels, Stage-2 part features."""
  files = Workdir(workdir)
  meta = files.read_model_info()
  if meta["model"]["name"] not in MODELS:
    raise ValueError(f"{files.path} holds a {meta['model']['name']!r} model, not a "
                     "part-discovery model ('stage1' or 'two_stage').")
  backbone = dict(meta["backbone"])
  # A sub-run records its backbone relative to its workdir ("workdir:../backbone"); an older
  # record is an absolute path, which resolve_path keeps.
  backbone["checkpoint"] = files.resolve(backbone["checkpoint"])
  if not backbone["checkpoint"]:
    if not files.backbone.is_dir():
      raise FileNotFoundError(f"{files.path} trained on a random-init backbone but "
                              f"{files.backbone} is missing.")
    backbone["checkpoint"] = os.fspath(files.backbone)
  config = ml_collections.ConfigDict({"backbone": backbone, "model": meta["model"],
                                      "seed": meta["seed"]})
  model, frozen = build_model(config, meta["num_attributes"])
  images = jnp.zeros((1, meta["image_size"], meta["image_size"], 3), jnp.float32)
  abstract = jax.eval_shape(model.init, jax.random.PRNGKey(0), images, frozen)
  params, restored_step = trained_params.restore_params(files.path, abstract, step)
  return trained_part_model.TrainedPartModel(model, params, frozen,
                                             dict(meta, step=restored_step))
