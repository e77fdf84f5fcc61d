"""Stage 2's options (models/two_stage.py `Stage2`): their values, defaults, named variants and
check, written once.

The config block (config_lib.two_stage_model), the configs' two-stage variants
(config_lib.two_stage: configs/<dataset>_<mask>.py, Table 3's rows) and the `Stage2` module all
read DEFAULTS and VARIANTS here, and `Stage2` runs `check` on whatever it is built with: a
config's values after its command-line overrides, or a direct call. The table lives in models/
because `Stage2` needs its defaults and models/ imports nothing outside itself. No JAX or Flax
here: config_lib imports this, and a config loads without them.
"""

MASKS = ("soft", "hard", "ste")
FEATURES = ("cls", "cls_registers")
STE_SCOPES = ("layer", "stream")
HARD_GRADIENTS = ("selected", "none")

# The config's model.stage2 block and `Stage2`'s defaults. A config always names its mask (a
# variant below); "ste" is the module's own default, for a direct call.
DEFAULTS = {
    "mask": "ste",
    "feature": "cls",
    "ste_scope": "layer",
    "hard_gradient": "selected",
    "drop_background": True,
    "attention_tiles": 0,
    # The gradient Stage 2 sends Stage 1's maps, times this (the forward is untouched). 1 is eq. 9
    # as written ("L = L_att,stage1 + L_att,stage2 + ..."); 0 cuts Stage 2's feedback; > 1 is the
    # counterfactual that lets Stage 2's feedback compete with the priors at the prototypes.
    "feedback_scale": 1.0,
}

# The two-stage variants by name: the options each sets over DEFAULTS. Each mask goes by its own
# name; "hard_none" is hard masks as the main text reads them (paper §4.0.2: the argmax blocks the
# gradient, so Stage 1 learns from its own losses alone), Table 3's counterfactual.
VARIANTS = {**{mask: {"mask": mask} for mask in MASKS},
            "hard_none": {"mask": "hard", "hard_gradient": "none"}}


def variant(name: str) -> dict:
  """The Stage-2 options of the two-stage variant `name` over DEFAULTS (a copy); an unknown name
  is refused, naming the known ones."""
  if name not in VARIANTS:
    raise ValueError(f"Unknown two-stage variant {name!r}; known are {sorted(VARIANTS)}.")
  return dict(VARIANTS[name])


def check(mask: str, feature: str, ste_scope: str, hard_gradient: str,
          feedback_scale: float = 1.0) -> None:
  """Raises ValueError naming the first option that is not one of its values."""
  for name, value, allowed in (("mask", mask, MASKS), ("feature", feature, FEATURES),
                               ("ste_scope", ste_scope, STE_SCOPES),
                               ("hard_gradient", hard_gradient, HARD_GRADIENTS)):
    if value not in allowed:
      raise ValueError(f"stage2 {name} must be one of {allowed}, got {value!r}")
  if not isinstance(feedback_scale, (int, float)) or isinstance(feedback_scale, bool) or not (
      feedback_scale >= 0 and feedback_scale < float("inf")):
    raise ValueError(f"stage2 feedback_scale must be a finite number >= 0, got {feedback_scale!r}")
