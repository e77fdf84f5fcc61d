"""A backbone smoke run: both forwards, the zero-leakage invariant, shapes and timings."""

import json
import time

import jax
import jax.numpy as jnp
from absl import logging

from metonymy import console
from metonymy import distributed
from metonymy import loading
from metonymy.workdir import Workdir


def run(config, workdir):
  model, params, vit_config = loading.build_backbone(config.backbone, config.seed)
  size = vit_config.image_size
  grid = (size // vit_config.patch_size,) * 2
  rng_images, rng_parts, rng_noise = jax.random.split(jax.random.PRNGKey(config.seed), 3)
  images = jax.random.normal(rng_images, (config.batch_size, size, size, 3))
  part_ids = jax.random.randint(rng_parts, (config.batch_size,) + grid, 0, config.num_parts + 1)

  plain = jax.jit(lambda p, x: model.apply({"params": p}, x))
  early = jax.jit(lambda p, x, ids: model.apply({"params": p}, x, part_ids=ids,
                                                 num_parts=config.num_parts))
  timings = {}
  for name, fn, args in (("plain", plain, (params, images)),
                         ("early", early, (params, images, part_ids))):
    jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    timings[name] = time.perf_counter() - start
    logging.info("%s forward: %s in %.3fs", name,
                 {k: tuple(v.shape) for k, v in out.items()}, timings[name])

  # Zero leakage: noise on every patch outside part 0 leaves part 0's tokens bit-identical.
  pixel_ids = jnp.repeat(jnp.repeat(part_ids, vit_config.patch_size, 1), vit_config.patch_size, 2)
  noise = jax.random.normal(rng_noise, images.shape)
  perturbed = jnp.where((pixel_ids != 0)[..., None], images + noise, images)
  reference = early(params, images, part_ids)["part_tokens"][:, 0]
  changed = early(params, perturbed, part_ids)["part_tokens"][:, 0]
  leakage = float(jnp.max(jnp.abs(reference - changed)))
  result = {"backbone": vit_config.to_dict(), "image_size": size, "seconds": timings,
            "part0_max_abs_change_under_outside_noise": leakage}
  if distributed.is_main_process():
    with open(Workdir(workdir).output("smoke.json"), "w") as f:
      json.dump(result, f, indent=2)
  console.console(f"plain {timings['plain']:.3f}s, early {timings['early']:.3f}s; "
                  f"part-0 change under noise outside part 0: {leakage} (must be 0.0)")
  if leakage != 0.0:
    raise RuntimeError(f"Early masking leaked: part 0 changed by {leakage}.")
