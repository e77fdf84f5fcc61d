"""The part-discovery optimizer: normalized weight decay and what it decays (issue 12, item 2)."""

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from metonymy import config_lib
from metonymy.models import stage1 as stage1_lib
from metonymy.models import two_stage
from metonymy.models import vit
from metonymy.training import optimizer

NUM_PARTS, NUM_ATTRIBUTES, IMAGE_SIZE = 2, 3, 16
# A ViT with every kind of parameter a trainable Stage 2 can have: registers, position table,
# LayerScale, qkv bias, patch-embedding bias.
VIT = vit.ViTConfig(patch_size=8, width=16, depth=1, num_heads=2, mlp_dim=32, num_registers=2,
                    pos_embed_grid=(2, 2), layer_scale=True, image_size=IMAGE_SIZE)


def _opt_config(**overrides) -> ml_collections.ConfigDict:
  config = config_lib.part_optimizer()
  config.update(overrides)
  return config


@pytest.fixture(scope="module")
def model_and_params():
  """(model, trainable params) of a tiny two-stage model: Stage 1's head and Stage 2's ViT."""
  backbone = vit.VisionTransformer(VIT)
  images = jnp.zeros((1, IMAGE_SIZE, IMAGE_SIZE, 3))
  frozen = jax.jit(backbone.init)(jax.random.PRNGKey(0), images)["params"]
  stage1 = stage1_lib.Stage1(backbone, stage1_lib.Stage1Head(num_parts=NUM_PARTS,
                                                             num_attributes=NUM_ATTRIBUTES))
  stage2 = two_stage.Stage2(VIT, num_parts=NUM_PARTS, num_attributes=NUM_ATTRIBUTES)
  model = two_stage.TwoStage(stage1, stage2)
  return model, jax.jit(lambda rng: model.init(rng, images, frozen))(jax.random.PRNGKey(1))


def _paths(tree, keep):
  """'/'-joined paths of the leaves of a bool tree where `keep(value)`."""
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {"/".join(str(getattr(k, "key", k)) for k in path) for path, v in flat if keep(v)}


def test_normalized_weight_decay_value():
  config = _opt_config(weight_decay=0.05, weight_decay_normalized=True)
  # 0.05 * sqrt(1 / 10000) = 5e-4.
  assert optimizer.effective_weight_decay(config, 10_000) == pytest.approx(5e-4, rel=1e-12)
  # PDiscoFormer on CUB: 5994 // 64 = 93 iterations per epoch, 30 epochs: about 9.5e-4.
  cub = optimizer.effective_weight_decay(config, (5994 // 64) * 30)
  assert cub == pytest.approx(0.05 / math.sqrt(2790), rel=1e-12)
  assert round(cub, 5) == 0.00095
  # Not normalized: the value as is; the paper's default is normalized.
  assert optimizer.effective_weight_decay(
      _opt_config(weight_decay_normalized=False), 10_000) == 0.05
  assert config_lib.part_optimizer().weight_decay_normalized
  with pytest.raises(ValueError, match="weight_decay must be >= 0"):
    optimizer.effective_weight_decay(_opt_config(weight_decay=-1.0), 10)


def test_decay_mask_selects_only_two_dimensional_weights(model_and_params):
  _, params = model_and_params
  mask = optimizer.decay_mask(params)
  decayed = _paths(mask, lambda v: v)
  assert decayed == {
      "stage1/head/kernel",
      "stage2/head/kernel",
      "stage2/backbone/patch_embed/kernel",
      "stage2/backbone/blocks_0/attn/qkv_kernel",
      "stage2/backbone/blocks_0/attn/out_kernel",
      "stage2/backbone/blocks_0/mlp/fc1/kernel",
      "stage2/backbone/blocks_0/mlp/fc2/kernel",
  }, sorted(decayed)
  kept = _paths(mask, lambda v: not v)
  for name in ("stage1/prototypes", "stage1/norm/scale", "stage1/norm/bias",
               "stage2/backbone/cls_token", "stage2/backbone/register_tokens",
               "stage2/backbone/pos_embed", "stage2/backbone/blocks_0/attn/qkv_bias",
               "stage2/backbone/blocks_0/ls1/gamma", "stage2/backbone/norm/scale"):
    assert name in kept, (name, sorted(kept))
  # The same mask from shapes alone (the trainer builds it from jax.eval_shape).
  assert jax.tree_util.tree_structure(optimizer.decay_mask(jax.eval_shape(lambda: params))) == (
      jax.tree_util.tree_structure(mask))


def test_one_step_with_zero_gradient_decays_exactly_the_masked_weights(model_and_params):
  """With a zero gradient Adam's step is 0, so a decayed leaf moves by exactly -lr * wd * value
  and an excluded one does not move at all (every group, including Stage 2's ViT)."""
  model, params = model_and_params
  total_steps = 4
  config = _opt_config(weight_decay=0.05, weight_decay_normalized=True)
  # Rates large enough that lr * wd ~ 2.5e-4 shows in float32 (the paper's Stage-2 ViT rate,
  # 2e-6, times a normalized decay of ~1e-3 is below float32's resolution of one step).
  config.learning_rates = {"prototypes": 1e-2, "heads": 1e-2, "backbone": 1e-2}
  labels = model.param_groups(params)
  tx, schedules = optimizer.make(config, labels, total_steps, batch_size=64)
  wd = optimizer.effective_weight_decay(config, total_steps)
  assert wd == pytest.approx(0.05 / 2)
  zero = jax.tree_util.tree_map(jnp.zeros_like, params)
  updates, _ = jax.jit(tx.update)(zero, tx.init(params), params)
  new_params = optax.apply_updates(params, updates)
  mask = optimizer.decay_mask(params)
  flat = lambda tree: dict(jax.tree_util.tree_flatten_with_path(tree)[0])
  new, old, decays, groups = flat(new_params), flat(params), flat(mask), flat(labels)
  assert any(decays.values()) and not all(decays.values())
  for path, value in old.items():
    value = np.asarray(value, np.float32)
    if decays[path]:
      lr = float(schedules[groups[path]](0))  # At batch 64 the base rate, step 0 of the cosine.
      np.testing.assert_allclose(new[path], value - lr * wd * value, rtol=1e-6, atol=0,
                                 err_msg=jax.tree_util.keystr(path))
      assert np.any(new[path] != value), jax.tree_util.keystr(path)
    else:
      np.testing.assert_array_equal(new[path], value, err_msg=jax.tree_util.keystr(path))


def test_the_step_schedule_halves_the_rate_at_equal_intervals_and_unknown_ones_are_refused():
  """PDiscoFormer's StepLR (halved every 4 of 28 epochs): 7 halvings over the run."""
  rate = optimizer.schedule(1.0, 800, 0, "step", halvings=7)
  np.testing.assert_allclose([float(rate(s)) for s in (0, 99, 100, 199, 200, 799)],
                             [1.0, 1.0, 0.5, 0.5, 0.25, 0.5 ** 7])
  warm = optimizer.schedule(1.0, 900, 100, "step", halvings=7)
  np.testing.assert_allclose([float(warm(s)) for s in (50, 100, 199, 200)], [0.5, 1.0, 1.0, 0.5])
  with pytest.raises(ValueError, match="schedule must be one of.*'linear'"):
    optimizer.schedule(1.0, 10, 0, "linear")
