"""What the two-stage model costs next to the single-stage one.

  python -m metonymy.bench two_stage --model vit_b16 --batch-size 8 --image-size 224 --num-parts 8

`run` (the `two_stage` command) times every Stage-2 mask (soft / hard / STE per layer / STE per
stream) for inference and for a training step (forward + backward). `table_s5` (the `bench suite`
section "two_stage") adds XLA FLOPs and memory for the paper's Table S5 setting: single-stage vs
two-stage (hard, STE) with Stage 2 dense and with the background dropped, on the synthetic
world's ground-truth parts and then on synthetic layouts at several foreground fractions; Stage 1
runs in full on the same images. Goal: two-stage / single-stage <= 2.05 at inference.

Random weights; the numbers are costs, not accuracies. Ratios are to the single-stage model in
the same run (minimum over interleaved repetitions).
"""

from typing import Any, Dict, List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from metonymy.bench import cost
from metonymy.bench.options import Options, patch_grid, tokens, vit_config
from metonymy.data import synthetic
from metonymy.evaluation import patch_grid as patch_grid_lib
from metonymy.probe import masks
from metonymy.training import losses
from metonymy.models import stage1 as stage1_lib
from metonymy.models import two_stage
from metonymy.models import vit

VARIANTS = ("single", "hard", "soft", "ste_layer", "ste_stream")
TWO_STAGE_GOAL = 2.05  # two-stage / single-stage inference time


def _model(variant: str, config: vit.ViTConfig, num_parts: int, num_attributes: int):
  backbone = vit.VisionTransformer(config)
  stage1 = stage1_lib.Stage1(backbone, stage1_lib.Stage1Head(num_parts, num_attributes))
  if variant == "single":
    return stage1
  mask, _, scope = variant.partition("_")
  # Dense Stage 2 at inference too: `table_s5` measures background dropping.
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
  config = vit_config(model_name, image_size, depth)
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
    for name, fn in ((f"{variant}/inference", infer), (f"{variant}/train_step", grad)):
      fns[name] = lambda fn=fn, params=params: jax.block_until_ready(fn(params, frozen, images))
  for fn in fns.values():  # Compile.
    fn()
  seconds = cost.interleaved_minima(fns, repeats)
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


def _stage_model(variant: str, config: vit.ViTConfig, num_parts: int, num_attributes: int,
                 options: Options, **stage2_options):
  """`_model(variant, ...)` with this run's dtype / attention implementation and optional
  Stage-2 options (drop_background, ...)."""
  model = _model(variant, config, num_parts, num_attributes)
  stage1 = model if variant == "single" else model.stage1
  stage1.backbone = options.backbone(config)
  if variant != "single":
    model.backbone = stage1.backbone
    model.stage2 = model.stage2.clone(dtype=jnp.dtype(options.dtype),
                                      attention_impl=options.attention_impl, **stage2_options)
  return model


def synthetic_batch(config: vit.ViTConfig, size: int, batch: int, num_parts: Optional[int]):
  """(normalized images [B, S, S, 3], patch part ids [B, h, w] in [0, K], K, world info):
  the first `batch` validation images of the synthetic world rendered at `size`, and their
  ground-truth parts on the ViT's patch grid (plurality rule, background K)."""
  world = synthetic.SyntheticConfig(image_size=size)
  source = synthetic.SyntheticParts(world, "val")
  examples = [source[i] for i in range(batch)]
  k = num_parts or world.num_parts
  if k < world.num_parts:
    raise ValueError(f"two-stage K={k} is below the synthetic world's {world.num_parts} parts")
  stacked = {key: np.stack([e[key] for e in examples]) for key in ("image", "part_segmentation")}
  labels = masks.GroundTruthMasks(k, world.part_names)(stacked).labels
  ids, _ = patch_grid_lib.patch_part_ids(labels, k, config.patch_size)
  images = (stacked["image"].astype(np.float32) / 255.0 - np.asarray(config.image_mean)) / (
      np.asarray(config.image_std))
  return jnp.asarray(images, jnp.float32), jnp.asarray(ids), k, source.info


def layout_part_ids(grid: Tuple[int, int], batch: int, num_parts: int,
                    fraction: float) -> np.ndarray:
  """int32 [B, h, w]: round(fraction x h w) patches nearest the centre are foreground, split into
  K angular sectors (parts 0..K-1); the rest is background (K). Object-like, contiguous parts."""
  h, w = grid
  y, x = np.mgrid[:h, :w] + 0.5
  y, x = y - h / 2, x - w / 2
  count = int(round(fraction * h * w))
  order = np.argsort(np.hypot(y, x).ravel(), kind="stable")
  ids = np.full(h * w, num_parts, np.int32)
  angle = (np.arctan2(y, x).ravel() + np.pi) / (2 * np.pi)
  sector = np.minimum((angle * num_parts).astype(np.int32), num_parts - 1)
  ids[order[:count]] = sector[order[:count]]
  return np.broadcast_to(ids.reshape(h, w), (batch, h, w)).copy()


def _one_hot_probs(ids: jnp.ndarray, num_parts: int) -> jnp.ndarray:
  return jax.nn.one_hot(ids.reshape(ids.shape[0], -1), num_parts + 1, dtype=jnp.float32)


def table_s5(options: Options, peak: Optional[float], notes: List[str]) -> Dict[str, Any]:
  """Single- vs two-stage (`options.two_stage_masks`) at inference, Stage 2 dense and with the
  background dropped, on ground-truth parts and over `options.fg_fractions`; and a training step
  of each (if `options.train`)."""
  config = options.vit_config()
  _, frozen = vit.init_params(config)
  images, gt_ids, k, info = synthetic_batch(config, options.image_size, options.batch_size,
                                            options.two_stage_parts)
  num_attributes = info.num_attributes
  grid = patch_grid(config, options.image_size)
  labels = jnp.asarray(np.random.default_rng(options.seed).random(
      (options.batch_size, num_attributes)) > 0.5, jnp.float32)
  valid = jnp.ones_like(labels, bool)

  models, params = {}, {}
  builds = [("single", "single", {})]
  for mask in options.two_stage_masks:
    variant = "ste_layer" if mask == "ste" else mask
    builds.append((mask, variant, {"drop_background": False}))
    builds.append((f"{mask}_drop_bg", variant, {"drop_background": True}))
  for name, variant, extra in builds:
    models[name] = _stage_model(variant, config, k, num_attributes, options, **extra)
    params[name] = models[name].init(jax.random.PRNGKey(1), images, frozen)

  def inference(name):
    model = models[name]
    if name == "single":
      def fn(p, f, x, probs):
        del probs  # Stage 1 finds its own parts; the single-stage model is Stage 1.
        out = model.apply(p, f, x, train=False)
        return out["logits"], out["maps"]
    else:
      def fn(p, f, x, probs):
        # TwoStage.apply with Stage 2 reading `probs` instead of Stage 1's maps (random weights
        # would make those arbitrary): Stage 1 still runs in full and its outputs are returned.
        first = model.stage1.apply(p["stage1"], f, x, train=False)
        second = model.stage2.apply({"params": p["stage2"]}, x, probs, train=False)
        return first["logits"], first["maps"], second["logits"]
    return fn

  def train_step(name):
    return jax.grad(attribute_loss(models[name], labels, valid))

  gt_probs = _one_hot_probs(gt_ids, k)
  infer = {name: inference(name) for name in models}
  variants = {}
  for name in models:
    variants[f"{name}/inference"] = cost.Variant(
        infer[name], (params[name], frozen, images, gt_probs), options.batch_size, (3,))
  fractions = {}
  for fraction in options.fg_fractions:
    ids = layout_part_ids(grid, options.batch_size, k, fraction)
    fractions[fraction] = ids
    for name in ("hard_drop_bg", "ste_drop_bg"):
      if name in models:
        variants[f"{name}/fg{fraction:g}"] = cost.Variant(
            infer[name], (params[name], frozen, images, _one_hot_probs(jnp.asarray(ids), k)),
            options.batch_size, (3,))
  if options.train:
    for name in ("single",) + tuple(options.two_stage_masks):
      variants[f"{name}/train_step"] = cost.Variant(
          train_step(name), (params[name], frozen, images), options.batch_size)
    variants.update(_step_references(options, config, frozen, images, gt_ids, k))
  measured = cost.measure(variants, options.repeats, peak)
  for name, m in measured.items():  # Ratios to the single-stage model in the same mode.
    if name.startswith("vit"):  # The references of the time-per-FLOP breakdown.
      continue
    reference = measured.get("single/train_step" if name.endswith("train_step")
                             else "single/inference")
    m["time_ratio_to_single"] = m["seconds"] / reference["seconds"]
    m["flops_ratio_to_single"] = (m["gflops_per_image"] / reference["gflops_per_image"]
                                  if m["gflops_per_image"] and reference["gflops_per_image"]
                                  else None)
  gt_foreground = float(np.mean(np.asarray(gt_ids) != k))
  sweep = []
  for fraction, ids in fractions.items():
    row = {"fraction": fraction, "foreground_patches": int(np.sum(ids[0] != k)),
           "patches": grid[0] * grid[1]}
    for name in ("hard_drop_bg", "ste_drop_bg"):
      m = measured.get(f"{name}/fg{fraction:g}")
      if m is not None:
        row[name] = {key: m[key] for key in ("seconds", "images_per_second", "gflops_per_image",
                                             "time_ratio_to_single", "flops_ratio_to_single")}
    sweep.append(row)
  cost.flag_control_flow("two_stage", measured, notes)
  per_flop = {name: m["seconds"] / (m["gflops_per_image"] * options.batch_size) * 1e3
              for name, m in measured.items()
              if (name.endswith("train_step") or name == "vit/forward") and m["gflops_per_image"]}
  return {"model": options.model, "depth": config.depth, "batch_size": options.batch_size,
          "image_size": options.image_size, "num_parts": k, "num_attributes": num_attributes,
          "synthetic_foreground_fraction": gt_foreground, "goal_inference_ratio": TWO_STAGE_GOAL,
          "variants": measured, "foreground_sweep": sweep, "ms_per_gflop": per_flop}


def _step_references(options: Options, config: vit.ViTConfig, params, images, part_ids,
                     num_parts: int) -> Dict[str, cost.Variant]:
  """Where a two-stage training step's time beyond its FLOP share goes: the plain ViT forward
  (most of a single-stage step: its backbone is frozen), the plain ViT's forward + backward, and
  the early-masked ViT's forward + backward on the same parts (Stage 2 alone). Their time per
  XLA FLOP tells the backward pass's own cost from the masking's."""
  backbone = options.backbone(config)

  def plain(p, x):
    return tokens(backbone.apply({"params": p}, x))

  def plain_loss(p, x):
    return sum(jnp.mean(t ** 2) for t in plain(p, x))

  def early_loss(p, x, ids):
    return sum(jnp.mean(t ** 2) for t in tokens(
        backbone.apply({"params": p}, x, part_ids=ids, num_parts=num_parts)))

  batch = options.batch_size
  return {"vit/forward": cost.Variant(plain, (params, images), batch),
          "vit/train_step": cost.Variant(jax.grad(plain_loss), (params, images), batch),
          "vit_early/train_step": cost.Variant(jax.grad(early_loss), (params, images, part_ids),
                                               batch, (2,))}
