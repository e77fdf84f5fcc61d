"""Sizes, counts and rates checked when a config is loaded, so a bad value fails naming its key
(`config.data.batch_size=0 must be >= 1`) instead of deep in a run (a bare ZeroDivisionError).

The rules go by the key's own name, wherever it sits in the config, so every job's config is
covered without a schema per job; FULL_KEY_RULES refine a few keys by their full path. Keys
without a rule are not checked here (the code that reads them does).
"""

import math
from typing import Iterator, List, Tuple

# key name -> (lowest allowed value, what the value is). 0 often means "default" or "all"
# (image_size, num_steps, max_train, checkpoint_every_steps), so those only refuse negatives.
AT_LEAST_ONE = ("batch_size", "eval_batch_size", "base_batch_size", "log_every_steps",
                "chunk_size", "max_iters", "memory", "patch_size", "depth", "width", "num_heads",
                "mlp_dim", "read_threads")
AT_LEAST_ZERO = ("num_steps", "num_epochs", "checkpoint_every_steps", "eval_every_steps",
                 "eval_examples", "eval_images", "max_train", "max_val", "max_test",
                 "image_size", "resize", "num_parts", "worker_count", "warmup_steps", "steps",
                 "leakage_images", "overlay_images", "bootstrap", "attention_tiles", "patience",
                 "keep_checkpoints", "fsdp_min_size", "images", "checkpoint_every_minutes")
RATES = ("learning_rate", "weight_decay", "clip_norm", "tau", "tol", "eps")  # finite, >= 0
FRACTIONS = ("val_fraction", "alpha", "b1", "b2")  # in [0, 1)
# Full dotted keys whose rule is stricter than their name's.
FULL_KEY_RULES = {"model.num_parts": 1, "model.temperature": "positive"}


def _leaves(tree, prefix: str = "") -> Iterator[Tuple[str, object]]:
  for key, value in tree.items():
    path = f"{prefix}{key}"
    if hasattr(value, "items"):
      yield from _leaves(value, path + ".")
    else:
      yield path, value


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def problems(config) -> List[str]:
  """One sentence per size, count or rate of `config` that is out of range, naming the key."""
  found = []
  tree = config.to_dict() if hasattr(config, "to_dict") else config
  for path, value in _leaves(tree):
    if not _is_number(value):
      continue
    name = path.rsplit(".", 1)[-1]
    is_rate = name in RATES or ".learning_rates." in f".{path}"
    where = f"config.{path}={value!r}"
    rule = FULL_KEY_RULES.get(path)
    if isinstance(value, float) and not math.isfinite(value) and (
        is_rate or name in FRACTIONS or rule or name in AT_LEAST_ONE + AT_LEAST_ZERO):
      found.append(f"{where} must be a finite number.")
    elif rule == "positive" and not value > 0:
      found.append(f"{where} must be > 0.")
    elif isinstance(rule, int) and value < rule:
      found.append(f"{where} must be >= {rule}.")
    elif name in AT_LEAST_ONE and value < 1:
      found.append(f"{where} must be >= 1 (a size or count).")
    elif name in AT_LEAST_ZERO and value < 0:
      found.append(f"{where} must be >= 0 (a size or count; 0 means the default or all).")
    elif is_rate and value < 0:
      found.append(f"{where} must be >= 0 (a rate).")
    elif name in FRACTIONS and not 0 <= value < 1:
      found.append(f"{where} must be in [0, 1).")
  return found


def check(config) -> None:
  """Raises ValueError listing every out-of-range size, count or rate of `config`."""
  found = problems(config)
  if found:
    raise ValueError("Invalid config: " + " ".join(found))
