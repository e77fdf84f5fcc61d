"""The objective's per-term gradients (objective.term_gradient_norms, the Table-3 mechanism):
each term's norm at Stage 1's prototypes is the norm of that weighted term's own gradient there,
and the terms sum to the objective that training differentiates."""

import os

import jax
import jax.numpy as jnp
import pytest

from metonymy import config_lib
from metonymy import loading
from metonymy.training import objective
from tests.helpers import compile_cache

compile_cache.enable()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
A = 6


def _setup(name):
  config = config_lib.load_config(os.path.join(ROOT, "configs", f"{name}.py"), "runlocal")
  config.loss.weights.equivariance = 0.0  # its second forward adds nothing to check here
  model, frozen = loading.build_model(config, A)
  size = config.data.image_size
  keys = jax.random.split(jax.random.PRNGKey(0), 4)
  batch = {"image": jax.random.normal(keys[0], (2, size, size, 3)),
           "attributes": (jax.random.uniform(keys[1], (2, A)) > 0.5).astype(jnp.float32),
           "attribute_valid": jnp.ones((2, A), bool)}
  # Jitted: run eagerly, a two-stage model's init dispatches (and compiles) op by op.
  params = jax.jit(model.init)(keys[2], batch["image"][:1], frozen)
  return model, params, frozen, batch, keys[3], config.loss


def _prototypes(params):
  return params["stage1"]["prototypes"] if "stage1" in params else params["prototypes"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["synthetic_single", "synthetic_ste"])
def test_each_term_norm_is_that_terms_own_gradient_at_the_prototypes(name):
  model, params, frozen, batch, rng, loss_config = _setup(name)
  norms = jax.jit(lambda p: objective.term_gradient_norms(model, p, frozen, batch, rng,
                                                          loss_config))(params)
  terms, total = jax.jit(lambda p: (
      objective.loss_terms(model, p, frozen, batch, rng, loss_config)[0],
      objective.loss_fn(model, p, frozen, batch, rng, loss_config)[0]))(params)
  assert set(norms) == set(terms)
  assert ("attribute_stage2" in norms) == (name == "synthetic_ste")

  def own_gradient_norms(params):
    def term_value(p, term):
      weight, value = objective.loss_terms(model, p, frozen, batch, rng, loss_config)[0][term]
      return weight * value
    return {t: jnp.linalg.norm(_prototypes(jax.grad(term_value)(params, t))) for t in terms}

  expected = jax.jit(own_gradient_norms)(params)  # one compile for every term
  for term in terms:
    assert float(norms[term]) == pytest.approx(float(expected[term]), rel=1e-4, abs=1e-7), term
  # The terms are the objective: their weighted sum is loss_fn's total.
  assert float(total) == pytest.approx(float(sum(w * v for w, v in terms.values())), rel=1e-6)


def test_an_unknown_group_is_refused_by_name():
  model, params, frozen, batch, rng, loss_config = _setup("synthetic_single")
  with pytest.raises(ValueError, match="'backbone'"):
    objective.term_gradient_norms(model, params, frozen, batch, rng, loss_config, group="backbone")


def test_prior_decay_is_off_by_default_and_falls_from_start_to_final():
  loss_config = config_lib.part_losses()
  assert objective.prior_scale(loss_config, 0, 100) is None  # the default objective unchanged
  loss_config.prior_decay.start, loss_config.prior_decay.final = 0.5, 0.1
  scales = [float(objective.prior_scale(loss_config, step, 100)) for step in range(100)]
  assert scales[:51] == [1.0] * 51
  assert scales[-1] == pytest.approx(0.1)
  assert all(a >= b for a, b in zip(scales, scales[1:])) and scales[75] < 1.0


@pytest.mark.parametrize("decay, match", [({"start": 1.5, "final": 0.0}, "start 1.5"),
                                          ({"start": 0.5, "final": -1.0}, "final -1.0"),
                                          ({"start": 0.5, "end": 0.0}, "'end'")])
def test_a_bad_prior_decay_is_refused_by_name(decay, match):
  loss_config = config_lib.part_losses()
  loss_config.prior_decay = decay
  with pytest.raises(ValueError, match=match):
    objective.check_config(loss_config)


def test_the_prior_factor_scales_every_prior_and_no_attribute_loss():
  model, params, frozen, batch, rng, loss_config = _setup("synthetic_single")
  terms = jax.jit(lambda p, factor: objective.loss_terms(model, p, frozen, batch, rng,
                                                         loss_config, factor)[0])
  plain, scaled = terms(params, jnp.float32(1.0)), terms(params, jnp.float32(0.25))
  assert set(plain) == {"attribute_stage1"} | {
      t for t in config_lib.PRIOR_TERMS if loss_config.weights[t]}
  for name, (weight, value) in scaled.items():
    assert float(value) == float(plain[name][1]), name  # the terms themselves do not change
    expected = 0.25 * float(plain[name][0]) if name in config_lib.PRIOR_TERMS else 1.0
    assert float(weight) == pytest.approx(expected), name
