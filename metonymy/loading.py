"""Runtime loading: a backbone from a config's `backbone` block, a part-discovery model from a
config, and a trained one from its workdir.

The one place that turns configs into weights. Configs (configs/, config_lib.py) never import
it, so reading a config touches neither Flax nor a checkpoint; models/ holds modules only.

  model, params, arch = loading.build_backbone(config.backbone, seed)
  model, frozen = loading.build_model(config, num_attributes)   # Stage 1 or two-stage
  masks = loading.load_part_masks(workdir)                      # models.stage1.PartMasks
"""

import json
import os
from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp
import ml_collections

from metonymy import checkpoints
from metonymy.models import part_model
from metonymy.models import sam_encoder
from metonymy.models import stage1
from metonymy.models import two_stage
from metonymy.models import vit
from metonymy.training import run_state

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
  if config.checkpoint and os.path.exists(os.path.join(config.checkpoint, run_state.MODEL_FILE)):
    masks = load_part_masks(config.checkpoint)  # A training workdir: its Stage-2 ViT.
    if "stage2" not in masks.params:
      raise ValueError(f"{config.checkpoint} is a single-stage workdir: its backbone is frozen; "
                       "pass that backbone's own checkpoint instead.")
    model = vit.VisionTransformer(masks.model.stage2.backbone)
    return model, masks.params["stage2"]["backbone"], model.config
  if config.checkpoint:
    model, params = checkpoints.load_backbone(config.checkpoint, family=config.family or None,
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


def load_part_masks(workdir: str, step: Optional[int] = None) -> stage1.PartMasks:
  """The part-discovery model trained in `workdir` (its latest checkpoint, or `step`) as a
  `PartMasks`: part maps, part ids on any patch grid, pixel labels, Stage-2 part features."""
  path = os.path.join(workdir, run_state.MODEL_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} not found: {workdir} is not a Stage-1 training workdir.")
  with open(path) as f:
    meta = json.load(f)
  if meta["model"]["name"] not in MODELS:
    raise ValueError(f"{workdir} holds a {meta['model']['name']!r} model, not a part-discovery "
                     "model ('stage1' or 'two_stage').")
  backbone = dict(meta["backbone"])
  saved = os.path.join(workdir, run_state.BACKBONE_DIR)
  if not backbone["checkpoint"]:
    if not os.path.isdir(saved):
      raise FileNotFoundError(f"{workdir} trained on a random-init backbone but {saved} is "
                              f"missing.")
    backbone["checkpoint"] = saved
  config = ml_collections.ConfigDict({"backbone": backbone, "model": meta["model"],
                                      "seed": meta["seed"]})
  model, frozen = build_model(config, meta["num_attributes"])
  images = jnp.zeros((1, meta["image_size"], meta["image_size"], 3), jnp.float32)
  abstract = jax.eval_shape(model.init, jax.random.PRNGKey(0), images, frozen)
  params, restored_step = run_state.restore_params(workdir, abstract, step)
  return stage1.PartMasks(model, params, frozen, dict(meta, step=restored_step))
