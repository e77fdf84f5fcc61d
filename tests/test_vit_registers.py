"""vit.with_registers: register tokens given to a trained ViT that had none."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metonymy.converters import check_against_model
from metonymy.models import vit

CONFIG = vit.ViTConfig(patch_size=4, width=32, depth=2, num_heads=4, mlp_dim=64,
                       pos_embed_grid=(4, 4), image_size=16)


def test_added_registers_keep_every_weight_and_take_part_in_attention():
  _, params = vit.init_params(CONFIG, jax.random.PRNGKey(0))
  config, with_regs = vit.with_registers(CONFIG, params, 4, jax.random.PRNGKey(1))
  assert config.num_registers == 4 and config.num_prefix == 5
  check_against_model(config, with_regs, "with_registers")  # The tree the new config builds.
  for key, value in params.items():
    assert jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, value, with_regs[key]))
  images = jax.random.normal(jax.random.PRNGKey(2), (2, 16, 16, 3))
  model = vit.VisionTransformer(config)
  out = model.apply({"params": with_regs}, images)
  assert out["prefix_tokens"].shape == (2, 5, 32) and out["patch_tokens"].shape == (2, 16, 32)
  # The patch tokens attend to the registers: moving the registers moves them.
  moved = dict(with_regs, register_tokens=with_regs["register_tokens"] + 1.0)
  assert not np.allclose(model.apply({"params": moved}, images)["patch_tokens"],
                         out["patch_tokens"])
  # Drawn as the ViT draws its prefix tokens, and not alike (alike tokens get alike gradients).
  registers = np.asarray(with_regs["register_tokens"])[0]
  assert 0.01 < registers.std() < 0.03
  assert np.linalg.matrix_rank(registers) == 4


def test_with_registers_refuses_a_vit_that_has_them_and_a_count_of_none():
  _, params = vit.init_params(CONFIG, jax.random.PRNGKey(0))
  with pytest.raises(ValueError, match="count must be positive"):
    vit.with_registers(CONFIG, params, 0, jax.random.PRNGKey(1))
  config, with_regs = vit.with_registers(CONFIG, params, 2, jax.random.PRNGKey(1))
  with pytest.raises(ValueError, match="already has 2 register tokens"):
    vit.with_registers(config, with_regs, 2, jax.random.PRNGKey(1))
