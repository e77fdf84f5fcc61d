"""AdamW with per-group learning rates (paper Appendix A).

  global-norm clipping (2) -> multi_transform({group: AdamW(cosine(lr_group), wd 0.05)})

Groups are named by the model's `param_groups(params)`; config.optimizer.learning_rates gives
each group's base rate at `base_batch_size` (64), scaled to the actual batch size by the square
root rule: lr = base * sqrt(batch / 64) (at 256 the Stage-2 backbone's 2e-6 becomes 4e-6). The
group "frozen" gets no update and no state. Parameters outside the trainable tree (the frozen
Stage-1 backbone) never reach the optimizer at all.
"""

import math
from typing import Callable, Dict, Tuple

import jax
import optax

FROZEN = "frozen"
SCALING = ("sqrt", "linear", "none")


def scaled_rate(base: float, batch_size: int, base_batch_size: int, scaling: str) -> float:
  if scaling == "sqrt":
    return base * math.sqrt(batch_size / base_batch_size)
  if scaling == "linear":
    return base * batch_size / base_batch_size
  if scaling == "none":
    return base
  raise ValueError(f"config.optimizer.lr_scaling must be one of {SCALING}, got {scaling!r}")


def schedule(peak: float, total_steps: int, warmup_steps: int, kind: str) -> optax.Schedule:
  """Linear warm-up (if any) to `peak`, then cosine annealing to 0 at `total_steps` (or constant)."""
  if kind == "cosine":
    if warmup_steps:
      return optax.warmup_cosine_decay_schedule(0.0, peak, warmup_steps, max(total_steps, 1))
    return optax.cosine_decay_schedule(peak, max(total_steps, 1))
  if kind == "constant":
    if warmup_steps:
      return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup_steps),
                                   optax.constant_schedule(peak)], [warmup_steps])
    return optax.constant_schedule(peak)
  raise ValueError(f"config.optimizer.schedule must be 'cosine' or 'constant', got {kind!r}")


def make(opt_config, labels, total_steps: int,
         batch_size: int) -> Tuple[optax.GradientTransformation, Dict[str, Callable]]:
  """(optimizer, {group: learning-rate schedule}) for a tree of group labels.

  Raises ValueError naming any label the config has no learning rate for.
  """
  used = sorted(set(jax.tree_util.tree_leaves(labels)))
  rates = dict(opt_config.learning_rates)
  missing = [g for g in used if g != FROZEN and g not in rates]
  if missing:
    raise ValueError(f"config.optimizer.learning_rates has no entry for parameter group(s) "
                     f"{missing}; it has {sorted(rates)}.")
  schedules, transforms = {}, {}
  for group in used:
    if group == FROZEN:
      transforms[group] = optax.set_to_zero()
      continue
    peak = scaled_rate(rates[group], batch_size, opt_config.base_batch_size, opt_config.lr_scaling)
    schedules[group] = schedule(peak, total_steps, opt_config.warmup_steps, opt_config.schedule)
    transforms[group] = optax.adamw(schedules[group], b1=opt_config.b1, b2=opt_config.b2,
                                    eps=opt_config.eps, weight_decay=opt_config.weight_decay)
  tx = optax.chain(optax.clip_by_global_norm(opt_config.clip_norm),
                   optax.multi_transform(transforms, labels))
  return tx, schedules
