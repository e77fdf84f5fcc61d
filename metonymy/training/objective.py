"""The part-discovery training objective (eq. 9) for any model with the trainer's interface.

  L = sum_heads L_att(head) + w_perp L_perp + w_tv L_tv + w_eq L_eq + w_fg L_p,fg + w_bg L_p,bg
      + w_ent L_ent

`heads` are the entries of the model's `out["logits"]`: {"stage1"} for the single-stage model;
Stage 2 adds "stage2", which gives eq. 9's L_att,stage1 + L_att,stage2 without a change here.
The priors act on `out["maps"]` (Stage 1's maps in both models). A term whose weight is 0 is not
computed (an equivariance weight of 0 saves the second forward pass).

`loss.prior_decay` (off by default) lowers every prior's weight late in training by one factor,
`prior_scale`: a counterfactual, not the paper's recipe, that lets the attribute losses (Stage
2's feedback among them) shape parts the priors have already placed.
"""

import math
from typing import Any, Dict, Optional, Tuple

import jax
import jax.numpy as jnp

from metonymy.models import part_model
from metonymy.training import geometry
from metonymy.training import losses

WEIGHT_KEYS = ("attribute", "orthogonality", "total_variation", "equivariance",
               "foreground_presence", "background_presence", "entropy")
ORTHOGONALITY = {"decorrelated": losses.decorrelated_orthogonality,
                 "pdisco": losses.pdisco_orthogonality}
EMBEDDINGS = {"embeddings": "part_embeddings", "modulated": "modulated_embeddings"}
PRIOR_KEYS = WEIGHT_KEYS[1:]  # Every term but the attribute losses (config_lib.PRIOR_TERMS).


def prior_scale(loss_config, step, total_steps: int) -> Optional[jnp.ndarray]:
  """The factor on every prior's weight at optimizer step `step` (an int or int32 []): 1 until
  `loss.prior_decay.start` of training, then a half cosine down to `loss.prior_decay.final` at
  the last step. None when the decay is off (start 1 or final 1, the default), so the
  objective is then exactly the one without the option."""
  decay = loss_config.get("prior_decay")
  if decay is None or decay.start >= 1.0 or decay.final == 1.0:
    return None
  begin = decay.start * total_steps
  progress = jnp.clip((jnp.asarray(step, jnp.float32) - begin)
                      / max(total_steps - 1 - begin, 1.0), 0.0, 1.0)
  return decay.final + (1.0 - decay.final) * 0.5 * (1.0 + jnp.cos(math.pi * progress))


def check_config(loss_config) -> None:
  """Fails early, naming the key, on a loss config the objective cannot use."""
  weights = dict(loss_config.weights)
  unknown = sorted(set(weights) - set(WEIGHT_KEYS))
  missing = sorted(set(WEIGHT_KEYS) - set(weights))
  if unknown or missing:
    raise ValueError(f"config.loss.weights: unknown keys {unknown}, missing keys {missing}; "
                     f"expected exactly {list(WEIGHT_KEYS)}.")
  for key, value in weights.items():
    if value < 0:
      raise ValueError(f"config.loss.weights.{key} must be >= 0, got {value}")
  if loss_config.orthogonality not in ORTHOGONALITY:
    raise ValueError(f"config.loss.orthogonality must be one of {sorted(ORTHOGONALITY)}, got "
                     f"{loss_config.orthogonality!r}")
  if loss_config.orthogonality_on not in EMBEDDINGS:
    raise ValueError(f"config.loss.orthogonality_on must be one of {sorted(EMBEDDINGS)}, got "
                     f"{loss_config.orthogonality_on!r}")
  decay = loss_config.get("prior_decay")
  if decay is not None:
    if sorted(decay) != ["final", "start"]:
      raise ValueError(f"config.loss.prior_decay: keys {sorted(decay)}, expected "
                       "['final', 'start']")
    if not 0.0 <= decay.start <= 1.0 or not 0.0 <= decay.final <= 1.0:
      raise ValueError(f"config.loss.prior_decay: start {decay.start} and final {decay.final} "
                       "must each lie in [0, 1]")


def loss_terms(model: part_model.PartModel, params, frozen, batch: Dict[str, jnp.ndarray],
               rng: jax.Array, loss_config, prior_factor: Optional[jnp.ndarray] = None
               ) -> Tuple[Dict[str, Tuple[float, jnp.ndarray]], jnp.ndarray]:
  """({term: (weight, unweighted value)} for every computed term, Stage 1's maps
  [B, K+1, h, w]) of one training batch; `loss_fn` documents the arguments."""
  terms, maps = _unscaled_terms(model, params, frozen, batch, rng, loss_config)
  if prior_factor is not None:
    terms = {name: (weight * prior_factor if name in PRIOR_KEYS else weight, value)
             for name, (weight, value) in terms.items()}
  return terms, maps


def _unscaled_terms(model, params, frozen, batch, rng, loss_config):
  weights = loss_config.weights
  rng_model, rng_warp, rng_model_warped = jax.random.split(rng, 3)
  out = model.apply(params, frozen, batch["image"], train=True, rng=rng_model)
  maps = out["maps"]
  terms = {}
  for head, logits in out["logits"].items():
    terms[f"attribute_{head}"] = (weights.attribute, losses.attribute_bce(
        logits, batch["attributes"], batch.get("attribute_valid")))
  if weights.orthogonality:
    vectors = out[EMBEDDINGS[loss_config.orthogonality_on]]
    terms["orthogonality"] = (weights.orthogonality,
                              ORTHOGONALITY[loss_config.orthogonality](vectors))
  if weights.total_variation:
    terms["total_variation"] = (weights.total_variation, losses.total_variation(maps))
  if weights.foreground_presence:
    terms["foreground_presence"] = (weights.foreground_presence, losses.foreground_presence(maps))
  if weights.background_presence:
    terms["background_presence"] = (weights.background_presence, losses.background_presence(maps))
  if weights.entropy:
    terms["entropy"] = (weights.entropy, losses.pixel_entropy(maps))
  if weights.equivariance:
    eq = loss_config.equivariance
    transform = geometry.sample_affine(rng_warp, eq.degrees, eq.translate, tuple(eq.scale))
    warped = geometry.warp_images(batch["image"], transform)
    maps_warped = model.part_maps(params, frozen, warped, train=True, rng=rng_model_warped)
    terms["equivariance"] = (weights.equivariance,
                             losses.equivariance(maps, maps_warped, transform))
  return terms, maps


def loss_fn(model: part_model.PartModel, params, frozen, batch: Dict[str, jnp.ndarray], rng: jax.Array,
            loss_config, prior_factor: Optional[jnp.ndarray] = None
            ) -> Tuple[jnp.ndarray, Dict[str, Any]]:
  """(total loss, metrics) of one training batch.

  Args:
    model: the trainer's model interface (see models/stage1.py).
    batch: image float32 [B, H, W, 3], attributes float32 [B, A], attribute_valid bool [B, A].
    rng: this step's key (Gumbel noise of both passes and the equivariance transform).
    loss_config: config.loss (weights, orthogonality, orthogonality_on, equivariance ranges).
    prior_factor: float32 [] on every prior's weight (`prior_scale` at this step), or None.

  Returns:
    The weighted sum, and {"loss/<term>": unweighted value} for every computed term plus the
    maps' occupancy (`part_share_metrics`: the collapse watch, no second forward).
  """
  terms, maps = loss_terms(model, params, frozen, batch, rng, loss_config, prior_factor)
  total = sum(weight * value for weight, value in terms.values())
  metrics = {f"loss/{name}": value for name, (_, value) in terms.items()}
  return total, dict(metrics, **part_share_metrics(maps))


def term_gradient_norms(model: part_model.PartModel, params, frozen, batch, rng: jax.Array,
                        loss_config, group: str = "prototypes",
                        prior_factor: Optional[jnp.ndarray] = None) -> Dict[str, jnp.ndarray]:
  """{term: |d(weight * term)/d theta|}: the norm of the gradient each weighted term of the
  objective sends to the parameters of optimizer group `group` (model.param_groups), by default
  Stage 1's prototypes, where every term of both models meets. It shows which term shapes the
  parts: e.g. whether Stage 2's attribute loss reaches Stage 1 at all against the priors.
  `prior_factor` weighs the priors as training does at the step measured (`prior_scale`).
  One backward pass per term (jax.jacrev over the weighted terms)."""
  groups = model.param_groups(params)
  keep = [g == group for g in jax.tree_util.tree_leaves(groups)]
  if not any(keep):
    raise ValueError(f"term_gradient_norms: no parameter of group {group!r}; the model's groups "
                     f"are {sorted(set(jax.tree_util.tree_leaves(groups)))}")

  def weighted_terms(params):
    terms, _ = loss_terms(model, params, frozen, batch, rng, loss_config, prior_factor)
    return {name: weight * value for name, (weight, value) in terms.items()}

  jacobian = jax.jacrev(weighted_terms)(params)          # {term: a gradient tree like params}
  norms = {}
  for name, grads in jacobian.items():
    leaves = [g for g, k in zip(jax.tree_util.tree_leaves(grads), keep) if k]
    norms[name] = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in leaves))
  return norms


def part_share_metrics(maps: jax.Array) -> Dict[str, jax.Array]:
  """Occupancy of a training batch's maps [B, K+1, h, w] (background last), float32 scalars:
  train/part_share/<k>  share of the batch's patches whose argmax is channel k (Gumbel noise
                        included, as the loss sees them)
  train/part_share/max  the largest share
  train/part_mass/<k>   mean soft probability of channel k
  Logged only, so the gradient is stopped."""
  maps = jax.lax.stop_gradient(maps).astype(jnp.float32)
  won = jax.nn.one_hot(jnp.argmax(maps, axis=1), maps.shape[1], axis=1)  # [B, K+1, h, w]
  share, mass = jnp.mean(won, axis=(0, 2, 3)), jnp.mean(maps, axis=(0, 2, 3))
  out = {f"train/part_share/{k}": share[k] for k in range(maps.shape[1])}
  out.update({f"train/part_mass/{k}": mass[k] for k in range(maps.shape[1])})
  out["train/part_share/max"] = jnp.max(share)
  return out

