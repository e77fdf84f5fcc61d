"""Stage 2's options (models/two_stage.py `Stage2`): their values, defaults and check, written once.

The config block (config_lib.two_stage_model) and the `Stage2` module both take their defaults
from DEFAULTS, and `Stage2` runs `check` on whatever it is built with: a config's values after
its command-line overrides, or a direct call. No JAX or Flax here: config_lib imports this, and a
config loads without them.
"""

MASKS = ("soft", "hard", "ste")
FEATURES = ("cls", "cls_registers")
STE_SCOPES = ("layer", "stream")
HARD_GRADIENTS = ("selected", "none")

# The config's model.stage2 block less its mask, which a config always names.
DEFAULTS = {
    "feature": "cls",
    "ste_scope": "layer",
    "hard_gradient": "selected",
    "drop_background": True,
    "attention_tiles": 0,
}


def check(mask: str, feature: str, ste_scope: str, hard_gradient: str) -> None:
  """Raises ValueError naming the first option that is not one of its values."""
  for name, value, allowed in (("mask", mask, MASKS), ("feature", feature, FEATURES),
                               ("ste_scope", ste_scope, STE_SCOPES),
                               ("hard_gradient", hard_gradient, HARD_GRADIENTS)):
    if value not in allowed:
      raise ValueError(f"stage2 {name} must be one of {allowed}, got {value!r}")
