"""Cost of the two-stage model: single-stage vs two-stage (soft / hard / STE per layer / STE per
stream), for inference and for a training step (forward + backward), in one process.

  python -m metonymy.bench two_stage --model vit_b16 --batch-size 8 --image-size 224 --num-parts 8

Random weights; the numbers are times, not accuracies. Ratios are to the single-stage model in
the same run (minimum over interleaved repetitions).
"""

import time
from typing import Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np

from metonymy.training import losses
from metonymy.models import stage1 as stage1_lib
from metonymy.models import two_stage
from metonymy.models import vit

VARIANTS = ("single", "hard", "soft", "ste_layer", "ste_stream")


def _model(variant: str, config: vit.ViTConfig, num_parts: int, num_attributes: int):
  backbone = vit.VisionTransformer(config)
  stage1 = stage1_lib.Stage1(backbone, stage1_lib.Stage1Head(num_parts, num_attributes))
  if variant == "single":
    return stage1
  mask, _, scope = variant.partition("_")
  # Dense Stage 2 at inference too: `python -m metonymy.bench suite` measures background dropping.
  stage2 = two_stage.Stage2(config, num_parts, num_attributes, mask=mask, ste_scope=scope or "layer",
                            drop_background=False)
  return two_stage.TwoStage(stage1, stage2)


def attribute_loss(model, labels, valid):
  """`loss(params, frozen, images)`: the attribute losses of every logits head, with the
  training-mode forward (Gumbel noise, STE's soft path): what a training step differentiates."""
  def loss(params, frozen, images):
    out = model.apply(params, frozen, images, train=True, rng=jax.random.PRNGKey(2))
    return sum(losses.attribute_bce(l, labels, valid) for l in out["logits"].values())
  return loss


def run(model_name: str = "vit_b16", batch_size: int = 8, image_size: int = 224,
        num_parts: int = 8, num_attributes: int = 32, repeats: int = 3,
        depth: Optional[int] = None) -> Dict[str, object]:
  config = vit.get_config(model_name, image_size=image_size)
  if depth:
    config = config.replace(depth=depth)
  _, frozen = vit.init_params(config)
  rng = np.random.default_rng(0)
  images = jnp.asarray(rng.normal(size=(batch_size, image_size, image_size, 3)), jnp.float32)
  labels = jnp.asarray(rng.random((batch_size, num_attributes)) > 0.5, jnp.float32)
  valid = jnp.ones_like(labels, bool)
  fns = {}
  for variant in VARIANTS:
    model = _model(variant, config, num_parts, num_attributes)
    params = model.init(jax.random.PRNGKey(1), images, frozen)

    # Everything is an argument: closed-over weights or images would be constant-folded.
    infer = jax.jit(lambda p, f, x, model=model: model.apply(p, f, x, train=False)["logits"])
    grad = jax.jit(jax.grad(attribute_loss(model, labels, valid)))
    fns[f"{variant}/inference"] = (infer, params)
    fns[f"{variant}/train_step"] = (grad, params)
  for fn, params in fns.values():  # Compile.
    jax.block_until_ready(fn(params, frozen, images))
  samples = {name: [] for name in fns}
  for _ in range(repeats):
    for name, (fn, params) in fns.items():
      start = time.perf_counter()
      jax.block_until_ready(fn(params, frozen, images))
      samples[name].append(time.perf_counter() - start)
  seconds = {name: min(s) for name, s in samples.items()}
  ratios = {name: seconds[name] / seconds["single/" + name.split("/")[1]] for name in seconds}
  return {"model": model_name, "depth": config.depth, "batch_size": batch_size,
          "image_size": image_size, "num_parts": num_parts, "device": str(jax.devices()[0]),
          "seconds": seconds, "ratio_to_single_stage": ratios}


def format_table(results: Dict[str, object]) -> str:
  lines = [f"{results['model']} ({results['depth']} blocks), batch {results['batch_size']} @ "
           f"{results['image_size']}px, K={results['num_parts']} on {results['device']}",
           f"{'variant':12s} {'infer s':>9s} {'x single':>9s} {'train s':>9s} {'x single':>9s}"]
  s, r = results["seconds"], results["ratio_to_single_stage"]
  for variant in VARIANTS:
    i, t = f"{variant}/inference", f"{variant}/train_step"
    lines.append(f"{variant:12s} {s[i]:9.4f} {r[i]:9.2f} {s[t]:9.4f} {r[t]:9.2f}")
  return "\n".join(lines)
