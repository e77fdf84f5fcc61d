"""Stage 1: attribute-driven part discovery on a frozen backbone (paper §4.0.1).

  z = backbone(x)                                   [B, h, w, D]  frozen patch features
  s_k(ij) = -|z_ij - p_k|^2                          [B, K+1, h, w] (prototype K = background)
  A = softmax((s + g) / tau) over k                  g ~ Gumbel in training; at evaluation
                                                     only with `evaluation_noise` (PDiscoFormer)
                                                     (`background_prototypes` M > 1: K+M
                                                     prototypes, the last M's channels summed
                                                     into the one background channel)
  v^k = (1/hw) sum_ij A_k(ij) z_ij                   [B, K+1, D]   (eq. 3)
  v_m^k = LN_shared(v^k)                             one LayerNorm for every part (EMBEDDING_NORMS)
  S[:, k] = W v_m^k + b                              [B, A, K]     foreground parts only (eq. 4)
  y_hat_c = sum_k softmax_k(S_c)_k S_ck              [B, A]        (eq. 5)

The backbone's parameters are not part of the trainable tree: `init` returns only the head's
parameters, and `apply` takes the backbone's as a separate `frozen` argument, so the optimizer
never sees (or keeps state for) them.

`Stage1` keeps the part-model contract (models/part_model.py `PartModel`), as Stage 2 does. A
trained one is read back from its workdir by metonymy/trained_part_model.py.
"""

from typing import Any, Dict, Optional, Tuple

import einops
import flax.linen as nn
import jax
import jax.numpy as jnp

from metonymy.models import vit


# How the shared LayerNorm takes its statistics over the pooled part embeddings v [B, K+1, D].
# The paper: "a single shared Layer Normalization across all part embeddings ... forces the
# distinctiveness to emerge from the features themselves rather than the normalization
# statistics". v^k = (1/hw) sum A_k z shrinks with the part's area, so the reading matters:
#   "joint"     one mean and variance over all parts and channels together, an affine per part
#               and channel (PDiscoFormer's LayerNorm([D, K+1])): a small part stays small;
#   "per_part"  each part's vector standardised over D on its own, one affine shared by all
#               parts (the project's earlier reading): a speck is rescaled to a whole part's size.
EMBEDDING_NORMS = ("joint", "per_part")


def standardize_part_embeddings(embeddings: jnp.ndarray, mode: str,
                                eps: float = 1e-5) -> jnp.ndarray:
  """embeddings [B, K+1, D] -> zero mean, unit variance, over [K+1, D] jointly ("joint") or over
  D per part ("per_part"); two-pass variance as PyTorch's LayerNorm."""
  axes = (1, 2) if mode == "joint" else (2,)
  mean = jnp.mean(embeddings, axes, keepdims=True)
  variance = jnp.mean(jnp.square(embeddings - mean), axes, keepdims=True)
  return (embeddings - mean) * jax.lax.rsqrt(variance + eps)


def route(scores: jnp.ndarray) -> Tuple[jnp.ndarray, jnp.ndarray]:
  """Softmax routing over parts (eq. 5): scores S [B, A, K] -> (W [B, A, K], y_hat [B, A]),
  y_hat_c = sum_k softmax_k(S_c)_k S_ck. Stage 2 routes its part scores the same way."""
  routing = jax.nn.softmax(scores, axis=-1)
  return routing, jnp.sum(routing * scores, axis=-1)


class JointLayerNorm(nn.Module):
  """LayerNorm over a [B, K+1, D] tensor's last two axes jointly, with an affine per part and
  channel (torch.nn.LayerNorm([D, K+1]) on PDiscoFormer's [B, D, K+1] layout)."""
  eps: float = 1e-5

  @nn.compact
  def __call__(self, embeddings: jnp.ndarray) -> jnp.ndarray:
    shape = embeddings.shape[1:]
    scale = self.param("scale", nn.initializers.ones, shape)
    bias = self.param("bias", nn.initializers.zeros, shape)
    return standardize_part_embeddings(embeddings, "joint", self.eps) * scale + bias


class Stage1Head(nn.Module):
  """Prototypes, Gumbel-softmax maps, pooling, the shared LayerNorm and the routed attribute head.

  Attributes:
    num_parts: K, foreground parts (K+1 prototypes with the background).
    num_attributes: A.
    temperature: Gumbel-softmax temperature tau.
    norm_eps: epsilon of the shared LayerNorm (PyTorch's default; the paper's code is PyTorch).
    embedding_norm: EMBEDDING_NORMS; "per_part" keeps the parameter layout of runs trained
      before the option (`norm`: scale and bias [D]); "joint" has them per part ([K+1, D]).
    part_dropout: the probability of dropping a whole foreground part embedding before the
      attribute head in training (the survivors scaled by 1/(1-p)). The paper is silent;
      PDiscoFormer drops parts with p = 0.3 (its released CUB configuration too), which
      config_lib.stage1_model's recipe follows; the module alone drops none.
    evaluation_noise: Gumbel noise in the maps at evaluation too. The paper says only that the
      maps come from "comparing patch features to learnable prototypes p^k, followed by a
      Gumbel-Softmax operation"; PDiscoFormer's model adds the noise in eval mode as well.
      False: evaluation maps are the noise-free softmax, so a model's scores do not depend on a
      noise draw.
    background_prototypes: M, how many prototypes the background has. The paper has one: "maps
      A in [0,1]^((K+1) x H x W) (where the (K+1)-th map represents the background) by comparing
      patch features to learnable prototypes p^k", one per map, as PDiscoFormer: the default.
      With M > 1 the softmax runs over K+M prototypes and the background channel is the sum of
      the last M (its logit their log-sum-exp, so the maps stay a softmax of `part_logits`);
      everything after the maps (pooling, the LayerNorm, the priors, Stage 2) sees K+1 channels
      as before. Why it exists: a background of stripes and distractor shapes is not one
      cluster of tokens, and one prototype standing for it takes object patches
      (docs/experiments.md, "What Stage 1 could find on the continued stand-in").
  """
  num_parts: int
  num_attributes: int
  temperature: float = 1.0
  norm_eps: float = 1e-5
  embedding_norm: str = "per_part"
  part_dropout: float = 0.0
  evaluation_noise: bool = False
  background_prototypes: int = 1

  @nn.compact
  def __call__(self, features: jnp.ndarray, *, train: bool) -> Dict[str, Any]:
    """features: float [B, h, w, D] (frozen). With train=True (or `evaluation_noise`) the
    "gumbel" RNG stream is used."""
    features = features.astype(jnp.float32)
    batch, height, width, dim = features.shape
    if self.background_prototypes < 1:
      raise ValueError(f"background_prototypes must be >= 1, got {self.background_prototypes}")
    groups = self.num_parts + self.background_prototypes
    # A bias-free 1x1 conv's default PyTorch init: U(-1/sqrt(D), 1/sqrt(D)) per prototype.
    prototypes = self.param(
        "prototypes", nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform", in_axis=-1,
                                                       out_axis=-2), (groups, dim))
    z = features.reshape(batch, height * width, dim)
    # -|z - p|^2 expanded, so no [B, N, K+1, D] difference tensor is materialized. Full float32
    # products: with TF32 (GPUs' default) z.p of norm-~30 vectors is off by ~1 logit unit.
    highest = jax.lax.Precision.HIGHEST
    cross = jnp.einsum("bnd,kd->bnk", z, prototypes, precision=highest)
    logits = -(jnp.sum(z * z, -1, keepdims=True) - 2.0 * cross
               + jnp.sum(prototypes * prototypes, -1)[None, None, :])          # [B, N, K+1]
    if train or self.evaluation_noise:
      logits_noisy = logits + jax.random.gumbel(self.make_rng("gumbel"), logits.shape)
    else:
      logits_noisy = logits
    attention = jax.nn.softmax(logits_noisy / self.temperature, axis=-1)      # [B, N, K+M]
    if self.background_prototypes > 1:
      # Summing the background's softmax channels is a softmax over K+1 logits whose background
      # logit is tau * logsumexp(s_bg / tau): the one channel the rest of the model sees.
      k = self.num_parts
      attention = jnp.concatenate(
          [attention[..., :k], jnp.sum(attention[..., k:], -1, keepdims=True)], -1)
      logits = jnp.concatenate(
          [logits[..., :k], self.temperature * jax.nn.logsumexp(
              logits[..., k:] / self.temperature, -1, keepdims=True)], -1)   # [B, N, K+1]
    embeddings = jnp.einsum("bnk,bnd->bkd", attention, z,
                            precision=highest) / (height * width)             # eq. 3
    if self.embedding_norm not in EMBEDDING_NORMS:
      raise ValueError(f"embedding_norm must be one of {EMBEDDING_NORMS}, got "
                       f"{self.embedding_norm!r}")
    if self.embedding_norm == "per_part":
      modulated = nn.LayerNorm(epsilon=self.norm_eps, use_fast_variance=False,
                               name="norm")(embeddings)
    else:
      modulated = JointLayerNorm(self.norm_eps, name="norm")(embeddings)
    foreground = modulated[:, :-1]
    if train and self.part_dropout > 0:
      keep = jax.random.bernoulli(self.make_rng("dropout"), 1.0 - self.part_dropout,
                                  foreground.shape[:2] + (1,))
      foreground = jnp.where(keep, foreground / (1.0 - self.part_dropout), 0.0)
    scores = nn.Dense(self.num_attributes, name="head")(foreground)           # [B, K, A]
    scores = jnp.swapaxes(scores, 1, 2)                                        # [B, A, K]
    routing, predicted = route(scores)
    to_maps = lambda x: einops.rearrange(x, "b (h w) k -> b k h w", h=height, w=width)
    return {
        "maps": to_maps(attention),
        "part_logits": to_maps(logits),
        "part_embeddings": embeddings,
        "modulated_embeddings": modulated,
        "part_scores": scores,
        "routing": routing,
        "logits": {"stage1": predicted},
    }


# The backbone's token parameters that `trained_tokens` trains (when the backbone has them).
TOKEN_PARAMS = ("cls_token", "register_tokens", "pos_embed")


class Stage1:
  """Frozen backbone + `Stage1Head` (see the module docstring for the interface).

  trained_tokens: the backbone's CLS and register tokens and position table (TOKEN_PARAMS) join
    the trainable tree as "backbone_tokens", its optimizer group "tokens", starting from the
    backbone's values; every other backbone weight stays frozen. The paper: "the pretrained ViT
    backbone was kept strictly frozen. We only updated the randomly initialized layers", so the
    default is False; PDiscoFormer with --freeze_backbone still trains these tokens (at ~1e-6).
  """

  def __init__(self, backbone: vit.VisionTransformer, head: Stage1Head,
               trained_tokens: bool = False):
    self.backbone = backbone
    self.head = head
    self.trained_tokens = trained_tokens

  @property
  def num_parts(self) -> int:
    return self.head.num_parts

  def features(self, frozen, images: jnp.ndarray, tokens=None) -> jnp.ndarray:
    """Patch features z [B, h, w, D] of normalized images [B, H, W, 3]. No gradient flows back,
    except to `tokens` (the trained token parameters, `trained_tokens`) when given."""
    if tokens is not None:
      frozen = {**jax.lax.stop_gradient(frozen), **tokens}
    patch_tokens = self.backbone.apply({"params": frozen}, images)["patch_tokens"]
    height, width = self.backbone.patch_grid(images.shape)
    z = patch_tokens.reshape(patch_tokens.shape[0], height, width, patch_tokens.shape[-1])
    return z if tokens is not None else jax.lax.stop_gradient(z)

  def init(self, rng: jax.Array, images: jnp.ndarray, frozen=None):
    """Trainable parameters for images like `images` (only their shape is used). `frozen` (the
    backbone's parameters) is part of the interface so that a model can initialize trainable
    weights from them (Stage 2's ViT starts as a copy); Stage 1 does not need it."""
    cfg = self.backbone.config
    height, width = self.backbone.patch_grid(images.shape)
    z = jnp.zeros((1, height, width, cfg.width), jnp.float32)
    params = self.head.init(rng, z, train=False)["params"]
    if self.trained_tokens:
      if frozen is None:
        raise ValueError("Stage1.init with trained_tokens needs the backbone's parameters "
                         "(`frozen`) to start the tokens from.")
      params = {**params, "backbone_tokens": {k: jnp.array(frozen[k]) for k in TOKEN_PARAMS
                                              if k in frozen}}
    return params

  def apply(self, params, frozen, images: jnp.ndarray, *, train: bool,
            rng: Optional[jax.Array] = None) -> Dict[str, Any]:
    """Forward pass.

    Args:
      params: trainable parameters (`init`); frozen: the backbone's parameters.
      images: float32 [B, H, W, 3], normalized with the backbone's mean/std.
      train: Gumbel noise on (needs `rng`) or off (deterministic maps, unless the head's
        `evaluation_noise`: then `rng`, or a fixed key when none is given, so that an
        evaluation is repeatable).

    Returns:
      maps [B, K+1, h, w] (sum to 1 over parts; background last), part_logits [B, K+1, h, w]
      (-squared distances), part_embeddings [B, K+1, D] (v, eq. 3), modulated_embeddings
      [B, K+1, D] (after the shared LayerNorm), part_scores [B, A, K] (S), routing [B, A, K]
      (W), logits {"stage1": [B, A]} (routed, eq. 5).
    """
    if train and rng is None:
      raise ValueError("Stage1.apply(train=True) needs rng for the Gumbel noise.")
    tokens = params.get("backbone_tokens")
    head_params = {k: v for k, v in params.items() if k != "backbone_tokens"}
    z = self.features(frozen, images, tokens)
    rngs = {"gumbel": rng, "dropout": jax.random.fold_in(rng, 1)} if train else {}
    if not train and self.head.evaluation_noise:
      rngs = {"gumbel": jax.random.PRNGKey(0) if rng is None else rng}
    return self.head.apply({"params": head_params}, z, train=train, rngs=rngs)

  def part_maps(self, params, frozen, images, *, train: bool, rng=None) -> jnp.ndarray:
    return self.apply(params, frozen, images, train=train, rng=rng)["maps"]

  def param_groups(self, params):
    """Optimizer group per leaf: "prototypes" for the prototypes, "heads" for the shared
    LayerNorm and the attribute head (paper Appendix A: 1e-3 and 1e-2 at batch 64), "tokens"
    for the trained backbone tokens (`trained_tokens`)."""
    group = {"prototypes": "prototypes", "backbone_tokens": "tokens"}
    return {name: jax.tree_util.tree_map(lambda _, g=group.get(name, "heads"): g, sub)
            for name, sub in params.items()}


def build(config, backbone: vit.VisionTransformer, num_attributes: int) -> Stage1:
  """Stage 1 on `backbone` (metonymy/loading.py builds it) for a config's `model` block."""
  head = Stage1Head(num_parts=config.model.num_parts, num_attributes=num_attributes,
                    temperature=config.model.temperature,
                    embedding_norm=config.model.get("embedding_norm", "per_part"),
                    part_dropout=float(config.model.get("part_dropout", 0.0)),
                    evaluation_noise=bool(config.model.get("evaluation_noise", False)),
                    background_prototypes=int(config.model.get("background_prototypes", 1)))
  return Stage1(backbone, head, bool(config.model.get("trained_tokens", False)))
