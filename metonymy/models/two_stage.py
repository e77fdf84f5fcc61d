"""Two-stage part discovery: Stage 1's maps drive Stage 2's isolated part streams (paper §4.0.2).

  Stage 1 (frozen backbone + trainable head, models/stage1.py) -> maps A [B, K+1, h1, w1]
  Stage 2: a second ViT, initialised from the same weights and trainable, runs the early-masked
    forward: K+1 prefix copies, part k's copy and part k's patches form an isolated clique.
    The clique mask comes from A on Stage 2's patch grid (bilinearly resized if the grids differ):
      hard: argmax part per patch -> boolean block mask. Zero leakage. Its gradient to Stage 1
            (hard_gradient) is Appendix F's by default, "selected": every layer weights patch j
            in its part k's clique by a_k(j) / SG(a_k(j)) (value 1: the hard forward bit for bit),
            so the gradient reaches a_k(j) of the selected part only, and Stage 2 can shrink a
            part but not grow it (on Stage 2's grid: a bilinear resize spreads it over Stage
            1's neighbouring entries). "none": the main text's reading, no gradient to Stage 1.
      soft: additive bias log sum_k a_i^k a_j^k (attention_masks.soft_group_attention_bias).
            Differentiable, but every part sees every patch a little: it leaks.
      ste:  per attention layer SG(H_hard) + H_soft - SG(H_soft): the forward is the hard one
            bit for bit (zero leakage); the backward is the soft one (Stage 1 learns from Stage 2).
  f^k = part k's CLS (or the mean of CLS and registers) after the final norm   [B, K+1, D]
  S2[:, k] = W2 LN2(f^k) + b2 over the K foreground parts; routed as eq. 5 -> logits "stage2".

Why STE per layer rather than once for the whole stream: once-per-stream needs a full soft
forward beside the hard one (two Stage-2 passes), while per layer shares the qkv projections,
the MLPs and the attention scores, adding one softmax-weighted sum per layer. Both give an exact
hard forward; `python -m metonymy.bench two_stage` measures the cost against hard and soft.
Hard masks' "selected" gradient runs the same per-layer combination (with its own bias), so a
hard training step costs what an STE one does; hard_gradient="none" is the cheaper one.

The model follows the trainer's interface (models/stage1.py docstring): `out["logits"]` holds
"stage1" and "stage2", so the objective sums both attribute losses with the priors (eq. 9), and
evaluation adds their sum as the "ensemble" (Table S6).
"""

from typing import Any, Dict, Optional, Tuple

import einops
import flax.linen as nn
import jax
import jax.numpy as jnp

from metonymy.models import attention_masks
from metonymy.models import stage1 as stage1_lib
from metonymy.models import stage2_options
from metonymy.models import vit

MASKS = stage2_options.MASKS
HARD_GRADIENTS = stage2_options.HARD_GRADIENTS
FEATURES = stage2_options.FEATURES


def maps_to_patch_grid(maps: jnp.ndarray, grid: Tuple[int, int]) -> jnp.ndarray:
  """Stage-1 maps [B, K+1, h1, w1] -> part probabilities [B, h*w, K+1] on Stage 2's grid.

  Different patch sizes give different grids: the maps are resized bilinearly and renormalized
  so each patch's probabilities still sum to 1.
  """
  if tuple(maps.shape[-2:]) != tuple(grid):
    maps = jax.image.resize(maps, maps.shape[:2] + tuple(grid), "bilinear")
    maps = maps / jnp.maximum(jnp.sum(maps, axis=1, keepdims=True), 1e-12)
  return einops.rearrange(maps, "b k h w -> b (h w) k")


def scale_gradient(x: jnp.ndarray, scale: float) -> jnp.ndarray:
  """x in the forward pass (bit for bit); its gradient times `scale` in the backward pass."""
  if scale == 0:
    return jax.lax.stop_gradient(x)
  return jax.lax.stop_gradient(x) + scale * (x - jax.lax.stop_gradient(x))


class Stage2(nn.Module):
  """The isolated part streams and their routed attribute head.

  Attributes:
    backbone: the ViT architecture (the same pretrained weights as Stage 1's, trainable here).
    num_parts: K foreground parts.
    num_attributes: A.
    mask: "soft", "hard" or "ste".
    feature: "cls" or "cls_registers" (mean of each part's CLS and register tokens).
    ste_scope: where STE combines hard and soft: "layer" (every attention layer's output, the
      default) or "stream" (the final tokens of a full hard and a full soft pass).
    hard_gradient: what hard masks send Stage 1 in training: "selected" (the default; paper
      Appendix F and Table 3's hard row, which improves part discovery over single-stage and so
      needs a gradient into Stage 1): the gradient of the selected parts' probabilities only,
      through attention_masks.selected_part_attention_bias, run as STE runs its soft path
      (SG(H_hard) + H_gated - SG(H_gated) per layer: the forward is the hard one bit for bit,
      at STE's cost). "none": the main text's reading (§4.0.2), no gradient to Stage 1.
      Inference runs plain hard masks either way (no backward pass to feed).
    drop_background: at inference (train=False) with hard or STE masks, skip the background
      group: the foreground's features and scores are bit-identical, the background's features
      are zeros, and Stage 2 costs K P + N_fg tokens instead of (K + 1) P + N
      (models/block_sparse.py).
    attention_tiles: > 0: hard-mask attention tile by tile over the part-sorted sequence,
      skipping key tiles no query of a tile may see (models/block_sparse.py).
    feedback_scale: the gradient Stage 2 sends Stage 1's maps (through part_probs), times this;
      the forward and Stage 2's own gradients are untouched. 1 (the default) is eq. 9 as
      written, "L = L_att,stage1 + L_att,stage2 + ...": both attribute losses at weight 1. The
      paper is silent on the balance, and on a tiny backbone the priors' gradient at the
      prototypes can be 100x Stage 2's (docs/experiments.md), so > 1 is the counterfactual
      that asks whether Stage 2's feedback moves the parts once it is heard. Weighting
      L_att,stage2 instead would also rescale Stage 2's own training (through clipping and
      the optimizer), which this keeps out of the comparison.

  The defaults of the config's options are stage2_options.DEFAULTS (the config block's too), and
  they are checked on construction, so a bad value fails where the model is built.
  """
  backbone: vit.ViTConfig
  num_parts: int
  num_attributes: int
  mask: str = stage2_options.DEFAULTS["mask"]
  feature: str = stage2_options.DEFAULTS["feature"]
  ste_scope: str = stage2_options.DEFAULTS["ste_scope"]
  hard_gradient: str = stage2_options.DEFAULTS["hard_gradient"]
  drop_background: bool = stage2_options.DEFAULTS["drop_background"]
  attention_tiles: int = stage2_options.DEFAULTS["attention_tiles"]
  feedback_scale: float = stage2_options.DEFAULTS["feedback_scale"]
  attention_impl: Optional[str] = None  # VisionTransformer.attention_impl ("cudnn" on GPUs).
  norm_eps: float = 1e-5
  dtype: Any = jnp.float32

  def __post_init__(self):
    stage2_options.check(self.mask, self.feature, self.ste_scope, self.hard_gradient,
                         self.feedback_scale)
    super().__post_init__()

  @nn.compact
  def __call__(self, images: jnp.ndarray, part_probs: jnp.ndarray,
               train: bool = True) -> Dict[str, jnp.ndarray]:
    """images [B, H, W, 3]; part_probs [B, N, K+1] on Stage 2's patch grid (rows sum to 1).

    With train=False, STE runs the hard masks alone: its forward is the hard one bit for bit
    (tests/test_two_stage.py), and without a backward pass the soft half is dead weight. The
    same holds for hard masks' "selected" gradient, so inference may drop the background.
    """
    if self.feedback_scale != 1:
      part_probs = scale_gradient(part_probs, self.feedback_scale)
    model = vit.VisionTransformer(self.backbone, dtype=self.dtype,
                                  attention_impl=self.attention_impl,
                                  attention_tiles=self.attention_tiles, name="backbone")
    grid = model.patch_grid(images.shape)
    part_ids = jnp.argmax(jax.lax.stop_gradient(part_probs), axis=-1).reshape((-1,) + grid)
    run = lambda **kwargs: model(images, part_ids=part_ids, num_parts=self.num_parts,
                                 **kwargs)["part_tokens"]                     # [B, K+1, P, D]
    if self.mask == "hard" and train and self.hard_gradient == "selected":
      # The dense [L, L] bias carries the backward pass, so with attention_tiles > 0 this path
      # attends densely, as STE's does (equal to the tiled forward to rounding:
      # tests/test_block_sparse.py); zero leakage holds either way.
      bias = attention_masks.selected_part_attention_bias(
          part_probs, part_ids.reshape(part_ids.shape[0], -1), self.backbone.num_prefix)
      tokens = run(straight_through_bias=bias)
    elif self.mask == "hard" or (self.mask == "ste" and not train):
      tokens = run(drop_background=self.drop_background and not train)
    else:
      bias = attention_masks.soft_group_attention_bias(part_probs, self.backbone.num_prefix)
      if self.mask == "soft":
        tokens = run(attention_bias=bias)
      elif self.ste_scope == "layer":
        tokens = run(straight_through_bias=bias)
      else:  # "stream"
        soft = run(attention_bias=bias)
        tokens = jax.lax.stop_gradient(run()) + (soft - jax.lax.stop_gradient(soft))
    features = tokens[:, :, 0] if self.feature == "cls" else jnp.mean(tokens, axis=2)
    modulated = nn.LayerNorm(epsilon=self.norm_eps, use_fast_variance=False, name="norm")(features)
    scores = jnp.swapaxes(nn.Dense(self.num_attributes, name="head")(modulated[:, :-1]), 1, 2)
    routing, predicted = stage1_lib.route(scores)
    return {"part_features": features, "part_scores": scores, "routing": routing,
            "logits": predicted, "part_ids": part_ids}


class TwoStage:
  """Stage 1 + Stage 2 behind the trainer's model interface."""

  def __init__(self, stage1: stage1_lib.Stage1, stage2: Stage2):
    self.stage1 = stage1
    self.stage2 = stage2
    self.backbone = stage1.backbone  # The frozen ViT (its config gives mean/std).

  @property
  def num_parts(self) -> int:
    return self.stage1.num_parts

  def init(self, rng: jax.Array, images: jnp.ndarray, frozen=None):
    """{"stage1": head params, "stage2": {"backbone": a copy of `frozen`, "norm", "head"}}.

    Stage 1 draws from `rng` itself, exactly as the single-stage model does, so both arms of a
    single- vs two-stage comparison start Stage 1 from the same parameters; Stage 2's fresh
    LayerNorm and head draw from `fold_in(rng, 1)`.
    """
    if frozen is None:
      raise ValueError("TwoStage.init needs the frozen backbone parameters: Stage 2 starts as "
                       "a copy of them.")
    rng1, rng2 = rng, jax.random.fold_in(rng, 1)
    groups = self.num_parts + 1
    grid = self.backbone.patch_grid(images.shape)
    probs = jnp.full((1, grid[0] * grid[1], groups), 1.0 / groups)
    stage2 = self.stage2.init(rng2, jnp.zeros((1,) + images.shape[1:], jnp.float32), probs)["params"]
    stage2 = dict(stage2, backbone=jax.tree_util.tree_map(jnp.array, frozen))
    return {"stage1": self.stage1.init(rng1, images, frozen), "stage2": stage2}

  def apply(self, params, frozen, images: jnp.ndarray, *, train: bool,
            rng: Optional[jax.Array] = None, keep_background: bool = False) -> Dict[str, Any]:
    """Stage 1's outputs (maps, embeddings, ... see Stage1.apply), plus Stage 2's:
    stage2_part_features [B, K+1, D], stage2_part_scores [B, A, K], stage2_part_ids [B, h, w],
    and logits {"stage1": [B, A], "stage2": [B, A]}. keep_background: compute the background
    stream at inference too (Stage2.drop_background), for its features."""
    out = dict(self.stage1.apply(params["stage1"], frozen, images, train=train, rng=rng))
    probs = maps_to_patch_grid(out["maps"], self.backbone.patch_grid(images.shape))
    stage2 = self.stage2.clone(drop_background=False) if keep_background else self.stage2
    second = stage2.apply({"params": params["stage2"]}, images, probs, train=train)
    out["logits"] = dict(out["logits"], stage2=second["logits"])
    out.update(stage2_part_features=second["part_features"],
               stage2_part_scores=second["part_scores"], stage2_part_ids=second["part_ids"])
    return out

  def part_maps(self, params, frozen, images, *, train: bool, rng=None) -> jnp.ndarray:
    return self.stage1.part_maps(params["stage1"], frozen, images, train=train, rng=rng)

  def part_features(self, params, frozen, images) -> jnp.ndarray:
    """Stage 2's per-part features [B, K+1, D] (deterministic Stage-1 maps), for the benchmark;
    the background's too."""
    return self.apply(params, frozen, images, train=False,
                      keep_background=True)["stage2_part_features"]

  def param_groups(self, params):
    """Stage 1's groups; Stage 2's ViT is "backbone" (2e-6), its LayerNorm and head "heads"."""
    stage2 = {name: jax.tree_util.tree_map(lambda _: "backbone" if name == "backbone" else "heads",
                                           sub) for name, sub in params["stage2"].items()}
    return {"stage1": self.stage1.param_groups(params["stage1"]), "stage2": stage2}


def build(config, backbone: vit.VisionTransformer, num_attributes: int) -> TwoStage:
  """The two-stage model on `backbone` (metonymy/loading.py builds it) for a config whose `model`
  block has a `stage2` block."""
  stage1 = stage1_lib.build(config, backbone, num_attributes)
  # config_lib writes every option; the defaults fill in the ones a model block saved by an
  # older version (a workdir's model info) lacks.
  options = dict(stage2_options.DEFAULTS, **config.model.stage2)
  stage2 = Stage2(backbone=stage1.backbone.config, num_parts=config.model.num_parts,
                  num_attributes=num_attributes, mask=options["mask"], feature=options["feature"],
                  ste_scope=options["ste_scope"], hard_gradient=options["hard_gradient"],
                  drop_background=options["drop_background"],
                  attention_tiles=options["attention_tiles"],
                  feedback_scale=options["feedback_scale"],
                  attention_impl=config.backbone.get("attention_impl") or None,
                  dtype=jnp.dtype(config.backbone.dtype))
  return TwoStage(stage1, stage2)
