"""The invariants that make early masking a zero-leakage measurement (issue: foundation)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metonymy.models import attention_masks
from metonymy.models import pos_embed
from metonymy.models import vit

TINY = dict(patch_size=4, width=32, depth=2, num_heads=2, mlp_dim=64, image_size=24)
VARIANTS = {
    "dino_like": vit.ViTConfig(pos_embed_grid=(6, 6), **TINY),
    "registers_layerscale": vit.ViTConfig(pos_embed_grid=(6, 6), num_registers=4, layer_scale=True,
                                          pos_embed_resize="size_antialias", **TINY),
    "rope_no_k_bias": vit.ViTConfig(pos_embed_grid=None, num_registers=2, layer_scale=True,
                                    rope_periods=pos_embed.rope_periods(16), k_bias=False,
                                    norm_eps=1e-5, **TINY),
    "clip_like": vit.ViTConfig(pos_embed_grid=(6, 6), ln_pre=True, activation="quick_gelu",
                               patch_bias=False, norm_eps=1e-5, projection_dim=8, **TINY),
}
NUM_PARTS = 3


def _setup(name, batch=2, seed=0):
  config = VARIANTS[name]
  model = vit.VisionTransformer(config)
  k1, k2, k3, k4 = jax.random.split(jax.random.PRNGKey(seed), 4)
  images = jax.random.normal(k1, (batch, 24, 24, 3))
  params = model.init(k2, images)["params"]
  # LayerScale initialises to 1e-5; random gammas make every branch matter in the test.
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: jax.random.normal(k4, x.shape) if "gamma" in str(path) else x, params)
  part_ids = jax.random.randint(k3, (batch, 6, 6), 0, NUM_PARTS + 1)
  return model, params, images, part_ids


def _pixel_ids(part_ids, patch):
  return jnp.repeat(jnp.repeat(part_ids, patch, 1), patch, 2)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_outside_pixels_leave_part_tokens_bit_identical(name):
  model, params, images, part_ids = _setup(name)
  apply = jax.jit(lambda x: model.apply({"params": params}, x, part_ids=part_ids, num_parts=NUM_PARTS))
  reference = apply(images)
  pixel_ids = _pixel_ids(part_ids, 4)
  noise = 10.0 * jax.random.normal(jax.random.PRNGKey(7), images.shape)
  for k in range(NUM_PARTS + 1):
    perturbed = jnp.where((pixel_ids != k)[..., None], images + noise, images)
    out = apply(perturbed)
    np.testing.assert_array_equal(np.asarray(out["part_tokens"][:, k]),
                                  np.asarray(reference["part_tokens"][:, k]))
    inside = np.asarray(part_ids == k).reshape(part_ids.shape[0], -1)
    np.testing.assert_array_equal(np.asarray(out["patch_tokens"])[inside],
                                  np.asarray(reference["patch_tokens"])[inside])
    if "projection" in out:
      np.testing.assert_array_equal(np.asarray(out["projection"][:, k]),
                                    np.asarray(reference["projection"][:, k]))
    # The perturbation is real: some other part's tokens do move.
    others = [j for j in range(NUM_PARTS + 1) if j != k]
    assert float(jnp.max(jnp.abs(out["part_tokens"][:, others] -
                                 reference["part_tokens"][:, others]))) > 1e-3


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.slow
def test_single_part_equals_plain_forward(name):
  model, params, images, part_ids = _setup(name)
  plain = model.apply({"params": params}, images)
  early = model.apply({"params": params}, images, part_ids=jnp.zeros_like(part_ids),
                      num_parts=NUM_PARTS)
  scale = float(jnp.max(jnp.abs(plain["prefix_tokens"])))
  np.testing.assert_allclose(early["part_tokens"][:, 0], plain["prefix_tokens"],
                             atol=1e-5 * scale, rtol=0)
  np.testing.assert_allclose(early["patch_tokens"], plain["patch_tokens"], atol=1e-5 * scale, rtol=0)


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.slow
def test_masked_run_equals_each_group_on_its_own(name):
  model, params, images, part_ids = _setup(name, batch=1)
  early = model.apply({"params": params}, images, part_ids=part_ids, num_parts=NUM_PARTS)
  prefix, patches, rope = model.apply({"params": params}, images, method=model.embed)
  flat = np.asarray(part_ids).reshape(-1)
  config = VARIANTS[name]
  for k in range(NUM_PARTS + 1):
    keep = np.nonzero(flat == k)[0]
    if keep.size == 0:
      continue
    sub_rope = None if rope is None else tuple(t[keep] for t in rope)
    tokens, _ = model.apply({"params": params}, jnp.concatenate([prefix, patches[:, keep]], 1),
                            sub_rope, method=model.encode)
    scale = float(jnp.max(jnp.abs(tokens)))
    np.testing.assert_allclose(early["part_tokens"][0, k], tokens[0, :config.num_prefix],
                               atol=1e-5 * scale, rtol=0)
    np.testing.assert_allclose(early["patch_tokens"][0, keep], tokens[0, config.num_prefix:],
                               atol=1e-5 * scale, rtol=0)


@pytest.mark.parametrize("name", ["registers_layerscale", "rope_no_k_bias"])
def test_additive_bias_form_equals_boolean_mask(name):
  model, params, images, part_ids = _setup(name)
  config = VARIANTS[name]
  group_ids = attention_masks.early_masking_group_ids(part_ids.reshape(2, -1), NUM_PARTS,
                                                      config.num_prefix)
  boolean = model.apply({"params": params}, images, part_ids=part_ids, num_parts=NUM_PARTS)
  biased = model.apply({"params": params}, images, part_ids=part_ids, num_parts=NUM_PARTS,
                       attention_bias=attention_masks.block_attention_bias(group_ids))
  np.testing.assert_allclose(biased["part_tokens"], boolean["part_tokens"], atol=1e-6, rtol=0)
  # One-hot "soft" probabilities reduce to the same block structure.
  one_hot = jax.nn.one_hot(part_ids.reshape(2, -1), NUM_PARTS + 1)
  soft = model.apply({"params": params}, images, part_ids=part_ids, num_parts=NUM_PARTS,
                     attention_bias=attention_masks.soft_group_attention_bias(one_hot, config.num_prefix))
  np.testing.assert_allclose(soft["part_tokens"], boolean["part_tokens"], atol=1e-5, rtol=0)


def test_soft_bias_leaks():
  """Soft probabilities let part k see other parts: the measurement that hard masks exist for."""
  model, params, images, part_ids = _setup("dino_like")
  probs = jax.nn.softmax(3.0 * jax.nn.one_hot(part_ids.reshape(2, -1), NUM_PARTS + 1), -1)
  bias = attention_masks.soft_group_attention_bias(probs, 1)
  apply = lambda x: model.apply({"params": params}, x, part_ids=part_ids, num_parts=NUM_PARTS,
                                attention_bias=bias)["part_tokens"][:, 0]
  outside = (_pixel_ids(part_ids, 4) != 0)[..., None]
  perturbed = jnp.where(outside, images + 10.0, images)
  assert float(jnp.max(jnp.abs(apply(perturbed) - apply(images)))) > 1e-3


@pytest.mark.parametrize("name", ["dino_like", "rope_no_k_bias"])
def test_padding_does_not_change_outputs(name):
  model, params, images, part_ids = _setup(name)
  padded_model = vit.VisionTransformer(VARIANTS[name], pad_to_multiple=8)
  for kwargs in ({}, {"part_ids": part_ids, "num_parts": NUM_PARTS}):
    a = model.apply({"params": params}, images, **kwargs)
    b = padded_model.apply({"params": params}, images, **kwargs)
    for key in a:
      np.testing.assert_allclose(a[key], b[key], atol=1e-5, rtol=0)


def test_resolution_change_resizes_position_table():
  model, params, _, _ = _setup("dino_like")
  out = model.apply({"params": params}, jnp.ones((1, 40, 32, 3)))
  assert out["patch_tokens"].shape == (1, 80, 32)


def test_bad_part_ids_are_rejected():
  model, params, images, part_ids = _setup("dino_like")
  with pytest.raises(ValueError, match="num_parts"):
    model.apply({"params": params}, images, part_ids=part_ids + 5, num_parts=NUM_PARTS)
  with pytest.raises(ValueError, match="shape"):
    model.apply({"params": params}, images, part_ids=part_ids[:, :3], num_parts=NUM_PARTS)
  with pytest.raises(ValueError, match="multiple of the patch size"):
    model.apply({"params": params}, images[:, :23])


@pytest.mark.parametrize("name", ["dino_like", "rope_no_k_bias"])
@pytest.mark.slow
def test_straight_through_forward_is_hard_and_gradient_is_soft(name):
  """STE: SG(H_hard) + H_soft - SG(H_soft) per layer; forward bit-identical to hard masking."""
  model, params, images, part_ids = _setup(name)
  config = VARIANTS[name]
  logits = 2.0 * jax.nn.one_hot(part_ids.reshape(2, -1), NUM_PARTS + 1)
  logits = logits + 0.5 * jax.random.normal(jax.random.PRNGKey(3), logits.shape)

  def part_tokens(logits, images, variant):
    probs = jax.nn.softmax(logits, -1)
    ids = jnp.argmax(probs, -1).reshape(part_ids.shape)
    bias = attention_masks.soft_group_attention_bias(probs, config.num_prefix)
    kwargs = {"hard": {}, "soft": {"attention_bias": bias}, "ste": {"straight_through_bias": bias}}
    return model.apply({"params": params}, images, part_ids=ids, num_parts=NUM_PARTS,
                       **kwargs[variant])["part_tokens"]

  hard_ids = jnp.argmax(logits, -1).reshape(part_ids.shape)
  hard = part_tokens(logits, images, "hard")
  ste = part_tokens(logits, images, "ste")
  np.testing.assert_array_equal(np.asarray(ste), np.asarray(hard))
  # Zero leakage under STE: noise outside part 0 leaves part 0 bit-identical.
  outside = (_pixel_ids(hard_ids, 4) != 0)[..., None]
  noisy = jnp.where(outside, images + 5.0, images)
  np.testing.assert_array_equal(np.asarray(part_tokens(logits, noisy, "ste")[:, 0]),
                                np.asarray(ste[:, 0]))
  # Gradients reach the part probabilities through soft and STE, never through hard.
  grads = {v: jax.grad(lambda l: jnp.sum(part_tokens(l, images, v)[:, :, 0] ** 2))(logits)
           for v in ("hard", "soft", "ste")}
  assert float(jnp.abs(grads["hard"]).max()) == 0.0
  assert float(jnp.abs(grads["soft"]).max()) > 0.0
  assert float(jnp.abs(grads["ste"]).max()) > 0.0


@pytest.mark.parametrize("name", ["registers_layerscale", "rope_no_k_bias"])
def test_sown_attention_weights_are_the_forwards_and_change_no_output(name):
  """mutable=["intermediates"]: each block's attention sows softmax(q k^T / sqrt(d) + bias,
  masked) of its own queries and keys, the weights that rebuild its output; the outputs stay bit
  identical to the default forward's (which computes no weights)."""
  model, params, images, part_ids = _setup(name)
  config = VARIANTS[name]
  group_ids = attention_masks.early_masking_group_ids(part_ids.reshape(2, -1), NUM_PARTS,
                                                      config.num_prefix)
  probs = jax.nn.softmax(2.0 * jax.nn.one_hot(part_ids.reshape(2, -1), NUM_PARTS + 1), -1)
  bias = attention_masks.soft_group_attention_bias(probs, config.num_prefix)
  mask = np.asarray(attention_masks.block_attention_mask(group_ids))
  early = {"part_ids": part_ids, "num_parts": NUM_PARTS}
  # Each forward, and the mask and bias its weights are taken under (STE: the forward is hard).
  cases = {"plain": ({}, None, None), "hard": (early, mask, None),
           "soft": (dict(early, attention_bias=bias), None, np.asarray(bias)),
           "ste": (dict(early, straight_through_bias=bias), mask, None)}
  # Captured too: each attention's input (norm1's output) and output.
  captured = lambda module, _: module.name in ("norm1", "attn")
  for case, (kwargs, case_mask, case_bias) in cases.items():
    default = model.apply({"params": params}, images, **kwargs)
    out, state = model.apply({"params": params}, images, mutable=["intermediates"],
                             capture_intermediates=captured, **kwargs)
    for key in default:
      np.testing.assert_array_equal(np.asarray(out[key]), np.asarray(default[key]), (case, key))
    for layer in range(config.depth):
      block, attn = params[f"blocks_{layer}"]["attn"], state["intermediates"][f"blocks_{layer}"]
      weights, = attn["attn"]["attention_weights"]
      weights = np.asarray(weights, np.float64)
      (x,), (attended,) = attn["norm1"]["__call__"], attn["attn"]["__call__"]
      qkv = np.einsum("bld,dthe->blthe", np.asarray(x, np.float64), block["qkv_kernel"])
      qkv = qkv + block["qkv_bias"] * np.array([1.0, float(config.k_bias), 1.0])[:, None, None]
      q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
      if config.rope_periods is None:  # Under RoPE q and k are rotated first; v never is.
        scores = np.einsum("bqhe,bkhe->bhqk", q, k) / np.sqrt(config.head_dim)
        if case_bias is not None:
          scores = scores + case_bias
        if case_mask is not None:
          scores = np.where(case_mask, scores, -np.inf)
        expected = np.exp(scores - scores.max(-1, keepdims=True))
        np.testing.assert_allclose(weights, expected / expected.sum(-1, keepdims=True),
                                   atol=1e-6, rtol=0, err_msg=case)
      if case_mask is not None:
        assert np.all(weights[~np.broadcast_to(case_mask, weights.shape)] == 0.0), case
      rebuilt = np.einsum("bhqk,bkhe->bqhe", weights, v)
      rebuilt = np.einsum("blhe,hed->bld", rebuilt, block["out_kernel"]) + block["out_bias"]
      np.testing.assert_allclose(rebuilt, attended, atol=1e-5, rtol=0, err_msg=case)
