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
