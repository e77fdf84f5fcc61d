"""Every part-discovery loss has a finite gradient at degenerate inputs (issue 12, item 1).

A part whose map underflows to 0 over an image has a zero embedding (eq. 3 pools with the map),
and jnp.linalg.norm's gradient at the zero vector is NaN even behind jnp.maximum(norm, eps); one
NaN gradient ends a run. Every loss of metonymy/training/losses.py is differentiated here with respect to
all of its inputs at a zero part embedding (one part, the background, all of them) and at an
all-zero map channel (one part, the background).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metonymy.training import geometry
from metonymy.training import losses

BATCH, NUM_PARTS, DIM, NUM_ATTRIBUTES, GRID = 2, 4, 8, 3, 6
BACKGROUND = NUM_PARTS  # The last channel / row.

# A fixed, non-trivial warp (rotation, shift and scale) for the equivariance loss.
_TRANSFORM = geometry.Affine(angle=jnp.float32(0.3), translation=jnp.array([0.05, -0.1]),
                             scale=jnp.float32(1.1))


def _attribute_bce(embeddings, maps, other_maps):
  """L_att of logits read linearly off the foreground embeddings: a zero part gives zero logits."""
  del maps, other_maps
  rng = np.random.default_rng(1)
  head = jnp.asarray(rng.normal(size=(DIM, NUM_ATTRIBUTES)), jnp.float32)
  labels = jnp.asarray(rng.integers(0, 2, (BATCH, NUM_ATTRIBUTES)), jnp.float32)
  valid = jnp.asarray(rng.integers(0, 2, (BATCH, NUM_ATTRIBUTES)), bool)
  logits = jnp.einsum("bkd,da->ba", embeddings[:, :-1], head) / NUM_PARTS
  return losses.attribute_bce(logits, labels, valid) + losses.attribute_bce(logits, labels)


# name -> f(embeddings [B, K+1, D], maps [B, K+1, h, w], other_maps [B, K+1, h, w]) -> scalar.
# `other_maps` are non-degenerate maps: the equivariance entries put the degenerate maps on either
# side of the comparison, and on both.
LOSSES = {
    "attribute_bce": _attribute_bce,
    "background_separation": lambda e, m, o: losses.background_separation(e),
    "foreground_decorrelation": lambda e, m, o: losses.foreground_decorrelation(e),
    "decorrelated_orthogonality": lambda e, m, o: losses.decorrelated_orthogonality(e),
    "pdisco_orthogonality": lambda e, m, o: losses.pdisco_orthogonality(e),
    "total_variation": lambda e, m, o: losses.total_variation(m),
    "foreground_presence": lambda e, m, o: losses.foreground_presence(m),
    "background_presence": lambda e, m, o: losses.background_presence(m),
    "pixel_entropy": lambda e, m, o: losses.pixel_entropy(m),
    "equivariance": lambda e, m, o: losses.equivariance(m, o, _TRANSFORM),
    "equivariance_of_warped": lambda e, m, o: losses.equivariance(o, m, _TRANSFORM),
    "equivariance_both": lambda e, m, o: losses.equivariance(m, m, _TRANSFORM),
}

# case -> (embedding rows set to 0, map channels set to 0).
CASES = {
    "zero_part_embedding": ((0,), ()),
    "zero_background_embedding": ((BACKGROUND,), ()),
    "all_embeddings_zero": (tuple(range(NUM_PARTS + 1)), ()),
    "zero_part_map": ((), (0,)),
    "zero_background_map": ((), (BACKGROUND,)),
}


def _maps(seed: int, zero_channels=()) -> jnp.ndarray:
  """float32 [B, K+1, h, w] part maps summing to 1 over channels, `zero_channels` exactly 0."""
  rng = np.random.default_rng(seed)
  logits = rng.normal(size=(BATCH, NUM_PARTS + 1, GRID, GRID)) * 2.0
  maps = np.exp(logits)
  maps[:, list(zero_channels)] = 0.0
  return jnp.asarray(maps / maps.sum(axis=1, keepdims=True), jnp.float32)


def _inputs(case: str):
  zero_rows, zero_channels = CASES[case]
  rng = np.random.default_rng(0)
  embeddings = rng.normal(size=(BATCH, NUM_PARTS + 1, DIM))
  embeddings[:, list(zero_rows)] = 0.0
  return (jnp.asarray(embeddings, jnp.float32), _maps(2, zero_channels), _maps(3))


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_gradient_is_finite_at_zero_embeddings_and_zero_maps(name, case):
  inputs = _inputs(case)
  value, grads = jax.value_and_grad(LOSSES[name], argnums=(0, 1, 2))(*inputs)
  assert np.isfinite(float(value)), f"{name} = {value} for {case}"
  for argument, grad in zip(("embeddings", "maps", "other_maps"), grads):
    assert np.all(np.isfinite(np.asarray(grad))), (
        f"d {name} / d {argument} is not finite for {case}: "
        f"{int(np.sum(~np.isfinite(np.asarray(grad))))} non-finite entries")


def test_every_loss_of_the_module_is_covered():
  """A loss added to losses.py without a gradient check here fails this test."""
  public = {name for name, value in vars(losses).items()
            if callable(value) and not name.startswith("_") and value.__module__ == losses.__name__}
  helpers = {"radial_prior", "safe_norm"}
  covered = {name.split("_of_")[0].removesuffix("_both") for name in LOSSES}
  assert public - helpers <= covered, sorted(public - helpers - covered)


def test_safe_norm_equals_linalg_norm_and_has_a_zero_gradient_at_zero():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(5, 7, 16)) * rng.uniform(1e-3, 1e3, (5, 7, 1)), jnp.float32)
  for axis, keepdims in ((-1, False), (-1, True), (1, False)):
    np.testing.assert_allclose(losses.safe_norm(x, axis, keepdims),
                               jnp.linalg.norm(x, axis=axis, keepdims=keepdims), rtol=1e-6)
  # Away from 0 the gradient is linalg.norm's, x / |x|; at 0 it is 0 (linalg.norm's is NaN).
  v = x[0, 0]
  np.testing.assert_allclose(jax.grad(losses.safe_norm)(v), jax.grad(jnp.linalg.norm)(v),
                             rtol=1e-6)
  zero = jnp.zeros(16)
  assert np.all(np.isnan(jax.grad(jnp.linalg.norm)(zero)))
  np.testing.assert_array_equal(jax.grad(losses.safe_norm)(zero), np.zeros(16))
  assert float(losses.safe_norm(zero)) == 0.0


def test_zero_embeddings_keep_the_loss_values():
  """A zero vector has cosine 0 with everything and unit vector 0: the values at degenerate
  inputs are the formulas' limits, not NaN and not a spike from the guard."""
  embeddings, _, _ = _inputs("all_embeddings_zero")
  assert float(losses.background_separation(embeddings)) == 0.0
  assert float(losses.foreground_decorrelation(embeddings)) == 0.0
  # Unit vectors all 0: the Gram matrix is 0, so (G - I)^2 averages to 1 / (K + 1).
  np.testing.assert_allclose(losses.pdisco_orthogonality(embeddings), 1 / (NUM_PARTS + 1),
                             rtol=1e-6)
