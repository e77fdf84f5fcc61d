"""Every part-discovery loss against a hand-computed value, and its invariances."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metonymy.training import geometry
from metonymy.training import losses


def test_attribute_bce_hand_value_and_valid_mask():
  logits = jnp.array([[0.0, math.log(3.0)]])
  labels = jnp.array([[1.0, 0.0]])
  # -log(0.5) and -log(1 - 0.75).
  np.testing.assert_allclose(losses.attribute_bce(logits, labels),
                             (math.log(2) + math.log(4)) / 2, rtol=1e-6)
  valid = jnp.array([[True, False]])
  np.testing.assert_allclose(losses.attribute_bce(logits, labels, valid), math.log(2), rtol=1e-6)
  # Nothing valid: 0, not NaN.
  assert float(losses.attribute_bce(logits, labels, jnp.zeros_like(valid))) == 0.0


def test_background_separation_hand_value():
  # Foreground (1, 0) and (0, 1), background (1, 1): cos^2 = 1/2 for both.
  v = jnp.array([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])
  np.testing.assert_allclose(losses.background_separation(v), 0.5, rtol=1e-6)
  orthogonal = jnp.array([[[1.0, 0.0], [2.0, 0.0], [0.0, 3.0]]])
  np.testing.assert_allclose(losses.background_separation(orthogonal), 0.0, atol=1e-7)


def test_foreground_decorrelation_hand_value():
  # Centroid 0, so u = v: cos(u0, u1) = 0, cos(u0, u2) = cos(u1, u2) = -1/sqrt(2).
  # Sum over ordered pairs of cos^2 = 2 * (0 + 1/2 + 1/2) = 2; / (K (K-1)) = 2 / 6.
  fg = jnp.array([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]])
  v = jnp.concatenate([fg, jnp.array([[3.0, -2.0]])])[None]
  np.testing.assert_allclose(losses.foreground_decorrelation(v), 1 / 3, rtol=1e-5)
  np.testing.assert_allclose(losses.decorrelated_orthogonality(v),
                             losses.background_separation(v) + 1 / 3, rtol=1e-5)


def test_foreground_decorrelation_ignores_a_shared_mean():
  rng = np.random.default_rng(0)
  v = jnp.asarray(rng.normal(size=(3, 6, 16)), jnp.float32)
  shared = jnp.asarray(rng.normal(size=(3, 1, 16)) * 10, jnp.float32)
  shifted = v.at[:, :-1].add(shared)  # every foreground part, not the background
  np.testing.assert_allclose(losses.foreground_decorrelation(shifted),
                             losses.foreground_decorrelation(v), rtol=1e-4)
  # The old loss does not ignore it (the reason for the new one).
  assert abs(float(losses.pdisco_orthogonality(shifted) - losses.pdisco_orthogonality(v))) > 1e-2


def test_foreground_decorrelation_needs_two_parts():
  with pytest.raises(ValueError, match="at least 2 foreground parts"):
    losses.foreground_decorrelation(jnp.ones((1, 2, 4)))


def test_pdisco_orthogonality_hand_value():
  # Unit vectors (1,0), (0,1), (1,1)/sqrt2: off-diagonal Gram entries 0, 1/sqrt2, 1/sqrt2 (each
  # twice): sum of squares 2 over 9 entries.
  v = jnp.array([[[1.0, 0.0], [0.0, 5.0], [2.0, 2.0]]])
  np.testing.assert_allclose(losses.pdisco_orthogonality(v), 2 / 9, rtol=1e-6)


def test_total_variation_hand_value():
  maps = jnp.array([[[[0.0, 1.0], [1.0, 1.0]]]])            # [1, 1, 2, 2]
  # Vertical |1-0| + |1-1|, horizontal |1-0| + |1-1|: 2 / (B h w = 4).
  np.testing.assert_allclose(losses.total_variation(maps), 0.5, rtol=1e-6)
  two_channels = jnp.concatenate([maps, 1 - maps], axis=1)   # channels add up
  np.testing.assert_allclose(losses.total_variation(two_channels), 1.0, rtol=1e-6)
  np.testing.assert_allclose(losses.total_variation(jnp.ones((2, 3, 4, 5))), 0.0)


def test_foreground_presence_hand_value():
  maps = np.zeros((2, 3, 3, 3), np.float32)
  maps[0, 0] = 0.5
  maps[1, 0] = 0.9          # part 0: best image 0.9
  maps[0, 1, 0, 0] = 0.9    # part 1: one pixel of 0.9 -> a 3x3 mean of 0.1
  maps[:, 2] = 1 - maps[:, 0] - maps[:, 1]
  np.testing.assert_allclose(losses.foreground_presence(jnp.asarray(maps)),
                             1 - (0.9 + 0.1) / 2, rtol=1e-6)


def test_radial_prior():
  prior = np.asarray(losses.radial_prior(3, 3))
  np.testing.assert_allclose(prior, [[1, 0.5, 1], [0.5, 0, 0.5], [1, 0.5, 1]], rtol=1e-6)


def test_background_presence_hand_value():
  maps = np.zeros((2, 2, 5, 5), np.float32)
  maps[:, 1] = 0.25                 # constant background: pooled 0.25, times prior 1 at corners
  maps[:, 0] = 0.75
  np.testing.assert_allclose(losses.background_presence(jnp.asarray(maps)), math.log(4), rtol=1e-6)
  maps[1, 1, 0:3, 0:3] = 1.0        # image 1: full background in the top-left 3x3 window
  expected = (math.log(4) + 0.0) / 2
  np.testing.assert_allclose(losses.background_presence(jnp.asarray(maps)), expected, rtol=1e-6)
  # Background only in the centre: the prior zeroes it; the floor keeps the loss finite.
  centre = np.zeros((1, 2, 5, 5), np.float32)
  centre[0, 1, 1:4, 1:4] = 1.0
  centre[0, 0] = 1 - centre[0, 1]
  assert np.isfinite(float(losses.background_presence(jnp.asarray(centre))))


def test_pixel_entropy_hand_value_and_finite_gradient_at_zero():
  uniform = jnp.full((2, 4, 3, 3), 0.25)
  np.testing.assert_allclose(losses.pixel_entropy(uniform), math.log(4), rtol=1e-6)
  one_hot = jax.nn.one_hot(jnp.zeros((2, 3, 3), jnp.int32), 4, axis=1)
  assert float(losses.pixel_entropy(one_hot)) == 0.0
  # Softmax outputs that underflow to exactly 0 must not give NaN gradients.
  logits = jnp.array([[[[0.0]], [[-1e4]]]])
  grad = jax.grad(lambda x: losses.pixel_entropy(jax.nn.softmax(x, axis=1)))(logits)
  assert np.all(np.isfinite(np.asarray(grad)))


def _blobs(size: int) -> jnp.ndarray:
  """[1, 3, size, size]: two smooth blobs near the centre and the rest as background."""
  ys, xs = np.meshgrid(*(2 * (np.arange(size) + 0.5) / size - 1,) * 2, indexing="ij")
  blob = lambda cx, cy: np.exp(-((xs - cx) ** 2 + (ys - cy) ** 2) / (2 * 0.08 ** 2))
  a, b = blob(0.15, -0.1), blob(-0.12, 0.12)
  return jnp.asarray(np.stack([a, b, np.clip(1 - a - b, 0, 1)])[None], jnp.float32)


def test_equivariance_is_zero_for_an_equivariant_map_function():
  # The "model" maps an image to its own channels: exactly equivariant, up to resampling.
  image = _blobs(64)
  for seed in range(5):
    transform = geometry.sample_affine(jax.random.PRNGKey(seed))
    warped = geometry.warp(image, transform)
    loss = float(losses.equivariance(image, warped, transform))
    assert loss < 5e-3, (seed, transform, loss)
  # The identity transform is exact.
  identity = geometry.Affine(jnp.float32(0), jnp.zeros(2), jnp.float32(1))
  np.testing.assert_allclose(losses.equivariance(image, image, identity), 0.0, atol=1e-6)


def test_equivariance_is_large_for_a_map_function_that_ignores_the_warp():
  image = _blobs(64)
  transform = geometry.Affine(jnp.float32(np.pi / 2), jnp.array([0.2, 0.0]), jnp.float32(1.2))
  assert float(losses.equivariance(image, image, transform)) > 0.5


def test_warp_moves_content_by_the_transform():
  # A dot at pixel (row 8, col 8) of 32; +90 degrees about the centre (clockwise on screen, y
  # down) takes (x, y) to (-y, x): from (-0.469, -0.469) to (0.469, -0.469), i.e. col 23, row 8.
  dot = np.zeros((1, 32, 32), np.float32)
  dot[0, 8, 8] = 1.0
  rotated = np.asarray(geometry.warp(
      jnp.asarray(dot), geometry.Affine(jnp.float32(np.pi / 2), jnp.zeros(2), jnp.float32(1))))
  assert np.unravel_index(np.argmax(rotated[0]), (32, 32)) == (8, 23)
  # A translation of 0.25 normalized units (4 px of 32) to the right.
  shifted = np.asarray(geometry.warp(
      jnp.asarray(dot), geometry.Affine(jnp.float32(0), jnp.array([0.25, 0.0]), jnp.float32(1))))
  assert np.unravel_index(np.argmax(shifted[0]), (32, 32)) == (8, 12)
  np.testing.assert_allclose(shifted.sum(), 1.0, rtol=1e-5)


def test_inverse_undoes_the_transform():
  transform = geometry.sample_affine(jax.random.PRNGKey(3))
  image = _blobs(64)
  back = geometry.warp(geometry.warp(image, transform), geometry.inverse(transform))
  a, b = np.asarray(image[0, :2]).ravel(), np.asarray(back[0, :2]).ravel()
  assert np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)) > 0.99
