"""The self-supervised pretraining's options (training/self_supervised.py `Recipe`): their values,
defaults and checks, written once. No JAX here: config_lib imports this, so a config's
`backbone_pretraining.self_supervised` block holds every option with its default, and a
command-line override of one is checked like any other key.
"""

import dataclasses
from typing import Tuple

OBJECTIVES = ("dino", "ibot", "koleo", "pixels", "dense", "correspondence", "clusters",
              "attributes")
PIXEL_TARGETS = ("image", "patch")
PATCH_LOSSES = ("masked", "all")
PATCH_VIEWS = ("same", "cross")
TEACHER_CENTERINGS = ("mean", "sinkhorn")
ATTRIBUTE_HEADS = ("cls_and_parts", "cls")
# Options added after stand-ins made by this recipe were shipped, with the value that reproduces
# what came before: a stand-in's recipe leaves them out at that value (runs/stand_in.py), so the
# shipped stand-ins keep matching the configs that asked for them.
ADDED_LATER = {"dense_head": 0, "teacher_centering": "mean", "dense_target_radius": 0.0,
               "attribute_heads": "cls_and_parts", "attribute_block": 0,
               "correspondence": 0.0, "correspondence_temperature": 0.05,
               "correspondence_block": 0, "clusters": 0.0, "cluster_count": 16,
               "cluster_momentum": 0.99}


@dataclasses.dataclass(frozen=True)
class Recipe:
  """The weights of the objectives (0 switches one off) and their hyper-parameters."""
  dino: float = 1.0
  ibot: float = 1.0
  koleo: float = 0.1
  pixels: float = 0.0
  dense: float = 0.0
  correspondence: float = 0.0
  clusters: float = 0.0
  attributes: float = 0.0
  pixel_target: str = "image"
  prototypes: int = 256
  head_hidden: int = 128
  head_bottleneck: int = 64
  global_scale: Tuple[float, float] = (0.4, 1.0)
  # Each view's brightness moves by one offset ~ U(-b, b) (normalised units) on every pixel and
  # channel: the world's own per-image lighting (+-20 of 255 on every channel, ~0.35 here), which
  # keeps the differences between a part's tone and another's (docs/experiments.md).
  brightness: float = 0.0
  # The teacher sees each global crop under a lighting of its own (same geometry, another
  # brightness offset): its patch targets then ask the student's token for what lighting does
  # not change. False: the student's view, as DINOv2.
  relight_teacher: bool = False
  # Which student patch tokens predict the teacher's token at their place: "masked" (iBOT), or
  # "all" (every token of the global views; the unmasked ones predict it across lighting).
  patch_loss: str = "masked"
  # Where the teacher's patch targets come from: "same", the student's own view at the same
  # token (iBOT); "cross", the other global view at the same point of the image, for every token
  # of every student view, global and local (a dense DINO: a token seen with less or other
  # context must say what the teacher says there; the crops' geometry gives the pairs).
  patch_views: str = "same"
  # The dense term's softmax temperature over the tokens of one image (training/self_supervised.py
  # `dense_loss`).
  dense_temperature: float = 0.1
  # 0: the target is the one teacher token at the same image point; > 0: the teacher's
  # similarities to it, sharpened by this temperature (`dense_loss`).
  dense_target_temperature: float = 0.0
  # 0: the hard target above; > 0: the target spread over the teacher's tokens by their distance
  # from that token, a Gaussian of this standard deviation (in teacher patches), so the tokens of
  # a small neighbourhood need not be told apart and, unlike the teacher-similarity target, no
  # state of the teacher meets it (`dense_loss`).
  dense_target_radius: float = 0.0
  # 0: the dense term compares the backbone's own patch tokens; > 0: it compares their images
  # under an MLP projection head of this output width (`head_hidden` wide; the teacher's is the
  # EMA of the student's), as PixPro and VADeR do, so the head can spend what tells one point of
  # a part from another and the last block need keep only what the head reads.
  dense_head: int = 0
  # The cross-image correspondence term's target temperature (`correspondence_loss`): how sharply
  # the teacher's similarities between a point of one image and the tokens of another are turned
  # into the student's target (the student's own temperature is `dense_temperature`).
  correspondence_temperature: float = 0.05
  # Whose similarities make that target: 0, the teacher's last-block tokens (the tokens the
  # student's are compared with); k >= 1, the teacher's block-k tokens, whose nearest tokens in
  # another image may be the same part more often than the last block's (docs/experiments.md),
  # as STEGO takes its target from a backbone other than the features it trains.
  correspondence_block: int = 0
  # The cluster term's centroids (training/self_supervised.py `cluster_centroids`): how many, on
  # the unit sphere of the teacher's last-block patch tokens, every token of the batch's images
  # included (background too, so more than the parts: a plain region of a part need not share a
  # centroid with another region).
  cluster_count: int = 16
  # Each step moves a centroid this far towards the mean of the teacher's tokens it holds in the
  # batch (online spherical k-means); 0 would let one batch decide.
  cluster_momentum: float = 0.99
  # How the teacher's distributions are kept from one prototype winning everything: "mean",
  # DINO's running centre subtracted from the scores; "sinkhorn", DINOv2's Sinkhorn-Knopp over the
  # batch (every prototype takes an equal share of the batch's items: of its images for the CLS
  # head, of all its tokens for the patch head, so the tokens of one image cannot keep a
  # prototype to themselves and a prototype has to be something the images share).
  teacher_centering: str = "mean"
  # Which of the supervised stand-in's attribute read-outs (training/pretraining.py `HEADS`) the
  # attribute term trains through: both, or the CLS head alone. The part read-out pools the last
  # block's patch tokens, so its gradient pulls them towards the image's attributes; the CLS
  # head's reaches the patch tokens only through the blocks below the last.
  attribute_heads: str = "cls_and_parts"
  # Which block's output the attribute read-outs see: 0, the last block's (as the supervised
  # stand-in was trained); k >= 1, block k's through the same final norm, so the attribute term
  # sends the blocks above k no gradient and leaves them to the other terms (the dense one); the
  # CLS token's attributes reach the last block through the residual stream.
  attribute_block: int = 0
  local_crops: int = 4
  local_size: int = 32
  local_scale: Tuple[float, float] = (0.1, 0.4)
  mask_probability: float = 0.5
  mask_ratio: Tuple[float, float] = (0.1, 0.5)
  student_temperature: float = 0.1
  teacher_temperature: Tuple[float, float] = (0.04, 0.07)
  teacher_temperature_warmup: float = 0.3  # share of the steps over which it rises
  teacher_momentum: Tuple[float, float] = (0.992, 1.0)  # cosine from the first to the second
  center_momentum: float = 0.9

  def __post_init__(self):
    if self.patch_views not in PATCH_VIEWS:
      raise ValueError(f"patch_views must be one of {PATCH_VIEWS}, got {self.patch_views!r}")
    if self.patch_loss not in PATCH_LOSSES:
      raise ValueError(f"patch_loss must be one of {PATCH_LOSSES}, got {self.patch_loss!r}")
    if self.teacher_centering not in TEACHER_CENTERINGS:
      raise ValueError(f"teacher_centering must be one of {TEACHER_CENTERINGS}, got "
                       f"{self.teacher_centering!r}")
    if self.attribute_heads not in ATTRIBUTE_HEADS:
      raise ValueError(f"attribute_heads must be one of {ATTRIBUTE_HEADS}, got "
                       f"{self.attribute_heads!r}")
    if self.attribute_block < 0:
      raise ValueError(f"attribute_block must be 0 (the last) or a block >= 1, got "
                       f"{self.attribute_block}")
    if self.pixel_target not in PIXEL_TARGETS:
      raise ValueError(f"pixel_target must be one of {PIXEL_TARGETS}, got {self.pixel_target!r}")
    if self.dense_target_radius < 0 or (self.dense_target_radius > 0
                                        and self.dense_target_temperature > 0):
      raise ValueError("dense_target_radius must be 0 or > 0 with dense_target_temperature 0 (one "
                       f"soft target at a time), got {self.dense_target_radius} and "
                       f"{self.dense_target_temperature}")
    if self.correspondence_temperature <= 0:
      raise ValueError("correspondence_temperature must be > 0, got "
                       f"{self.correspondence_temperature}")
    if self.correspondence_block < 0:
      raise ValueError("correspondence_block must be 0 (the last) or a block >= 1, got "
                       f"{self.correspondence_block}")
    if self.cluster_count < 2:
      raise ValueError(f"cluster_count must be 2 or more, got {self.cluster_count}")
    if not 0.0 <= self.cluster_momentum < 1.0:
      raise ValueError(f"cluster_momentum must be in [0, 1), got {self.cluster_momentum}")
    if self.dense_head < 0:
      raise ValueError(f"dense_head must be 0 (no head) or a width > 0, got {self.dense_head}")
    if all(getattr(self, name) == 0 for name in OBJECTIVES):
      raise ValueError(f"every objective weight ({', '.join(OBJECTIVES)}) is 0: nothing to train")
    for name in ("global_scale", "local_scale", "mask_ratio"):
      low, high = getattr(self, name)
      if not 0.0 < low <= high <= 1.0:
        raise ValueError(f"{name} must be 0 < low <= high <= 1, got {(low, high)}")

  @property
  def distills(self) -> bool:
    """Whether a teacher is needed (DINO, iBOT, the dense, correspondence or cluster term)."""
    return (self.dino > 0 or self.ibot > 0 or self.dense > 0 or self.correspondence > 0
            or self.clusters > 0)

  @property
  def masks(self) -> bool:
    return self.ibot > 0 or self.pixels > 0

  @classmethod
  def from_dict(cls, options) -> "Recipe":
    options = dict(options)
    unknown = sorted(set(options) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
      raise ValueError(f"unknown self-supervised option(s) {unknown}; known: "
                       f"{sorted(f.name for f in dataclasses.fields(cls))}")
    for name in ("global_scale", "local_scale", "mask_ratio", "teacher_temperature",
                 "teacher_momentum"):
      if name in options:
        options[name] = tuple(float(v) for v in options[name])
    return cls(**options)


def as_config(overrides=None) -> dict:
  """Every option of Recipe as a plain dict (tuples as lists), the defaults updated by
  `overrides`, checked: a config's `self_supervised` block."""
  recipe = Recipe.from_dict(dict(overrides or {}))
  return {k: list(v) if isinstance(v, tuple) else v
          for k, v in dataclasses.asdict(recipe).items()}
