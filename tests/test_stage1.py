"""Stage 1: maps, pooling, the shared LayerNorm, routing, frozen backbone, the objective."""

import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from metonymy import config_lib
from metonymy import loading
from metonymy.models import part_model
from metonymy.training import objective
from tests.helpers import compile_cache

compile_cache.enable()
K, A, SIZE = 3, 5, 32


@pytest.fixture(scope="module")
def setup():
  config = ml_collections.ConfigDict({
      "seed": 0, "backbone": config_lib.backbone("vit_tiny_test", image_size=SIZE),
      "model": config_lib.stage1_model(num_parts=K, temperature=1.0)})
  model, frozen = loading.build_model(config, A)
  images = jax.random.normal(jax.random.PRNGKey(1), (2, SIZE, SIZE, 3))
  params = model.init(jax.random.PRNGKey(2), images)
  return model, frozen, params, images


def test_outputs_shapes_and_normalization(setup):
  model, frozen, params, images = setup
  out = model.apply(params, frozen, images, train=False)
  grid, dim = SIZE // 8, 64
  assert out["maps"].shape == (2, K + 1, grid, grid)
  assert out["part_logits"].shape == (2, K + 1, grid, grid)
  assert out["part_embeddings"].shape == (2, K + 1, dim)
  assert out["modulated_embeddings"].shape == (2, K + 1, dim)
  assert out["part_scores"].shape == (2, A, K)
  assert set(out["logits"]) == {"stage1"} and out["logits"]["stage1"].shape == (2, A)
  np.testing.assert_allclose(out["maps"].sum(1), 1.0, rtol=1e-5)


def test_logits_pooling_and_routing_follow_the_equations(setup):
  model, frozen, params, images = setup
  out = model.apply(params, frozen, images, train=False)
  z = np.asarray(model.features(frozen, images), np.float64)            # [B, h, w, D]
  p = np.asarray(params["prototypes"], np.float64)                       # [K+1, D]
  distance = ((z[:, :, :, None, :] - p) ** 2).sum(-1)                    # [B, h, w, K+1]
  np.testing.assert_allclose(out["part_logits"], np.moveaxis(-distance, -1, 1), rtol=2e-4,
                             atol=2e-3)
  maps = np.moveaxis(np.asarray(jax.nn.softmax(-distance, axis=-1)), -1, 1)  # eval: no noise
  np.testing.assert_allclose(out["maps"], maps, atol=1e-4)
  v = np.einsum("bkhw,bhwd->bkd", np.asarray(out["maps"], np.float64), z) / z[0, :, :, 0].size
  np.testing.assert_allclose(out["part_embeddings"], v, rtol=1e-4, atol=1e-5)
  s = np.asarray(out["part_scores"], np.float64)
  w = np.exp(s) / np.exp(s).sum(-1, keepdims=True)
  np.testing.assert_allclose(out["logits"]["stage1"], (w * s).sum(-1), rtol=1e-5, atol=1e-6)


def test_one_layer_norm_shared_by_all_parts(setup):
  model, frozen, params, images = setup
  assert set(params) == {"prototypes", "norm", "head"}
  assert params["norm"]["scale"].shape == (64,)       # one affine, not one per part
  assert params["head"]["kernel"].shape == (64, A)
  out = model.apply(params, frozen, images, train=False)
  v = np.asarray(out["part_embeddings"], np.float64)
  normed = (v - v.mean(-1, keepdims=True)) / np.sqrt(v.var(-1, keepdims=True) + 1e-5)
  expected = normed * np.asarray(params["norm"]["scale"]) + np.asarray(params["norm"]["bias"])
  np.testing.assert_allclose(out["modulated_embeddings"], expected, rtol=1e-4, atol=1e-4)


def _model_with(**model_options):
  """Stage 1 as the fixture's, with `model_options` set in its model block."""
  config = ml_collections.ConfigDict({
      "seed": 0, "backbone": config_lib.backbone("vit_tiny_test", image_size=SIZE),
      "model": config_lib.stage1_model(num_parts=K, temperature=1.0)})
  config.model.update(model_options)
  return loading.build_model(config, A)[0]


def test_gumbel_noise_only_in_training(setup):
  model, frozen, params, images = setup
  a = model.apply(params, frozen, images, train=False)["maps"]
  b = model.apply(params, frozen, images, train=False)["maps"]
  np.testing.assert_array_equal(a, b)
  t1 = model.apply(params, frozen, images, train=True, rng=jax.random.PRNGKey(0))["maps"]
  t2 = model.apply(params, frozen, images, train=True, rng=jax.random.PRNGKey(1))["maps"]
  assert float(jnp.max(jnp.abs(t1 - t2))) > 1e-3
  with pytest.raises(ValueError, match="needs rng"):
    model.apply(params, frozen, images, train=True)


def test_evaluation_noise_keeps_the_gumbel_noise_in_evaluation_maps_and_repeats_itself(setup):
  model, frozen, params, images = setup
  noisy_model = _model_with(evaluation_noise=True)
  clean = model.apply(params, frozen, images, train=False)["maps"]
  first = noisy_model.apply(params, frozen, images, train=False)["maps"]
  again = noisy_model.apply(params, frozen, images, train=False)["maps"]
  other = noisy_model.apply(params, frozen, images, train=False, rng=jax.random.PRNGKey(7))["maps"]
  np.testing.assert_array_equal(first, again)  # no key given: a fixed one
  assert float(jnp.max(jnp.abs(first - clean))) > 1e-3
  assert float(jnp.max(jnp.abs(first - other))) > 1e-3


@pytest.mark.slow
def test_backbone_is_frozen_and_outside_the_trainable_tree(setup):
  model, frozen, params, images = setup
  batch = {"image": images, "attributes": jnp.ones((2, A)), "attribute_valid": jnp.ones((2, A), bool)}
  loss_config = config_lib.part_losses()
  loss = lambda p, f: objective.loss_fn(model, p, f, batch, jax.random.PRNGKey(0), loss_config)[0]
  grads, grad_frozen = jax.jit(jax.grad(loss, argnums=(0, 1)))(params, frozen)
  assert all(float(jnp.max(jnp.abs(g))) == 0.0 for g in jax.tree_util.tree_leaves(grad_frozen))
  assert float(jnp.max(jnp.abs(grads["prototypes"]))) > 0
  assert jax.tree_util.tree_structure(grads) == jax.tree_util.tree_structure(params)
  groups = model.param_groups(params)
  assert groups["prototypes"] == "prototypes"
  assert set(jax.tree_util.tree_leaves(groups["norm"]) + jax.tree_util.tree_leaves(groups["head"])) == {"heads"}


@pytest.mark.slow
def test_objective_terms_and_zero_weights(setup):
  model, frozen, params, images = setup
  batch = {"image": images, "attributes": jnp.ones((2, A)), "attribute_valid": jnp.ones((2, A), bool)}
  config = config_lib.part_losses()
  # Jitted: run eagerly, the equivariance term's warps dispatch (and compile) op by op.
  loss_fn = lambda config: jax.jit(lambda p: objective.loss_fn(
      model, p, frozen, batch, jax.random.PRNGKey(0), config))(params)
  total, metrics = loss_fn(config)
  assert {k for k in metrics if k.startswith("loss/")} == {
      "loss/attribute_stage1", "loss/orthogonality", "loss/total_variation", "loss/equivariance",
      "loss/foreground_presence", "loss/background_presence", "loss/entropy"}
  # The collapse watch rides along: every channel's share of the batch's patches.
  num_channels = model.num_parts + 1
  assert {k for k in metrics if not k.startswith("loss/")} == (
      {f"train/part_share/{k}" for k in range(num_channels)}
      | {f"train/part_mass/{k}" for k in range(num_channels)} | {"train/part_share/max"})
  weights = config.weights
  expected = sum(weights[k] * metrics[f"loss/{k}"] for k in
                 ("orthogonality", "total_variation", "equivariance", "foreground_presence",
                  "background_presence", "entropy")) + metrics["loss/attribute_stage1"]
  np.testing.assert_allclose(total, expected, rtol=1e-6)
  config.weights.equivariance = 0.0
  config.orthogonality = "pdisco"
  _, metrics = loss_fn(config)
  assert "loss/equivariance" not in metrics
  config.weights.entropy = -1.0
  with pytest.raises(ValueError, match="weights.entropy"):
    objective.check_config(config)


def test_both_models_keep_the_part_model_contract():
  configs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
  config = config_lib.load_config(os.path.join(configs, "synthetic_ste.py"), "runlocal")
  two_stage_model, _ = loading.build_model(config, num_attributes=4)
  config.model.name = "stage1"
  stage1_model, _ = loading.build_model(config, num_attributes=4)
  for model in (stage1_model, two_stage_model):
    assert isinstance(model, part_model.PartModel), type(model).__name__

  class NoMaps:  # What the check exists for: a model without part_maps is not a PartModel.
    backbone, num_parts = stage1_model.backbone, 3
    init = apply = param_groups = staticmethod(lambda *a, **k: None)

  assert not isinstance(NoMaps(), part_model.PartModel)


def test_joint_statistics_keep_a_part_s_area_and_per_part_statistics_erase_it():
  """v^k = (1/hw) sum A_k z is its area times the part's mean feature: under joint statistics
  (PDiscoFormer's LayerNorm([D, K+1])) a part four times larger comes out four times larger;
  standardised per part, a speck is as large as a whole part."""
  from metonymy.models import stage1 as stage1_lib
  rng = np.random.default_rng(0)
  directions = rng.normal(size=(3, 16))
  directions -= directions.mean(-1, keepdims=True)
  directions /= np.linalg.norm(directions, axis=-1, keepdims=True)
  areas = np.array([0.05, 0.2, 0.75])
  # Features of norm 30 (a ViT's), so that the epsilon is negligible against every variance.
  embeddings = jnp.asarray((30.0 * areas[:, None] * directions)[None], jnp.float32)  # [1, 3, 16]
  joint = np.linalg.norm(stage1_lib.standardize_part_embeddings(embeddings, "joint")[0], axis=-1)
  per_part = np.linalg.norm(stage1_lib.standardize_part_embeddings(embeddings, "per_part")[0],
                            axis=-1)
  np.testing.assert_allclose(joint / joint[-1], areas / areas[-1], rtol=1e-3)
  np.testing.assert_allclose(per_part, per_part[0], rtol=1e-3)


def test_stage1_head_options_joint_norm_and_part_dropout():
  from metonymy.models import stage1 as stage1_lib
  features = jax.random.normal(jax.random.PRNGKey(0), (2, 4, 4, 8))
  head = stage1_lib.Stage1Head(num_parts=3, num_attributes=5, embedding_norm="joint",
                               part_dropout=0.5)
  params = head.init(jax.random.PRNGKey(1), features, train=False)["params"]
  assert params["norm"]["scale"].shape == (4, 8)  # an affine per part and channel
  plain = head.apply({"params": params}, features, train=False)
  rngs = {"gumbel": jax.random.PRNGKey(2), "dropout": jax.random.PRNGKey(3)}
  dropped = head.apply({"params": params}, features, train=True, rngs=rngs)
  # A dropped part scores the head's bias alone on every attribute.
  bias = np.asarray(params["head"]["bias"])
  is_bias = np.all(np.isclose(np.asarray(dropped["part_scores"]), bias[None, :, None]), axis=1)
  assert is_bias.any() and not is_bias.all()
  assert not np.isclose(np.asarray(plain["part_scores"]), bias[None, :, None]).all(axis=1).any()
  with pytest.raises(ValueError, match="embedding_norm must be one of"):
    stage1_lib.Stage1Head(num_parts=3, num_attributes=5, embedding_norm="batch").init(
        jax.random.PRNGKey(1), features, train=False)


def test_a_background_of_several_prototypes_is_one_channel_the_sum_of_theirs():
  from metonymy.models import stage1 as stage1_lib
  features = jax.random.normal(jax.random.PRNGKey(0), (2, 4, 4, 8)) * 2.0
  tau = 0.5
  head = stage1_lib.Stage1Head(num_parts=3, num_attributes=5, temperature=tau,
                               background_prototypes=3)
  params = head.init(jax.random.PRNGKey(1), features, train=False)["params"]
  assert params["prototypes"].shape == (6, 8)  # K + M prototypes
  out = head.apply({"params": params}, features, train=False)
  z = np.asarray(features, np.float64).reshape(2, 16, 8)
  p = np.asarray(params["prototypes"], np.float64)
  distance = ((z[:, :, None, :] - p) ** 2).sum(-1)                        # [B, N, K+M]
  every = np.exp(-distance / tau)
  every /= every.sum(-1, keepdims=True)
  merged = np.concatenate([every[..., :3], every[..., 3:].sum(-1, keepdims=True)], -1)
  maps = np.asarray(out["maps"]).reshape(2, 4, 16).transpose(0, 2, 1)
  assert maps.shape[-1] == 4  # K+1 channels for everything after the maps
  np.testing.assert_allclose(maps, merged, atol=1e-5)
  # The maps stay the (noise-free) softmax of part_logits at the temperature.
  logits = np.asarray(out["part_logits"], np.float64)
  np.testing.assert_allclose(np.asarray(out["maps"]), np.exp(logits / tau) / np.exp(
      logits / tau).sum(1, keepdims=True), atol=1e-5)
  np.testing.assert_allclose(np.asarray(out["part_embeddings"]),
                             np.einsum("bnk,bnd->bkd", merged, z) / 16, rtol=1e-4, atol=1e-5)
  noisy = head.apply({"params": params}, features, train=True,
                     rngs={"gumbel": jax.random.PRNGKey(2), "dropout": jax.random.PRNGKey(3)})
  np.testing.assert_allclose(np.asarray(noisy["maps"]).sum(1), 1.0, rtol=1e-5)
  with pytest.raises(ValueError, match="background_prototypes must be >= 1"):
    stage1_lib.Stage1Head(num_parts=3, num_attributes=5, background_prototypes=0).init(
        jax.random.PRNGKey(1), features, train=False)


def test_trained_tokens_join_the_trainable_tree_and_only_they_get_a_gradient(setup):
  model, frozen, params, images = setup
  tokened = _model_with(trained_tokens=True)
  with pytest.raises(ValueError, match="needs the backbone's parameters"):
    tokened.init(jax.random.PRNGKey(2), images)
  tokened_params = tokened.init(jax.random.PRNGKey(2), images, frozen)
  assert set(tokened_params["backbone_tokens"]) == {"cls_token", "pos_embed"} & set(frozen)
  groups = tokened.param_groups(tokened_params)
  assert set(jax.tree_util.tree_leaves(groups["backbone_tokens"])) == {"tokens"}
  assert "tokens" in config_lib.part_optimizer().learning_rates
  # Started from the backbone's own tokens: the same maps as the frozen model's.
  np.testing.assert_allclose(tokened.apply(tokened_params, frozen, images, train=False)["maps"],
                             model.apply(params, frozen, images, train=False)["maps"], atol=1e-6)
  loss = lambda p, f: jnp.sum(tokened.apply(p, f, images, train=False)["logits"]["stage1"] ** 2)
  grads = jax.grad(loss)(tokened_params, frozen)
  assert float(jnp.abs(grads["backbone_tokens"]["pos_embed"]).max()) > 0.0
  frozen_grads = jax.grad(loss, argnums=1)(tokened_params, frozen)
  assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree_util.tree_leaves(frozen_grads))
  # Without the option no gradient reaches the backbone at all.
  plain_grads = jax.grad(lambda f: jnp.sum(model.apply(params, f, images, train=False)
                                           ["logits"]["stage1"] ** 2))(frozen)
  assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree_util.tree_leaves(plain_grads))
