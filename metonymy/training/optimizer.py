"""AdamW with per-group learning rates and normalized weight decay (paper Appendix A).

  global-norm clipping (2) -> multi_transform({group: AdamW(cosine(lr_group), wd, decay_mask)})

Groups are named by the model's `param_groups(params)`; config.optimizer.learning_rates gives
each group's base rate at `base_batch_size` (64), scaled to the actual batch size by the square
root rule: lr = base * sqrt(batch / 64) (at 256 the Stage-2 backbone's 2e-6 becomes 4e-6).
Freezing has one form: frozen parameters (Stage 1's backbone) stay outside the trainable tree,
so they never reach the optimizer.

Weight decay is the paper's "normalized weight decay 0.05" (Loshchilov & Hutter), computed as
PDiscoFormer's code does: wd = weight_decay * sqrt(1 / (iterations_per_epoch * epochs)), where
iterations_per_epoch * epochs is the run's number of optimizer steps (`effective_weight_decay`;
about 9.5e-4 on CUB at batch 64 for 30 epochs). AdamW decouples it: each step a decayed
parameter p moves by -lr * wd * p besides Adam's step. `decay_mask` says which parameters decay:
2-D (and higher) weights only: the attribute heads' kernels and the trainable Stage-2 ViT's
patch embedding, attention and MLP weights. Not decayed, as in PDiscoFormer: the prototypes,
every 1-D parameter (LayerNorm scale and bias, the modulation, biases, LayerScale), any bias
whatever its shape (the ViT's qkv_bias is [3, heads, head_dim]) and the ViT's prefix (CLS,
register) and position tokens.
"""

import math
from typing import Callable, Dict, Tuple

import jax
import optax

# Leaf names never decayed whatever their shape: Stage 1's prototypes and the ViT's prefix and
# position tokens (models/stage1.py, models/vit.py). PDiscoFormer: `fc_landmarks` and timm's
# `no_weight_decay()` set (cls_token, reg_token, pos_embed).
NO_DECAY_NAMES = frozenset({"prototypes", "cls_token", "register_tokens", "pos_embed"})

SCALING = ("sqrt", "linear", "none")


SCHEDULES = ("cosine", "constant", "step")


def scaled_rate(base: float, batch_size: int, base_batch_size: int, scaling: str) -> float:
  if scaling == "sqrt":
    return base * math.sqrt(batch_size / base_batch_size)
  if scaling == "linear":
    return base * batch_size / base_batch_size
  if scaling == "none":
    return base
  raise ValueError(f"config.optimizer.lr_scaling must be one of {SCALING}, got {scaling!r}")


def schedule(peak: float, total_steps: int, warmup_steps: int, kind: str,
             halvings: int = 7) -> optax.Schedule:
  """Linear warm-up (if any) to `peak`, then one of SCHEDULES:
    cosine     annealing to 0 at `total_steps` (the paper's "cosine annealing schedule");
    constant   `peak` throughout;
    step       halved `halvings` times, at equal intervals of the run (PDiscoFormer's
               StepLR: the rate halved every 4 of its 28 epochs, 7 times)."""
  if kind == "cosine":
    if warmup_steps:
      return optax.warmup_cosine_decay_schedule(0.0, peak, warmup_steps, max(total_steps, 1))
    return optax.cosine_decay_schedule(peak, max(total_steps, 1))
  if kind == "constant":
    after = optax.constant_schedule(peak)
  elif kind == "step":
    interval = max(1, (max(total_steps, 1) - warmup_steps) // (halvings + 1))
    after = optax.exponential_decay(peak, interval, 0.5, staircase=True)
  else:
    raise ValueError(f"config.optimizer.schedule must be one of {SCHEDULES}, got {kind!r}")
  if warmup_steps:
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup_steps), after],
                                [warmup_steps])
  return after


def effective_weight_decay(opt_config, total_steps: int) -> float:
  """The decoupled weight decay AdamW applies.

  config.optimizer.weight_decay_normalized (default False when the key is absent) True:
  weight_decay * sqrt(1 / total_steps), total_steps = iterations_per_epoch * epochs (the
  normalized weight decay of Loshchilov & Hutter, as PDiscoFormer computes it); False:
  weight_decay as is.
  """
  if opt_config.weight_decay < 0:
    raise ValueError(f"config.optimizer.weight_decay must be >= 0, got {opt_config.weight_decay}")
  if opt_config.get("weight_decay_normalized", False):
    return opt_config.weight_decay * math.sqrt(1.0 / max(total_steps, 1))
  return opt_config.weight_decay


def _leaf_name(path) -> str:
  """The last key of a tree path ("kernel" for params["head"]["kernel"]); "" for the root."""
  if not path:
    return ""
  last = path[-1]
  return str(getattr(last, "key", getattr(last, "name", last)))


def decay_mask(params):
  """bool tree like `params` (arrays or ShapeDtypeStructs): True where weight decay applies.

  A leaf decays if it has at least 2 dimensions, its name is not in NO_DECAY_NAMES and does not
  end in "bias" (see the module docstring for why).
  """
  def decays(path, leaf) -> bool:
    name = _leaf_name(path)
    return len(leaf.shape) >= 2 and name not in NO_DECAY_NAMES and not name.endswith("bias")
  return jax.tree_util.tree_map_with_path(decays, params)


def make(opt_config, labels, total_steps: int,
         batch_size: int) -> Tuple[optax.GradientTransformation, Dict[str, Callable]]:
  """(optimizer, {group: learning-rate schedule}) for a tree of group labels.

  Every group's AdamW uses `effective_weight_decay(opt_config, total_steps)` on the parameters
  `decay_mask` selects.

  Raises ValueError naming any label the config has no learning rate for.
  """
  used = sorted(set(jax.tree_util.tree_leaves(labels)))
  rates = dict(opt_config.learning_rates)
  missing = [g for g in used if g not in rates]
  if missing:
    raise ValueError(f"config.optimizer.learning_rates has no entry for parameter group(s) "
                     f"{missing}; it has {sorted(rates)}.")
  weight_decay = effective_weight_decay(opt_config, total_steps)
  schedules, transforms = {}, {}
  for group in used:
    peak = scaled_rate(rates[group], batch_size, opt_config.base_batch_size, opt_config.lr_scaling)
    schedules[group] = schedule(peak, total_steps, opt_config.warmup_steps, opt_config.schedule,
                                int(opt_config.get("step_halvings", 7)))
    transforms[group] = optax.adamw(schedules[group], b1=opt_config.b1, b2=opt_config.b2,
                                    eps=opt_config.eps, weight_decay=weight_decay,
                                    # A callable: multi_transform hands each group's AdamW the
                                    # tree with the other groups' leaves masked out.
                                    mask=decay_mask)
  tx = optax.chain(optax.clip_by_global_norm(opt_config.clip_norm),
                   optax.multi_transform(transforms, labels))
  return tx, schedules
