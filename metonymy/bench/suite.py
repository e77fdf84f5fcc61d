"""The whole cost picture in one run: throughput, XLA-counted FLOPs and peak memory.

  python -m metonymy.bench suite                     # vit_s16, 4 blocks, batch 4 @ 224 px (CPU)
  python -m metonymy.bench suite --quick             # tiny model, seconds (the tests' preset)
  python -m metonymy.bench suite --model vit_b16 --depth 12 --batch-size 1 \
      --dtype bfloat16 --attention-impl cudnn        # paper Table S5 setting, on a GPU
  python -m metonymy.bench suite --sections two_stage,attention --json /tmp/suite.json

Sections (`--sections`, all by default):
  early      plain vs early-masked forward for several K: t(early)/t(plain) next to the goal
             1.05 x L_early / L_plain (L_plain = P + N, L_early = (K + 1) P + N).
  two_stage  single-stage vs two-stage (hard, STE) as in paper Table S5: inference with Stage 2
             dense and with the background dropped, and a training step (forward + backward).
             Goal: two-stage / single-stage <= 2.05 at inference. Stage 2's part maps are the
             synthetic world's ground-truth parts (and then synthetic layouts at several
             foreground fractions); Stage 1 runs in full on the same images.
  vit        the Flax ViT vs its PyTorch (timm) reference: `bench.vit.run` (torch optional).
  data       the training input pipeline (Grain over the synthetic world with the standard train
             augmentations, `training.inputs.train_pipeline`) and the world's render rate.
  attention  early-masked attention as K and the resolution grow: dense (natural token order,
             one [L, L] mask) vs the sorted, tiled block-sparse attention (attention_tiles).

Every variant is compiled ahead of time once: FLOPs are XLA's count for the compiled program
(`compiled.cost_analysis()["flops"]`). XLA counts a conditional's costliest branch, so for
programs that pick a capacity bucket or attention window at run time the FLOPs are those of a
second compile with the part ids baked in, where XLA folds the choice to the branch taken
(`Variant`; the whole program's count stays in the JSON as `gflops_per_image_static`); loops
around matrix products are flagged (their body counts once). Memory is XLA's buffer assignment
(arguments + outputs + temporaries - aliased) and, on GPUs, also the allocator's process peak so
far. Times are minima over interleaved repetitions in one process (as in bench/vit.py and
bench/two_stage.py), so ratios are taken under the same machine load. MFU = XLA FLOPs per second
/ the accelerator's peak (bf16 dense, `PEAK_TFLOPS` by `device_kind`, or `--peak-tflops`).
Random weights throughout: the numbers are costs, not accuracies.
"""

import dataclasses
import re
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from metonymy.bench import two_stage as two_stage_bench
from metonymy.bench import vit as vit_bench
from metonymy.models import vit

SECTIONS = ("early", "two_stage", "vit", "data", "attention")
TWO_STAGE_GOAL = 2.05  # two-stage / single-stage inference time
EARLY_SLACK = 1.05  # t(early) / t(plain) <= EARLY_SLACK x L_early / L_plain

# Peak dense bf16 TFLOP/s per chip, by a lower-case substring of jax.devices()[0].device_kind;
# the first match wins (so "h100 pcie" before "h100", "v5 lite" before "v5"). Vendor datasheets:
# H100/H200 SXM 989 (PCIe 756), A100 312; TPU v4 275, v5e 197, v5p 459, v6e 918.
PEAK_TFLOPS: Tuple[Tuple[str, float], ...] = (
    ("h100 pcie", 756.0),
    ("h100", 989.0),
    ("h200", 989.0),
    ("a100", 312.0),
    ("tpu v4", 275.0),
    ("tpu v5 lite", 197.0),
    ("tpu v5e", 197.0),
    ("tpu v5p", 459.0),
    ("tpu v5", 459.0),  # v5p reports itself as "TPU v5"
    ("tpu v6 lite", 918.0),
    ("tpu v6e", 918.0),
)


@dataclasses.dataclass
class Options:
  model: str = "vit_s16"
  depth: int = 4  # 0 = the preset's depth
  batch_size: int = 4
  image_size: int = 224
  num_parts: Tuple[int, ...] = (1, 4, 8, 16)  # K of the early-masking section
  two_stage_parts: Optional[int] = None  # None = the synthetic world's parts (5)
  two_stage_masks: Tuple[str, ...] = ("hard", "ste")  # Stage-2 masks next to the single stage
  fg_fractions: Tuple[float, ...] = (0.1, 0.25, 0.5, 0.75, 1.0)
  attention_model: Optional[str] = None  # None = model
  attention_sizes: Tuple[int, ...] = (224, 384, 512)
  attention_parts: Tuple[int, ...] = (4, 8, 16)
  attention_tiles: int = 64
  vit_parts: int = 8  # K of the Flax-vs-PyTorch section
  repeats: int = 5
  train: bool = True  # time the two-stage training steps
  dtype: str = "float32"
  attention_impl: Optional[str] = None  # None/"xla", or "cudnn" on GPUs (with bfloat16)
  peak_tflops: Optional[float] = None
  torch: bool = True
  threads: Optional[int] = None  # torch intra-op threads
  data_batches: int = 8
  data_examples: int = 64
  sections: Tuple[str, ...] = SECTIONS
  seed: int = 0


# Seconds on 2 CPU cores: the tests' preset. Explicit flags still override it.
QUICK = dict(model="vit_tiny_test", depth=1, batch_size=2, image_size=32, num_parts=(1, 4),
             fg_fractions=(0.25, 1.0), attention_sizes=(32, 64), attention_parts=(4,),
             attention_tiles=8, vit_parts=4, repeats=1, data_batches=2, data_examples=8)


def make_options(quick: bool = False, **overrides) -> Options:
  """Options from the defaults, then the QUICK preset (if `quick`), then non-None overrides."""
  values = dict(QUICK) if quick else {}
  values.update({k: v for k, v in overrides.items() if v is not None})
  options = Options(**values)
  unknown = sorted(set(options.sections) - set(SECTIONS))
  if unknown:
    raise ValueError(f"unknown sections {unknown}; known: {SECTIONS}")
  bad = sorted(set(options.two_stage_masks) - {"hard", "ste"})
  if bad:
    raise ValueError(f"two_stage_masks must be hard and/or ste, got {bad}")
  if options.attention_impl == "xla":
    options.attention_impl = None
  if options.attention_impl == "cudnn" and options.dtype == "float32":
    raise ValueError("--attention-impl cudnn needs --dtype bfloat16 (or float16): cuDNN's fused "
                     "attention has no float32 kernel.")
  return options


# ------------------------------------------------------------------------------------------------
# Measuring.


def peak_tflops(device_kind: str, override: Optional[float] = None) -> Optional[float]:
  """Peak bf16 dense TFLOP/s of `device_kind` (None if unknown, e.g. CPUs), or `override`."""
  if override:
    return float(override)
  kind = device_kind.lower()
  for key, value in PEAK_TFLOPS:
    if key in kind:
      return value
  return None


def xla_flops(compiled) -> Optional[float]:
  """XLA's FLOP count of a compiled program (a dict in current JAX, a list of dicts in older)."""
  try:
    cost = compiled.cost_analysis()
  except NotImplementedError:
    return None
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  if not cost or "flops" not in cost:
    return None
  return float(cost["flops"])


def xla_memory_bytes(compiled) -> Optional[int]:
  """Arguments + outputs + temporaries - aliased bytes of XLA's buffer assignment."""
  try:
    stats = compiled.memory_analysis()
  except NotImplementedError:
    return None
  if stats is None:
    return None
  return int(stats.argument_size_in_bytes + stats.output_size_in_bytes
             + stats.temp_size_in_bytes - stats.alias_size_in_bytes)


def _control_flow(compiled) -> List[str]:
  """Control flow that makes XLA's FLOP count differ from the executed one: "conditional" (XLA
  counts the costliest branch) and "while" around matrix products (the body counts once).
  Loops without products (the PRNG's) are left out."""
  try:
    text = compiled.as_text()
  except Exception:  # Some backends cannot print the optimized HLO.
    return []
  found = ["conditional"] if " conditional(" in text else []
  # A product traced inside a loop body carries "while/body" in its op name (fusions included).
  if re.search(r" (dot|convolution)\([^\n]*op_name=\"[^\"]*while/body", text):
    found.append("while")
  return found


def _device_peak_bytes() -> Optional[int]:
  stats = jax.devices()[0].memory_stats()
  return int(stats["peak_bytes_in_use"]) if stats and "peak_bytes_in_use" in stats else None


@dataclasses.dataclass
class Variant:
  """One program to measure: `fn(*args)`, processing `batch` images per call.

  `control`: positions of the arguments (part ids, part maps) that pick branches at run time
  (capacity buckets, attention windows). XLA counts a conditional's costliest branch, so when
  the program has one, its executed FLOPs are counted on a second compile with those arguments
  baked in as constants: XLA then folds the branch choice and keeps only the branch taken.
  """
  fn: Callable
  args: Tuple
  batch: int
  control: Tuple[int, ...] = ()
  compiled: Any = None
  stats: Dict[str, Any] = dataclasses.field(default_factory=dict)

  def compile(self, cache: Optional[Dict] = None) -> None:
    """`cache`: compiled programs by (fn, argument shapes), shared between variants that run
    one program on other data (the foreground sweep)."""
    start = time.perf_counter()
    key = (self.fn, str(jax.tree_util.tree_map(lambda a: (a.shape, a.dtype), self.args)))
    if cache is not None and key in cache:
      self.compiled = cache[key]
    else:
      self.compiled = jax.jit(self.fn).lower(*self.args).compile()
      if cache is not None:
        cache[key] = self.compiled
    flops = xla_flops(self.compiled)
    self.stats = {"flops": flops, "flops_static": flops,
                  "memory_bytes": xla_memory_bytes(self.compiled),
                  "control_flow": _control_flow(self.compiled),
                  "compile_seconds": time.perf_counter() - start}
    if "conditional" in self.stats["control_flow"] and self.control:
      start = time.perf_counter()
      constants = {i: self.args[i] for i in self.control}
      dynamic = [a for i, a in enumerate(self.args) if i not in constants]

      def folded(*dynamic_args):
        it = iter(dynamic_args)
        return self.fn(*[constants[i] if i in constants else next(it)
                         for i in range(len(self.args))])
      taken = jax.jit(folded).lower(*dynamic).compile()
      self.stats["flops"] = xla_flops(taken)
      self.stats["control_flow"] = _control_flow(taken)  # What is left unresolved.
      self.stats["control_flow_resolved"] = True
      self.stats["compile_seconds"] += time.perf_counter() - start

  def __call__(self):
    return jax.block_until_ready(self.compiled(*self.args))


def measure(variants: Dict[str, Variant], repeats: int,
            peak: Optional[float]) -> Dict[str, Dict[str, Any]]:
  """Compiles every variant, then times them interleaved; the best of `repeats` per variant."""
  cache = {}
  for v in variants.values():
    v.compile(cache)
  for v in variants.values():  # Warm-up: first-run allocations, thread pools.
    v()
    v.stats["device_peak_bytes_so_far"] = _device_peak_bytes()
  samples = {name: [] for name in variants}
  for _ in range(repeats):  # Interleaved: slow drifts of machine load hit every variant.
    for name, v in variants.items():
      samples[name].append(vit_bench._seconds(v))
  out = {}
  for name, v in variants.items():
    seconds = min(samples[name])  # Load from other processes only ever adds time.
    flops = v.stats["flops"]
    out[name] = {
        "seconds": seconds,
        "images_per_second": v.batch / seconds,
        "gflops_per_image": flops / v.batch / 1e9 if flops else None,
        "memory_mib": v.stats["memory_bytes"] / 2**20 if v.stats["memory_bytes"] else None,
        "device_peak_mib_so_far": (v.stats["device_peak_bytes_so_far"] / 2**20
                                   if v.stats["device_peak_bytes_so_far"] else None),
        "tflops_per_second": flops / seconds / 1e12 if flops else None,
        "mfu": flops / seconds / (peak * 1e12) if flops and peak else None,
        "gflops_per_image_static": (v.stats["flops_static"] / v.batch / 1e9
                                    if v.stats["flops_static"] else None),
        "control_flow": v.stats["control_flow"],
        "compile_seconds": v.stats["compile_seconds"],
    }
  return out


def _flag_control_flow(section: str, measured: Dict[str, Dict[str, Any]], notes: List[str]):
  flagged = {n: m["control_flow"] for n, m in measured.items() if m["control_flow"]}
  if flagged:
    notes.append(f"{section}: XLA FLOPs of {flagged} are not the executed ones (a loop body "
                 "counts once, a conditional its costliest branch).")


def _dtype(options: Options):
  return jnp.dtype(options.dtype)


def _config(options: Options, name: Optional[str] = None, image_size: Optional[int] = None):
  config = vit.get_config(name or options.model, image_size=image_size or options.image_size)
  return config.replace(depth=options.depth) if options.depth else config


def _backbone(config: vit.ViTConfig, options: Options, **kwargs) -> vit.VisionTransformer:
  return vit.VisionTransformer(config, dtype=_dtype(options),
                               attention_impl=options.attention_impl, **kwargs)


def _images(rng: np.random.Generator, batch: int, size: int) -> jnp.ndarray:
  return jnp.asarray(rng.normal(size=(batch, size, size, 3)), jnp.float32)


def _grid(config: vit.ViTConfig, size: int) -> Tuple[int, int]:
  return (size // config.patch_size,) * 2


def sequence_lengths(config: vit.ViTConfig, size: int, num_parts: int) -> Dict[str, int]:
  n = _grid(config, size)[0] * _grid(config, size)[1]
  return {"patches": n, "prefix": config.num_prefix, "plain": config.num_prefix + n,
          "early": (num_parts + 1) * config.num_prefix + n}


def _tokens(out):
  return out["prefix_tokens"], out["patch_tokens"]


# ------------------------------------------------------------------------------------------------
# 1. Plain vs early-masked forward.


def early_masking(options: Options, peak: Optional[float]) -> Dict[str, Any]:
  config = _config(options)
  _, params = vit.init_params(config)
  model = _backbone(config, options)
  rng = np.random.default_rng(options.seed)
  images = _images(rng, options.batch_size, options.image_size)
  grid = _grid(config, options.image_size)

  def plain(p, x):
    return _tokens(model.apply({"params": p}, x))

  variants = {"plain": Variant(plain, (params, images), options.batch_size)}
  for k in options.num_parts:
    ids = jnp.asarray(rng.integers(0, k + 1, size=(options.batch_size,) + grid), jnp.int32)

    def early(p, x, i, k=k):
      return _tokens(model.apply({"params": p}, x, part_ids=i, num_parts=k))
    variants[f"early_K{k}"] = Variant(early, (params, images, ids), options.batch_size, (2,))
  measured = measure(variants, options.repeats, peak)
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


# ------------------------------------------------------------------------------------------------
# 2. Single- vs two-stage.


def _stage_model(variant: str, config: vit.ViTConfig, num_parts: int, num_attributes: int,
                 options: Options, **stage2_options):
  """bench/two_stage.py's model for `variant` ("single", "hard", "ste_layer", ...), with this
  run's dtype / attention implementation and optional Stage-2 options (drop_background, ...)."""
  model = two_stage_bench._model(variant, config, num_parts, num_attributes)
  stage1 = model if variant == "single" else model.stage1
  stage1.backbone = _backbone(config, options)
  if variant != "single":
    model.backbone = stage1.backbone
    model.stage2 = model.stage2.clone(dtype=_dtype(options), attention_impl=options.attention_impl,
                                      **stage2_options)
  return model


def synthetic_batch(config: vit.ViTConfig, size: int, batch: int, num_parts: Optional[int]):
  """(normalized images [B, S, S, 3], patch part ids [B, h, w] in [0, K], K, world info):
  the first `batch` validation images of the synthetic world rendered at `size`, and their
  ground-truth parts on the ViT's patch grid (plurality rule, background K)."""
  from metonymy.data import synthetic
  from metonymy.probe import masks
  world = synthetic.SyntheticConfig(image_size=size)
  source = synthetic.SyntheticParts(world, "val")
  examples = [source[i] for i in range(batch)]
  k = num_parts or world.num_parts
  if k < world.num_parts:
    raise ValueError(f"two-stage K={k} is below the synthetic world's {world.num_parts} parts")
  stacked = {key: np.stack([e[key] for e in examples]) for key in ("image", "part_segmentation")}
  labels = masks.GroundTruthMasks(k, world.part_names)(stacked).labels
  ids, _ = masks.patch_part_ids(labels, k, config.patch_size)
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


def two_stage_costs(options: Options, peak: Optional[float],
                    notes: List[str]) -> Dict[str, Any]:
  config = _config(options)
  _, frozen = vit.init_params(config)
  images, gt_ids, k, info = synthetic_batch(config, options.image_size, options.batch_size,
                                            options.two_stage_parts)
  num_attributes = info.num_attributes
  grid = _grid(config, options.image_size)
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
    return jax.grad(two_stage_bench.attribute_loss(models[name], labels, valid))

  gt_probs = _one_hot_probs(gt_ids, k)
  infer = {name: inference(name) for name in models}
  variants = {}
  for name in models:
    variants[f"{name}/inference"] = Variant(infer[name], (params[name], frozen, images,
                                                              gt_probs), options.batch_size, (3,))
  fractions = {}
  for fraction in options.fg_fractions:
    ids = layout_part_ids(grid, options.batch_size, k, fraction)
    fractions[fraction] = ids
    for name in ("hard_drop_bg", "ste_drop_bg"):
      if name in models:
        variants[f"{name}/fg{fraction:g}"] = Variant(
            infer[name], (params[name], frozen, images, _one_hot_probs(jnp.asarray(ids), k)),
            options.batch_size, (3,))
  if options.train:
    for name in ("single",) + tuple(options.two_stage_masks):
      variants[f"{name}/train_step"] = Variant(train_step(name), (params[name], frozen, images),
                                               options.batch_size)
  measured = measure(variants, options.repeats, peak)
  for name, m in measured.items():  # Ratios to the single-stage model in the same mode.
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
  _flag_control_flow("two_stage", measured, notes)
  return {"model": options.model, "depth": config.depth, "batch_size": options.batch_size,
          "image_size": options.image_size, "num_parts": k, "num_attributes": num_attributes,
          "synthetic_foreground_fraction": gt_foreground, "goal_inference_ratio": TWO_STAGE_GOAL,
          "variants": measured, "foreground_sweep": sweep}


# ------------------------------------------------------------------------------------------------
# 3. Flax vs PyTorch, 4. data, 5. attention.


def vit_vs_torch(options: Options, notes: List[str]) -> Dict[str, Any]:
  with_torch = options.torch
  if with_torch:
    try:
      import timm  # noqa: F401
      import torch  # noqa: F401
    except ImportError as e:
      with_torch = False
      notes.append(f"vit: PyTorch reference skipped ({e}).")
  if with_torch and options.model not in vit_bench.TIMM_REFERENCES:
    with_torch = False
    notes.append(f"vit: no timm reference for {options.model} "
                 f"(known: {sorted(vit_bench.TIMM_REFERENCES)}); Flax only.")
  if options.dtype != "float32" or options.attention_impl:
    notes.append("vit: bench/vit.py compares float32 with XLA attention on both sides, whatever "
                 "--dtype / --attention-impl say.")
  return vit_bench.run(options.model, options.batch_size, options.image_size, options.vit_parts,
                       max(options.repeats, 1), options.depth, with_torch, options.threads)


def data_throughput(options: Options) -> Dict[str, Any]:
  from metonymy import config_lib
  from metonymy.data import synthetic
  from metonymy.training import inputs
  config = _config(options)
  size = options.image_size
  data_config = config_lib.train_data("synthetic", image_size=size, train_split="train",
                                      eval_split="val", options={"image_size": size},
                                      batch_size=options.batch_size)
  source, _ = inputs.sources(data_config)
  iterator = iter(inputs.train_pipeline(source, data_config, config.image_mean, config.image_std,
                                        options.batch_size, options.seed))
  next(iterator)  # Starts the read-ahead threads.
  start = time.perf_counter()
  for _ in range(options.data_batches):
    next(iterator)
  seconds = time.perf_counter() - start
  world = synthetic.SyntheticConfig(image_size=size)
  return {"image_size": size, "batch_size": options.batch_size, "batches": options.data_batches,
          "worker_count": data_config.worker_count, "read_threads": data_config.read_threads,
          "pipeline_examples_per_second": options.data_batches * options.batch_size / seconds,
          "render_examples_per_second_one_core": synthetic.benchmark_examples_per_second(
              world, num_examples=options.data_examples)}


ATTENTION_VARIANTS = ("plain", "dense", "sorted", "tiled")


def attention_scaling(options: Options, peak: Optional[float],
                      notes: List[str]) -> Dict[str, Any]:
  """Per number of parts K and resolution: plain forward, and the early-masked forward with dense
  masked attention in the natural layout ("dense"), in the sorted layout ("sorted":
  token_order="sorted", one window, dense masked attention) and tiled ("tiled": attention_tiles
  > 0). Part ids are uniform over the K + 1 groups."""
  name = options.attention_model or options.model
  base = _config(options, name)
  _, params = vit.init_params(base)  # Position tables are resized per resolution on the fly.
  rng = np.random.default_rng(options.seed)
  models = {"plain": _backbone(base, options), "dense": _backbone(base, options),
            "sorted": _backbone(base, options, token_order="sorted"),
            "tiled": _backbone(base, options, token_order="sorted",
                               attention_tiles=options.attention_tiles)}
  variants = {}
  cases = [(k, size) for k in options.attention_parts for size in options.attention_sizes]
  for size in options.attention_sizes:
    images = _images(rng, options.batch_size, size)
    variants[f"plain/{size}"] = Variant(
        lambda p, x, model=models["plain"]: _tokens(model.apply({"params": p}, x)),
        (params, images), options.batch_size)
    for k in options.attention_parts:
      ids = jnp.asarray(rng.integers(0, k + 1, size=(options.batch_size,) + _grid(base, size)),
                        jnp.int32)
      for label, model in models.items():
        if label != "plain":
          variants[f"{label}/K{k}/{size}"] = Variant(
              lambda p, x, i, model=model, k=k: _tokens(model.apply(
                  {"params": p}, x, part_ids=i, num_parts=k)),
              (params, images, ids), options.batch_size, (2,))
  measured = measure(variants, options.repeats, peak)
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
  _flag_control_flow("attention", measured, notes)
  return {"model": name, "depth": base.depth, "batch_size": options.batch_size,
          "num_parts": list(options.attention_parts), "attention_tiles": options.attention_tiles,
          "rows": rows}


# ------------------------------------------------------------------------------------------------


def run(options: Optional[Options] = None) -> Dict[str, Any]:
  """Runs the selected sections; returns a JSON-able dict (see `format_tables`)."""
  options = options or Options()
  device = jax.devices()[0]
  peak = peak_tflops(device.device_kind, options.peak_tflops)
  notes: List[str] = []
  if options.attention_impl == "cudnn":
    notes.append("FLOPs: XLA's cost analysis may not count the fused cuDNN attention (a custom "
                 "call), so FLOPs and MFU can be low; --attention-impl xla counts every product.")
  if peak is None:
    notes.append(f"MFU: no peak FLOP/s known for {device.device_kind!r}; pass --peak-tflops.")
  results: Dict[str, Any] = {
      "options": dataclasses.asdict(options), "device": str(device),
      "device_kind": device.device_kind, "jax": jax.__version__, "peak_tflops": peak,
      "notes": notes}
  sections = {"early": lambda: early_masking(options, peak),
              "two_stage": lambda: two_stage_costs(options, peak, notes),
              "vit": lambda: vit_vs_torch(options, notes),
              "data": lambda: data_throughput(options),
              "attention": lambda: attention_scaling(options, peak, notes)}
  for name in SECTIONS:
    if name in options.sections:
      start = time.perf_counter()
      results[name] = sections[name]()
      results[name]["wall_seconds"] = time.perf_counter() - start
  return results


# ------------------------------------------------------------------------------------------------
# Tables.


def _f(value, spec: str = ".2f", width: int = 0) -> str:
  if value is not None and spec == "gflops":
    spec = ".3f" if abs(value) >= 0.01 else ".2e"
  text = "n/a" if value is None else format(value, spec)
  return text.rjust(width) if width else text


def _mib(m: Dict[str, Any]) -> Optional[float]:
  return m.get("memory_mib")  # The allocator's process peak (GPUs) is in the JSON.


TWO_STAGE_ROWS = (("single", "Single-Stage"), ("hard", "Two-Stage hard"),
                  ("ste", "Two-Stage STE"), ("hard_drop_bg", "Two-Stage hard, bg dropped"),
                  ("ste_drop_bg", "Two-Stage STE, bg dropped"))


def format_two_stage(r: Dict[str, Any]) -> List[str]:
  v = r["variants"]
  lines = [f"Table S5 (inference): {r['model']} ({r['depth']} blocks), batch {r['batch_size']} @ "
           f"{r['image_size']}px, K={r['num_parts']}, synthetic-world part maps "
           f"(foreground {100 * r['synthetic_foreground_fraction']:.0f}% of patches)",
           f"{'variant':28s} {'img/s':>9s} {'GFLOPs/img':>11s} {'MiB':>9s} {'x single':>9s} "
           f"{'FLOPs x':>8s} {'MFU':>7s}"]
  for key, label in TWO_STAGE_ROWS:
    m = v.get(f"{key}/inference")
    if m is None:  # A mask left out by --two-stage-masks.
      continue
    lines.append(f"{label:28s} {_f(m['images_per_second'], '.2f', 9)} "
                 f"{_f(m['gflops_per_image'], 'gflops', 11)} {_f(_mib(m), '.1f', 9)} "
                 f"{_f(m['time_ratio_to_single'], '.2f', 9)} "
                 f"{_f(m['flops_ratio_to_single'], '.2f', 8)} {_f(m['mfu'], '.1%', 7)}")
  checks = [f"{label} {v[f'{key}/inference']['time_ratio_to_single']:.2f}"
            f" {'ok' if v[f'{key}/inference']['time_ratio_to_single'] <= TWO_STAGE_GOAL else 'MISSED'}"
            for key, label in TWO_STAGE_ROWS[1:] if f"{key}/inference" in v]
  lines.append(f"goal two-stage/single <= {TWO_STAGE_GOAL} at inference: " + "; ".join(checks))
  if "single/train_step" in v:
    lines += ["", "Training step (forward + backward):",
              f"{'variant':28s} {'s/step':>9s} {'img/s':>9s} {'GFLOPs/img':>11s} {'MiB':>9s} "
              f"{'x single':>9s} {'MFU':>7s}"]
    for key, label in TWO_STAGE_ROWS[:3]:
      m = v.get(f"{key}/train_step")
      if m is None:
        continue
      lines.append(f"{label:28s} {_f(m['seconds'], '.4f', 9)} {_f(m['images_per_second'], '.2f', 9)} "
                   f"{_f(m['gflops_per_image'], 'gflops', 11)} {_f(_mib(m), '.1f', 9)} "
                   f"{_f(m['time_ratio_to_single'], '.2f', 9)} {_f(m['mfu'], '.1%', 7)}")
  if r["foreground_sweep"]:
    dense = v.get("hard/inference") or v["ste/inference"]
    lines += ["", f"Background dropped vs foreground fraction (synthetic layouts; dense two-stage "
              f"= {dense['time_ratio_to_single']:.2f}x single time, "
              f"{_f(dense['flops_ratio_to_single'])}x FLOPs):",
              f"{'fg':>5s} {'fg patches':>11s} {'hard x single':>14s} {'STE x single':>13s} "
              f"{'FLOPs x single':>15s} {'x dense':>8s}"]
    for row in r["foreground_sweep"]:
      hard, ste = row.get("hard_drop_bg"), row.get("ste_drop_bg")
      either = hard or ste
      lines.append(f"{row['fraction']:5.2f} {row['foreground_patches']:5d}/{row['patches']:<5d} "
                   f"{_f(hard and hard['time_ratio_to_single'], '.2f', 14)} "
                   f"{_f(ste and ste['time_ratio_to_single'], '.2f', 13)} "
                   f"{_f(either['flops_ratio_to_single'], '.2f', 15)} "
                   f"{_f(either['seconds'] / dense['seconds'], '.2f', 8)}")
  return lines


def format_early(r: Dict[str, Any]) -> List[str]:
  p = r["variants"]["plain"]
  lines = [f"Plain vs early-masked forward: {r['model']} ({r['depth']} blocks), batch "
           f"{r['batch_size']} @ {r['image_size']}px; plain {p['images_per_second']:.2f} img/s, "
           f"{_f(p['gflops_per_image'], 'gflops')} GFLOPs/img, {_f(_mib(p), '.1f')} MiB, "
           f"MFU {_f(p['mfu'], '.1%')}",
           f"{'K':>3s} {'L plain->early':>15s} {'img/s':>9s} {'GFLOPs/img':>11s} {'MiB':>8s} "
           f"{'t(e)/t(p)':>10s} {'goal <=':>8s} {'':6s} {'FLOPs(e)/(p)':>12s}"]
  for row in r["rows"]:
    m = r["variants"][f"early_K{row['num_parts']}"]
    lines.append(f"{row['num_parts']:3d} {row['length_plain']:>7d}->{row['length_early']:<6d} "
                 f"{_f(m['images_per_second'], '.2f', 9)} {_f(m['gflops_per_image'], 'gflops', 11)} "
                 f"{_f(_mib(m), '.1f', 8)} {row['time_ratio']:10.3f} {row['goal']:8.3f} "
                 f"{'ok' if row['meets_goal'] else 'MISSED':6s} {_f(row['flops_ratio'], '.3f', 12)}")
  return lines


def format_attention(r: Dict[str, Any]) -> List[str]:
  labels = [l for l in ATTENTION_VARIANTS if l in r["rows"][0]]
  lines = [f"Early-masked attention vs K and resolution: {r['model']} ({r['depth']} blocks), "
           f"batch {r['batch_size']}, uniform random groups, tiles of "
           f"{r['attention_tiles'] or 'n/a'} queries; img/s, GFLOPs/img and MiB of "
           + "/".join(labels) + "; tiled speed-up and FLOPs vs dense and vs sorted",
           f"{'K':>3s} {'px':>5s} {'N':>5s} {'L':>5s} {'img/s':>23s} {'GFLOPs/img':>23s} {'MiB':>23s} "
           f"{'speed-up d/s':>13s} {'FLOPs d/s':>10s}"]
  for row in r["rows"]:
    join = lambda key, spec: "/".join(_f(row[l][key], spec) for l in labels)
    pair = lambda key: "/".join(_f(row.get(f"tiled_{key}_vs_{ref}"), ".2f")
                                for ref in ("dense", "sorted"))
    lines.append(f"{row['num_parts']:3d} {row['image_size']:5d} {row['patches']:5d} {row['early']:5d} "
                 f"{join('images_per_second', '.1f'):>23s} {join('gflops_per_image', '.3g'):>23s} "
                 f"{join('memory_mib', '.0f'):>23s} {pair('speedup'):>13s} {pair('flops'):>10s}")
  return lines


def format_data(r: Dict[str, Any]) -> List[str]:
  return [f"Data: train pipeline (Grain, synthetic world @ {r['image_size']}px, standard train "
          f"augmentations, batch {r['batch_size']}, {r['read_threads']} read thread(s), "
          f"{r['worker_count']} workers): {r['pipeline_examples_per_second']:.1f} examples/s; "
          f"rendering alone {r['render_examples_per_second_one_core']:.1f} examples/s per core"]


def format_tables(results: Dict[str, Any]) -> str:
  o = results["options"]
  lines = [f"metonymy bench suite on {results['device']} ({results['device_kind']}), jax "
           f"{results['jax']}, {o['dtype']}, attention {o['attention_impl'] or 'xla'}, peak "
           f"{_f(results['peak_tflops'], '.0f')} TFLOP/s; times: min over {o['repeats']} "
           f"interleaved repeats; MiB: XLA buffers (args + outputs + temps)"]
  for name, formatter in (("two_stage", format_two_stage), ("early", format_early),
                          ("attention", format_attention), ("data", format_data)):
    if name in results:
      lines += [""] + formatter(results[name])
  if "vit" in results:
    lines += ["", "Flax vs PyTorch (bench/vit.py):", vit_bench.format_table(results["vit"])]
  if results["notes"]:
    lines += ["", "Notes:"] + [f"  - {n}" for n in results["notes"]]
  return "\n".join(lines)
