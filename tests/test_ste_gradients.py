"""Stage 2's mask variants per attention layer: STE's forward is the hard one bit for bit and its
gradient is the soft one exactly; the soft bias against values computed by hand for real
(non-one-hot) probabilities (issue 15, item 2)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metonymy.models import attention_masks
from metonymy.models import pos_embed
from metonymy.models import vit

K = 3  # Foreground parts; K is also the background's id.
TINY = dict(patch_size=4, width=32, depth=2, num_heads=2, mlp_dim=64, image_size=24)
VARIANTS = {
    "learned_pos": vit.ViTConfig(pos_embed_grid=(6, 6), **TINY),
    "rope_registers_no_k_bias": vit.ViTConfig(pos_embed_grid=None, num_registers=2,
                                              rope_periods=pos_embed.rope_periods(16),
                                              k_bias=False, **TINY),
}


def _layer_inputs(config, seed=0):
  """Every layer's attention parameters (random biases too), one early-masked sequence and
  real part probabilities (softmax of noisy logits: no row is one-hot)."""
  keys = jax.random.split(jax.random.PRNGKey(seed), 5)
  params = vit.VisionTransformer(config).init(keys[0], jnp.zeros((1, 24, 24, 3)))["params"]
  layers = [jax.tree_util.tree_map(lambda p: p + 0.1 * jax.random.normal(keys[1], p.shape),
                                   params[f"blocks_{i}"]["attn"]) for i in range(config.depth)]
  logits = 2.0 * jax.nn.one_hot(jax.random.randint(keys[2], (2, 36), 0, K + 1), K + 1)
  probs = jax.nn.softmax(logits + jax.random.normal(keys[3], logits.shape), -1)
  length = (K + 1) * config.num_prefix + 36
  x = jax.random.normal(keys[4], (2, length, config.width))
  rope = None
  if config.rope_periods is not None:
    rope = tuple(jnp.asarray(t) for t in pos_embed.rope_sin_cos((6, 6), config.rope_periods))
  return layers, x, probs, rope


def _attention(config, variant, params, x, probs, rope):
  """One attention layer over the early-masked sequence of probs' argmax parts."""
  ids = jnp.argmax(probs, -1)
  mask = attention_masks.block_attention_mask(
      attention_masks.early_masking_group_ids(ids, K, config.num_prefix))
  bias = attention_masks.soft_group_attention_bias(probs, config.num_prefix)
  kwargs = {"hard": dict(mask=mask), "soft": dict(bias=bias),
            "ste": dict(mask=mask, bias=bias, straight_through=True)}[variant]
  return vit.Attention(config).apply({"params": params}, x, rope=rope, **kwargs)


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.slow
def test_ste_forward_is_hard_and_gradient_is_soft_in_every_layer(name):
  config = VARIANTS[name]
  layers, x, probs, rope = _layer_inputs(config)
  # A linear read-out: its cotangent does not depend on the forward value, so STE's backward
  # pass (the soft one, evaluated where the forward is the hard one) must give the soft
  # gradient exactly.
  readout = jax.random.normal(jax.random.PRNGKey(7), x.shape)

  def loss(variant, params, x, probs):
    return jnp.sum(readout * _attention(config, variant, params, x, probs, rope))

  grad = {v: jax.jit(jax.grad(lambda *a, v=v: loss(v, *a), argnums=(0, 1, 2)))
          for v in ("hard", "soft", "ste")}
  for i, params in enumerate(layers):
    hard = _attention(config, "hard", params, x, probs, rope)
    ste = _attention(config, "ste", params, x, probs, rope)
    np.testing.assert_array_equal(np.asarray(ste), np.asarray(hard), err_msg=f"layer {i}")
    hard_grads, soft_grads = grad["hard"](params, x, probs), grad["soft"](params, x, probs)
    ste_params, ste_x, ste_probs = grad["ste"](params, x, probs)
    # Before the straight-through sum (qkv projection, input, probabilities): the soft
    # gradient, exactly.
    expected = {"qkv_kernel": soft_grads[0]["qkv_kernel"], "qkv_bias": soft_grads[0]["qkv_bias"],
                "out_bias": soft_grads[0]["out_bias"], "x": soft_grads[1], "probs": soft_grads[2]}
    for key in expected:
      np.testing.assert_array_equal(np.asarray(dict(ste_params, x=ste_x, probs=ste_probs)[key]),
                                    np.asarray(expected[key]), err_msg=f"layer {i}, d/d {key}")
    # After it, the output projection reads the attention output, which is the hard one: the
    # hard gradient (up to the summation order of another compiled program).
    np.testing.assert_allclose(np.asarray(ste_params["out_kernel"]),
                               np.asarray(hard_grads[0]["out_kernel"]), rtol=1e-5, atol=1e-5,
                               err_msg=f"layer {i}, d/d out_kernel")
    assert set(ste_params) == {"qkv_kernel", "qkv_bias", "out_kernel", "out_bias"}
    assert float(jnp.abs(ste_probs).max()) > 0.0  # The probabilities do get a signal,
    assert float(jnp.abs(hard_grads[2]).max()) == 0.0  # which hard masks never send.


def test_soft_bias_by_hand_for_real_probabilities():
  """P = 1 prefix token, K = 1 part (groups: part 0, background 1), two patches. Memberships:
  prefix copy 0 -> (1, 0), copy 1 -> (0, 1), patch 0 -> (0.8, 0.2), patch 1 -> (0.3, 0.7);
  the bias is log(sum_k a_i^k a_j^k + eps)."""
  probs = jnp.array([[[0.8, 0.2], [0.3, 0.7]]], jnp.float32)
  affinity = np.array([
      # copy 0, copy 1, patch 0,               patch 1
      [1.0, 0.0, 0.8, 0.3],
      [0.0, 1.0, 0.2, 0.7],
      [0.8, 0.2, 0.8 * 0.8 + 0.2 * 0.2, 0.8 * 0.3 + 0.2 * 0.7],  # 0.68, 0.38
      [0.3, 0.7, 0.3 * 0.8 + 0.7 * 0.2, 0.3 * 0.3 + 0.7 * 0.7],  # 0.38, 0.58
  ])
  expected = np.log(affinity + 1e-10)
  bias = attention_masks.soft_group_attention_bias(probs, num_prefix=1)
  assert bias.shape == (1, 1, 4, 4)
  np.testing.assert_allclose(np.asarray(bias[0, 0]), expected, rtol=1e-6, atol=1e-6)
  # Two prefix tokens per copy: each copy's rows and columns repeat.
  bias = attention_masks.soft_group_attention_bias(probs, num_prefix=2)[0, 0]
  order = [0, 0, 1, 1, 2, 3]
  np.testing.assert_allclose(np.asarray(bias), expected[np.ix_(order, order)], rtol=1e-6,
                             atol=1e-6)
