"""The XLA attention kernel (models/attention.py) computes what jax.nn.dot_product_attention does,
and training configs choose the implementation."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metonymy import config_lib
from metonymy import loading
from metonymy.models import attention
from metonymy.models import attention_masks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 2e-6), (jnp.bfloat16, 2e-2)])
def test_xla_attention_matches_jax(dtype, tol):
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.normal(size=(2, 37, 3, 16)), dtype) for _ in range(3))
  groups = jnp.asarray(rng.integers(0, 4, size=(2, 37)))
  mask = attention_masks.block_attention_mask(groups)
  bias = jnp.asarray(rng.normal(size=(2, 1, 37, 37)), jnp.float32)
  for kwargs in ({}, {"mask": mask}, {"bias": bias}, {"mask": mask, "bias": bias}):
    ours = attention.xla_attention(q, k, v, **kwargs)
    theirs = jax.nn.dot_product_attention(q, k, v, implementation="xla", **{
        key: (value.astype(dtype) if key == "bias" else value) for key, value in kwargs.items()})
    assert ours.dtype == dtype and ours.shape == q.shape
    np.testing.assert_allclose(np.asarray(ours, np.float32), np.asarray(theirs, np.float32),
                               atol=tol, rtol=tol, err_msg=str(list(kwargs)))


def test_training_configs_choose_the_attention_implementation():
  config = config_lib.load_sibling_config(os.path.join(ROOT, "configs", "x.py"),
                                          "synthetic_ste", "runlocal")
  assert config.backbone.attention_impl == ""
  model, _ = loading.build_model(config, num_attributes=4)
  assert model.backbone.attention_impl is None and model.stage2.attention_impl is None
  config.backbone.attention_impl = "xla"
  model, _ = loading.build_model(config, num_attributes=4)
  assert model.backbone.attention_impl == "xla" and model.stage2.attention_impl == "xla"
  config.model.name = "stage1"
  single, _ = loading.build_model(config, num_attributes=4)
  assert single.backbone.attention_impl == "xla"
  # The leakage benchmark's and the smoke job's backbone too.
  config.backbone.dtype = "bfloat16"
  model, _, _ = loading.build_backbone(config.backbone)
  assert model.attention_impl == "xla" and model.dtype == jnp.bfloat16
