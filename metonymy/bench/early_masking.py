"""What early masking costs the backbone (`bench suite` sections "early" and "attention").

  early      plain vs early-masked forward for several K: t(early)/t(plain) next to the goal
             1.05 x L_early / L_plain (L_plain = P + N, L_early = (K + 1) P + N).
  attention  early-masked attention as K and the resolution grow: dense (natural token order,
             one [L, L] mask) vs the sorted, tiled block-sparse attention (attention_tiles).
"""

from typing import Any, Dict, List, Optional

import jax.numpy as jnp
import numpy as np

from metonymy.bench import cost
from metonymy.bench.options import Options, patch_grid, random_images, sequence_lengths, tokens
from metonymy.models import vit

EARLY_SLACK = 1.05  # t(early) / t(plain) <= EARLY_SLACK x L_early / L_plain
ATTENTION_VARIANTS = ("plain", "dense", "sorted", "tiled")


def plain_vs_early(options: Options, peak: Optional[float]) -> Dict[str, Any]:
  """The plain forward and the early-masked one for each K of `options.num_parts`, part ids
  uniform over the K + 1 groups."""
  config = options.vit_config()
  _, params = vit.init_params(config)
  model = options.backbone(config)
  rng = np.random.default_rng(options.seed)
  images = random_images(rng, options.batch_size, options.image_size)
  grid = patch_grid(config, options.image_size)

  def plain(p, x):
    return tokens(model.apply({"params": p}, x))

  variants = {"plain": cost.Variant(plain, (params, images), options.batch_size)}
  for k in options.num_parts:
    ids = jnp.asarray(rng.integers(0, k + 1, size=(options.batch_size,) + grid), jnp.int32)

    def early(p, x, i, k=k):
      return tokens(model.apply({"params": p}, x, part_ids=i, num_parts=k))
    variants[f"early_K{k}"] = cost.Variant(early, (params, images, ids), options.batch_size, (2,))
  measured = cost.measure(variants, options.repeats, peak)
  rows = []
  for k in options.num_parts:
    e, p = measured[f"early_K{k}"], measured["plain"]
    lengths = sequence_lengths(config, options.image_size, k)
    length_ratio = lengths["early"] / lengths["plain"]
    time_ratio = e["seconds"] / p["seconds"]
    rows.append({"num_parts": k, "length_plain": lengths["plain"], "length_early": lengths["early"],
                 "length_ratio": length_ratio, "time_ratio": time_ratio,
                 "goal": EARLY_SLACK * length_ratio,
                 "meets_goal": time_ratio <= EARLY_SLACK * length_ratio,
                 "flops_ratio": (e["gflops_per_image"] / p["gflops_per_image"]
                                 if e["gflops_per_image"] and p["gflops_per_image"] else None)})
  return {"model": options.model, "depth": config.depth, "batch_size": options.batch_size,
          "image_size": options.image_size, "variants": measured, "rows": rows}


def attention_scaling(options: Options, peak: Optional[float],
                      notes: List[str]) -> Dict[str, Any]:
  """Per number of parts K and resolution: plain forward, and the early-masked forward with dense
  masked attention in the natural layout ("dense"), in the sorted layout ("sorted":
  token_order="sorted", one window, dense masked attention) and tiled ("tiled": attention_tiles
  > 0). Part ids are uniform over the K + 1 groups."""
  name = options.attention_model or options.model
  base = options.vit_config(name)
  _, params = vit.init_params(base)  # Position tables are resized per resolution on the fly.
  rng = np.random.default_rng(options.seed)
  models = {"plain": options.backbone(base), "dense": options.backbone(base),
            "sorted": options.backbone(base, token_order="sorted"),
            "tiled": options.backbone(base, token_order="sorted",
                                      attention_tiles=options.attention_tiles)}
  variants = {}
  cases = [(k, size) for k in options.attention_parts for size in options.attention_sizes]
  for size in options.attention_sizes:
    images = random_images(rng, options.batch_size, size)
    variants[f"plain/{size}"] = cost.Variant(
        lambda p, x, model=models["plain"]: tokens(model.apply({"params": p}, x)),
        (params, images), options.batch_size)
    for k in options.attention_parts:
      ids = jnp.asarray(rng.integers(0, k + 1, size=(options.batch_size,) + patch_grid(base, size)),
                        jnp.int32)
      for label, model in models.items():
        if label != "plain":
          variants[f"{label}/K{k}/{size}"] = cost.Variant(
              lambda p, x, i, model=model, k=k: tokens(model.apply(
                  {"params": p}, x, part_ids=i, num_parts=k)),
              (params, images, ids), options.batch_size, (2,))
  measured = cost.measure(variants, options.repeats, peak)
  rows = []
  for k, size in cases:
    row = {"image_size": size, "num_parts": k, **sequence_lengths(base, size, k)}
    row.update({label: measured[f"plain/{size}" if label == "plain" else f"{label}/K{k}/{size}"]
                for label in models})
    for label, reference in (("sorted", "dense"), ("tiled", "dense"), ("tiled", "sorted")):
      if label in row and reference in row:
        row[f"{label}_speedup_vs_{reference}"] = row[reference]["seconds"] / row[label]["seconds"]
        if row[label]["gflops_per_image"] and row[reference]["gflops_per_image"]:
          row[f"{label}_flops_vs_{reference}"] = (row[label]["gflops_per_image"]
                                                  / row[reference]["gflops_per_image"])
    rows.append(row)
  cost.flag_control_flow("attention", measured, notes)
  return {"model": name, "depth": base.depth, "batch_size": options.batch_size,
          "num_parts": list(options.attention_parts), "attention_tiles": options.attention_tiles,
          "rows": rows}
