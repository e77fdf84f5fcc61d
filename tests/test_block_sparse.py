"""Removing work the part mask makes useless changes nothing it should not: the sorted layout
equals the natural one, background dropping leaves foreground outputs bit-identical, and tiled
attention equals dense masked attention."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metonymy.models import attention_masks
from metonymy.models import block_sparse
from metonymy.models import vit
from tests.test_vit_masking import NUM_PARTS, VARIANTS, _pixel_ids, _setup


def _foreground_ids(batch, fraction, seed=0):
  """part ids [B, 6, 6]: about `fraction` of the patches in parts 0..K-1, the rest background."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, NUM_PARTS, size=(batch, 36))
  ids[rng.random((batch, 36)) > fraction] = NUM_PARTS
  return jnp.asarray(ids.reshape(batch, 6, 6), jnp.int32)


_COMPILED = {}


def _apply(config, params, images, part_ids, **kwargs):
  """The jitted forward, compiled once per configuration (each has several switch branches)."""
  key = (config, tuple(sorted(kwargs.items())))
  if key not in _COMPILED:
    options = {k: kwargs.pop(k) for k in ("token_order", "attention_tiles", "split_background")
               if k in kwargs}
    model = vit.VisionTransformer(config, capacity_buckets=(0.25, 0.5, 1.0), **options)
    _COMPILED[key] = jax.jit(lambda p, x, ids: model.apply(
        {"params": p}, x, part_ids=ids, num_parts=NUM_PARTS, **kwargs))
  return jax.device_get(_COMPILED[key](params, images, part_ids))


@pytest.mark.parametrize("name", ["rope_no_k_bias", "clip_like"])
@pytest.mark.slow
def test_sorted_layout_and_tiles_equal_the_natural_layout(name):
  model, params, images, part_ids = _setup(name)
  natural = _apply(model.config, params, images, part_ids)
  for options in ({"token_order": "sorted"}, {"attention_tiles": 8},
                  {"token_order": "sorted", "split_background": True}):
    other = _apply(model.config, params, images, part_ids, **options)
    for key in ("part_tokens", "patch_tokens"):
      np.testing.assert_allclose(other[key], natural[key], rtol=1e-5, atol=1e-5,
                                 err_msg=f"{name} {options} {key}")


@pytest.mark.parametrize("name,tiles", [("rope_no_k_bias", 0), ("clip_like", 0),
                                        ("registers_layerscale", 8)])
@pytest.mark.slow
def test_dropping_the_background_leaves_the_foreground_bit_identical(name, tiles):
  model, params, images, _ = _setup(name, batch=3)
  for fraction in (0.1, 0.4, 1.0):  # small, middle and full capacity buckets
    part_ids = _foreground_ids(3, fraction)
    full = _apply(model.config, params, images, part_ids, token_order="sorted",
                  attention_tiles=tiles, split_background=True)
    dropped = _apply(model.config, params, images, part_ids, token_order="sorted",
                     attention_tiles=tiles, drop_background=True)
    np.testing.assert_array_equal(dropped["part_tokens"][:, :NUM_PARTS],
                                  full["part_tokens"][:, :NUM_PARTS], err_msg=f"{fraction}")
    foreground = np.asarray(part_ids != NUM_PARTS).reshape(3, -1)
    np.testing.assert_array_equal(dropped["patch_tokens"][foreground],
                                  full["patch_tokens"][foreground])
    assert not np.any(dropped["part_tokens"][:, NUM_PARTS])
    assert not np.any(dropped["patch_tokens"][~foreground])
    if "projection" in full:
      np.testing.assert_array_equal(dropped["projection"][:, :NUM_PARTS],
                                    full["projection"][:, :NUM_PARTS])


@pytest.mark.parametrize("options", [{"attention_tiles": 8, "drop_background": True},
                                     {"token_order": "sorted"}])
@pytest.mark.slow
def test_outside_pixels_leave_part_tokens_bit_identical_in_the_fast_paths(options):
  model, params, images, part_ids = _setup("rope_no_k_bias")
  reference = _apply(model.config, params, images, part_ids, **dict(options))
  noise = 10.0 * jax.random.normal(jax.random.PRNGKey(7), images.shape)
  pixel_ids = _pixel_ids(part_ids, 4)
  for k in range(NUM_PARTS):
    perturbed = jnp.where((pixel_ids != k)[..., None], images + noise, images)
    out = _apply(model.config, params, perturbed, part_ids, **dict(options))
    np.testing.assert_array_equal(out["part_tokens"][:, k], reference["part_tokens"][:, k])


def test_tiled_attention_matches_dense_and_takes_the_windowed_path():
  rng = np.random.default_rng(0)
  batch, length, heads, dim, tile = 2, 200, 2, 8, 16
  q, k, v = (jnp.asarray(rng.normal(size=(batch, length, heads, dim)), jnp.float32)
             for _ in range(3))
  # Twelve small groups: every tile's keys fit in the narrowest window.
  groups = jnp.asarray(np.sort(rng.integers(0, 12, size=(batch, length)), axis=1), jnp.int32)
  dense = jax.nn.dot_product_attention(q, k, v, mask=attention_masks.block_attention_mask(groups))
  tiled = jax.jit(block_sparse.tiled_attention, static_argnums=(4,))(q, k, v, groups, tile)
  np.testing.assert_allclose(tiled, dense, rtol=1e-5, atol=1e-6)
  first, end = block_sparse._group_spans(jnp.pad(groups, ((0, 0), (0, 8)),
                                                 constant_values=block_sparse.PAD_GROUP))
  needed = int(jnp.max(end[:, tile - 1::tile] - first[:, ::tile]))
  windows = block_sparse.window_sizes(length, tile)
  assert needed <= windows[-1] < length  # a window, not the dense fallback, runs
  # One group for everything: only the dense fallback is wide enough, and it is still right.
  one = jnp.zeros((batch, length), jnp.int32)
  np.testing.assert_allclose(block_sparse.tiled_attention(q, k, v, one, tile),
                             jax.nn.dot_product_attention(q, k, v), rtol=1e-5, atol=1e-6)


def test_capacity_buckets():
  assert block_sparse.capacities(40, (0.25, 0.5, 0.75, 1.0)) == (16, 24, 32, 40)
  sizes = (16, 24, 32, 40)
  assert [int(block_sparse.bucket_index(n, sizes)) for n in (1, 16, 17, 33, 40)] == [0, 0, 1, 3, 3]
  ids = jnp.asarray([[0, 3, 3, 1], [3, 3, 3, 2]])
  assert int(block_sparse.foreground_length(ids, 3, 2)) == 3 * 2 + 2


def test_drop_background_rejects_soft_masks():
  model, params, images, part_ids = _setup("dino_like")
  bias = jnp.zeros((2, 1, 4 + 36, 4 + 36))
  with pytest.raises(ValueError, match="drop_background"):
    model.apply({"params": params}, images, part_ids=part_ids, num_parts=NUM_PARTS,
                attention_bias=bias, drop_background=True)
