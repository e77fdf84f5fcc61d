"""bfloat16 + cuDNN fused attention against the float32 XLA path (issue 15, item 5).

These run only where JAX sees a GPU; elsewhere they are skipped with the reason printed (`-ra`).
`python -m pytest -m gpu` runs just these. Tolerances are bfloat16's: 8 bits of mantissa, so a
relative error of a few 1e-3 per operation, compounded over two blocks.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metonymy.models import attention
from metonymy.models import attention_masks
from metonymy.models import vit


def _gpu_present() -> bool:
  try:
    return bool(jax.devices("gpu"))
  except RuntimeError:
    return False


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not _gpu_present(),
                                 reason="no GPU: cuDNN attention needs one (jax.devices('gpu'))")]

K = 3
# cuDNN's fused kernel wants head_dim a multiple of 8; 37 tokens plain and 4 P + 36 early are
# odd/even lengths, so the padding path runs too.
CONFIG = vit.ViTConfig(patch_size=4, width=64, depth=2, num_heads=2, mlp_dim=128,
                       pos_embed_grid=(6, 6), num_registers=1, image_size=24)


def _setup():
  keys = jax.random.split(jax.random.PRNGKey(0), 4)
  images = jax.random.normal(keys[0], (2, 24, 24, 3))
  params = vit.VisionTransformer(CONFIG).init(keys[1], images)["params"]
  part_ids = jax.random.randint(keys[2], (2, 6, 6), 0, K + 1)
  logits = 2.0 * jax.nn.one_hot(part_ids.reshape(2, -1), K + 1)
  probs = jax.nn.softmax(logits + jax.random.normal(keys[3], logits.shape), -1)
  return params, images, part_ids, probs


def _relative_error(a, b):
  a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _models():
  return (vit.VisionTransformer(CONFIG),  # float32, models/attention.xla_attention
          vit.VisionTransformer(CONFIG, dtype=jnp.bfloat16, attention_impl="cudnn"))


def test_cudnn_kernel_matches_float32_xla_with_mask_and_bias():
  rng = np.random.default_rng(0)
  q, k, v = (rng.normal(size=(2, 40, 2, 32)).astype(np.float32) for _ in range(3))
  mask = attention_masks.block_attention_mask(jnp.asarray(rng.integers(0, 4, size=(2, 40))))
  bias = jnp.asarray(rng.normal(size=(2, 1, 40, 40)), jnp.float32)
  for kwargs in ({"mask": mask}, {"bias": bias}):
    want = attention.xla_attention(q, k, v, **kwargs)
    got = attention.dot_product_attention(
        *(jnp.asarray(x, jnp.bfloat16) for x in (q, k, v)), implementation="cudnn",
        **{key: (value.astype(jnp.bfloat16) if key == "bias" else value)
           for key, value in kwargs.items()})
    assert got.dtype == jnp.bfloat16
    assert _relative_error(got, want) < 2e-2, list(kwargs)


def test_vit_bf16_cudnn_matches_float32_xla_plain_and_early_masked():
  params, images, part_ids, _ = _setup()
  reference, fused = _models()
  for kwargs in ({}, {"part_ids": part_ids, "num_parts": K}):
    want = jax.jit(lambda x: reference.apply({"params": params}, x, **kwargs))(images)
    got = jax.jit(lambda x: fused.apply({"params": params}, x, **kwargs))(images)
    for key in want:
      assert _relative_error(got[key], want[key]) < 5e-2, (key, list(kwargs))


def test_cudnn_early_masking_keeps_zero_leakage_bit_for_bit():
  params, images, part_ids, _ = _setup()
  _, fused = _models()
  apply = jax.jit(lambda x: fused.apply({"params": params}, x, part_ids=part_ids,
                                        num_parts=K)["part_tokens"])
  reference = apply(images)
  pixel_ids = jnp.repeat(jnp.repeat(part_ids, 4, 1), 4, 2)
  noise = 5.0 * jax.random.normal(jax.random.PRNGKey(9), images.shape)
  for k in range(K + 1):
    changed = apply(jnp.where((pixel_ids != k)[..., None], images + noise, images))
    np.testing.assert_array_equal(np.asarray(changed[:, k], np.float32),
                                  np.asarray(reference[:, k], np.float32), err_msg=f"part {k}")


def test_cudnn_ste_forward_is_hard_and_gradient_matches_float32_soft():
  params, images, _, probs = _setup()
  reference, fused = _models()
  ids = jnp.argmax(probs, -1).reshape(2, 6, 6)

  def part_tokens(model, probs, variant):
    bias = attention_masks.soft_group_attention_bias(probs, CONFIG.num_prefix)
    kwargs = {"hard": {}, "ste": {"straight_through_bias": bias}}[variant]
    return model.apply({"params": params}, images, part_ids=ids, num_parts=K,
                       **kwargs)["part_tokens"]

  hard = jax.jit(lambda p: part_tokens(fused, p, "hard"))(probs)
  ste = jax.jit(lambda p: part_tokens(fused, p, "ste"))(probs)
  np.testing.assert_array_equal(np.asarray(ste, np.float32), np.asarray(hard, np.float32))
  loss = lambda model: jax.jit(jax.grad(
      lambda p: jnp.sum(part_tokens(model, p, "ste")[:, :, 0].astype(jnp.float32) ** 2)))
  got, want = loss(fused)(probs), loss(reference)(probs)
  assert np.all(np.isfinite(np.asarray(got)))
  assert _relative_error(got, want) < 1e-1
