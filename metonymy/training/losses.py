"""Part-discovery losses (paper §4.0.1, §4.0.3; PDiscoFormer's priors). Pure functions of arrays.

Conventions:
  maps        float [B, K+1, h, w]  part probabilities on the patch grid; channel K (the last) is
                                    the background; they sum to 1 over the channel axis.
  embeddings  float [B, K+1, D]     part vectors v^k (eq. 3), background last.
  logits      float [B, A]          attribute logits; labels float [B, A] in {0, 1}.

Every loss returns a float32 scalar. Weights live in the config (`config_lib.part_losses`), never
here.
"""

from typing import Optional

import jax
import jax.numpy as jnp
import optax

from metonymy.training import geometry

# Smallest probability fed to a log: keeps the gradient finite where a softmax underflows to 0.
_TINY = 1e-12


def attribute_bce(logits: jnp.ndarray, labels: jnp.ndarray,
                  valid: Optional[jnp.ndarray] = None) -> jnp.ndarray:
  """L_att = sum_{b,a} valid_ba * BCE(sigmoid(logit_ba), y_ba) / max(1, sum valid).

  BCE(p, y) = -(y log p + (1 - y) log(1 - p)), computed from logits (stable). `valid` [B, A]
  (bool or 0/1) drops unknown labels and padded examples; None means all valid.
  """
  losses = optax.sigmoid_binary_cross_entropy(logits, labels)
  if valid is None:
    return jnp.mean(losses)
  valid = valid.astype(losses.dtype)
  return jnp.sum(losses * valid) / jnp.maximum(jnp.sum(valid), 1.0)


def safe_norm(x: jnp.ndarray, axis: int = -1, keepdims: bool = False) -> jnp.ndarray:
  """|x|_2 over `axis`, with a finite gradient everywhere.

  The value is jnp.linalg.norm's (the same sqrt of a sum of squares; XLA's fusion may round the
  last bit differently). At the zero vector jnp.linalg.norm's gradient is x / |x| = 0/0 = NaN,
  and an outer jnp.maximum(norm, eps) does not help (the chain rule still multiplies by the NaN).
  A part whose map underflows to 0 over an image has a zero embedding, so every norm of a
  differentiated loss goes through here: at |x| = 0 the gradient is 0 (a subgradient). The double
  `where` keeps the unselected sqrt(0) branch out of the backward pass.
  """
  squared = jnp.sum(jnp.square(x), axis=axis, keepdims=keepdims)
  nonzero = squared > 0
  return jnp.where(nonzero, jnp.sqrt(jnp.where(nonzero, squared, 1.0)), 0.0)


def _cosine(a: jnp.ndarray, b: jnp.ndarray, eps: float) -> jnp.ndarray:
  """cos(a, b) over the last axis = a.b / (|a| |b| + eps); 0 (finite gradient) if either is 0."""
  return jnp.sum(a * b, -1) / (safe_norm(a) * safe_norm(b) + eps)


def background_separation(embeddings: jnp.ndarray, eps: float = 1e-8) -> jnp.ndarray:
  """L_bg (eq. 6) = mean_b (1/K) sum_{k<K} (v_bg . v^k / (|v_bg| |v^k| + eps))^2.

  eps (not in the paper's eq. 6) only guards an all-zero vector; it changes no other value
  measurably.
  """
  background = embeddings[:, -1:, :]
  return jnp.mean(_cosine(background, embeddings[:, :-1, :], eps) ** 2)


def foreground_decorrelation(embeddings: jnp.ndarray, eps: float = 1e-6) -> jnp.ndarray:
  """L_decorr (eq. 7-8), averaged over the batch:

    mu = (1/K) sum_k v^k,   u^k = v^k - mu   (foreground parts only)
    L_decorr = 1/(K(K-1)) sum_i sum_{j != i} (u^i . u^j / (|u^i| |u^j| + eps))^2

  Invariant to any vector added to every foreground part (it cancels in u^k). Needs K >= 2.
  """
  foreground = embeddings[:, :-1, :]
  num_parts = foreground.shape[1]
  if num_parts < 2:
    raise ValueError(f"foreground_decorrelation needs at least 2 foreground parts, got {num_parts}")
  centred = foreground - jnp.mean(foreground, axis=1, keepdims=True)
  norms = safe_norm(centred)
  cos = jnp.einsum("bid,bjd->bij", centred, centred) / (norms[:, :, None] * norms[:, None, :] + eps)
  off_diagonal = 1.0 - jnp.eye(num_parts, dtype=cos.dtype)
  return jnp.mean(jnp.sum(cos ** 2 * off_diagonal, (1, 2)) / (num_parts * (num_parts - 1)))


def decorrelated_orthogonality(embeddings: jnp.ndarray, eps: float = 1e-6) -> jnp.ndarray:
  """L_perp = L_bg + L_decorr (eq. 6-8); see `background_separation`, `foreground_decorrelation`."""
  return background_separation(embeddings) + foreground_decorrelation(embeddings, eps)


def pdisco_orthogonality(embeddings: jnp.ndarray, eps: float = 1e-12) -> jnp.ndarray:
  """PDiscoFormer's orthogonality (the ablation of Table S4), background included:

    w^k = v^k / max(|v^k|, eps),   G_b = W_b W_b^T  [(K+1) x (K+1)]
    L = mean_{b,k,l} (G_b - I)_{kl}^2
  """
  unit = embeddings / jnp.maximum(safe_norm(embeddings, keepdims=True), eps)
  gram = jnp.einsum("bkd,bld->bkl", unit, unit)
  return jnp.mean((gram - jnp.eye(gram.shape[-1], dtype=gram.dtype)) ** 2)


def total_variation(maps: jnp.ndarray) -> jnp.ndarray:
  """L_tv = (sum |A(i+1, j) - A(i, j)| + sum |A(i, j+1) - A(i, j)|) / (B h w), the sums over the
  batch, all K+1 channels and every neighbouring pair."""
  batch, _, height, width = maps.shape
  vertical = jnp.sum(jnp.abs(maps[:, :, 1:, :] - maps[:, :, :-1, :]))
  horizontal = jnp.sum(jnp.abs(maps[:, :, :, 1:] - maps[:, :, :, :-1]))
  return (vertical + horizontal) / (batch * height * width)


def _avg_pool3(maps: jnp.ndarray) -> jnp.ndarray:
  """3x3 average pooling, stride 1, no padding, over the last two axes: [..., h, w] ->
  [..., h-2, w-2]."""
  total = jax.lax.reduce_window(maps, 0.0, jax.lax.add, (1,) * (maps.ndim - 2) + (3, 3),
                                (1,) * maps.ndim, "VALID")
  return total / 9.0


def foreground_presence(maps: jnp.ndarray) -> jnp.ndarray:
  """L_p,fg = 1 - (1/K) sum_k P_k,  P_k = max_{b,i,j} AvgPool3x3(A_k)(b, i, j).

  Every foreground part should be strongly present somewhere in the batch. Needs h, w >= 3.
  """
  pooled = _avg_pool3(maps[:, :-1])
  presence = jnp.max(pooled, axis=(0, 2, 3))
  return 1.0 - jnp.mean(presence)


def radial_prior(height: int, width: int) -> jnp.ndarray:
  """m(i, j) = (x^2 + y^2) / max(x^2 + y^2) with x, y evenly spaced in [-1, 1] along each axis:
  0 at the centre, 1 at the corners. float32 [height, width]."""
  ys = jnp.linspace(-1.0, 1.0, height)
  xs = jnp.linspace(-1.0, 1.0, width)
  radius = ys[:, None] ** 2 + xs[None, :] ** 2
  return radius / jnp.max(radius)


def background_presence(maps: jnp.ndarray) -> jnp.ndarray:
  """L_p,bg = mean_b -log(q_b),  q_b = max_{i,j} m(i, j) * AvgPool3x3(A_bg)(b, i, j),

  with m = `radial_prior` over the pooled grid: every image should have background somewhere
  towards its border. q_b is floored at 1e-12 (a map with no background at all would give inf).
  """
  pooled = _avg_pool3(maps[:, -1])
  prior = radial_prior(*pooled.shape[-2:])
  best = jnp.max(pooled * prior, axis=(1, 2))
  return jnp.mean(-jnp.log(jnp.maximum(best, _TINY)))


def pixel_entropy(maps: jnp.ndarray) -> jnp.ndarray:
  """L_ent = mean_{b,i,j} -sum_k A_k(b, i, j) log A_k(b, i, j) (natural log), over all K+1
  channels; 0 log 0 = 0."""
  return jnp.mean(-jnp.sum(maps * jnp.log(jnp.maximum(maps, _TINY)), axis=1))


def equivariance(maps: jnp.ndarray, maps_of_warped: jnp.ndarray, transform: geometry.Affine,
                 eps: float = 1e-8) -> jnp.ndarray:
  """L_eq = 1 - mean_{b, k<K} cos(A_k(b), T^-1[A'_k](b)).

  `maps_of_warped` A' are the maps the model gives for the image warped by `transform` T; they
  are warped back with T^-1 (bilinear, 0 outside) and compared to `maps` A per foreground channel,
  each flattened over h x w; cos(a, b) = a.b / (|a| |b| + eps). 0 for a perfectly equivariant
  model whose parts stay inside the frame.
  """
  back = geometry.warp(maps_of_warped, geometry.inverse(transform))
  batch, channels = maps.shape[:2]
  a = maps[:, :-1].reshape(batch, channels - 1, -1)
  b = back[:, :-1].reshape(batch, channels - 1, -1)
  return 1.0 - jnp.mean(_cosine(a, b, eps))
