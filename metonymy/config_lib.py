"""The helpers that configs/*.py call, and the one loader of a config file.

A config file is `configs/<name>.py` with `get_config(arg: str = "")` returning a ConfigDict.
`arg` is what follows `:` in `--config=configs/<name>.py:<arg>`: comma-separated `key=value`
pairs or bare flags (a bare `key` means `key=True`), e.g. `runlocal`, `tiny`, `dataset=cub`,
`preset=vit_b16`, `tiny,trained`. Every file reads it with `parse_arg(arg, **defaults)`,
which names the keys it accepts and refuses any other; its docstring lists them.

Each helper below returns one block of a config (backbone, data, model, loss, optimizer, ...)
with its values on the page, so a config file shows every block of its run as one call each.
Configs compose these pieces rather than each other: part discovery on a dataset is
`part_discovery(dataset, arg, variant)` (its recipe in PART_DISCOVERY, the two-stage variants in
models/stage2_options.py), shared by configs/<dataset>_single.py, its two-stage siblings and the
demo. A config may load one other config file (`load_sibling_config`: the demo's world for
Table 3, a probe config for the suite), never one that loads a third.
Nothing here imports JAX or Flax: a config loads without an accelerator stack.
"""

import copy
import difflib
import importlib.util
import os
from typing import Dict, Optional

import ml_collections

from metonymy.models import stage2_options  # No JAX: Stage 2's option defaults.
from metonymy.training import self_supervised_options  # No JAX either.


def parse_arg(arg: str = "", **defaults) -> ml_collections.ConfigDict:
  """`arg` ("runlocal,preset=vit_b16") over `defaults` (runlocal=False, preset="vit_b14_reg4").

  A bare key sets a bool default to True; `key=value` takes the type of the key's default
  (bool: true/false/1/0). A key without a default is refused, naming the accepted ones.
  """
  parsed = ml_collections.ConfigDict(defaults)
  for item in filter(None, (part.strip() for part in (arg or "").split(","))):
    key, has_value, value = item.partition("=")
    key = key.strip()
    if key not in defaults:
      raise ValueError(f"Unknown config argument {key!r} in {arg!r}; this config accepts "
                       f"{sorted(defaults) or 'no argument'}.")
    default = defaults[key]
    if not has_value:
      if not isinstance(default, bool):
        raise ValueError(f"Config argument {key!r} needs a value: {key}=...")
      parsed[key] = True
    elif isinstance(default, bool):
      if value.strip().lower() not in ("true", "false", "1", "0"):
        raise ValueError(f"Config argument {key}={value!r}: expected true or false.")
      parsed[key] = value.strip().lower() in ("true", "1")
    else:
      parsed[key] = value.strip() if default is None else type(default)(value.strip())
  return parsed


def load_config(path: str, arg: str = "") -> ml_collections.ConfigDict:
  """`get_config(arg)` of the config file at `path`: the one loader of config files (main.py's
  override check, configs built on another file, tests). main.py's --config flag loads the same
  way through ml_collections.config_flags."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"Config file not found: {path}")
  name = os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(f"metonymy_config_{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def check_overrides(argv) -> None:
  """Raises ValueError (FileNotFoundError for a missing file) with the full key path when a
  --config.a.b=v override in `argv` names a key the config lacks, and with the config file's own
  message when it refuses its `:arg`. For every command that takes --config (main, the part-map
  export).

  config_flags itself fails on such keys too, but with a bare AttributeError; this says which
  override, which key, and what keys exist at that level.
  """
  spec = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
  overrides = [a[len("--config."):].split("=", 1)[0] for a in argv if a.startswith("--config.")]
  if spec is None:
    return
  config_file, _, arg = spec.partition(":")
  # Also the file's own check of its arg (`:runlocl`), as one line instead of absl's FATAL.
  config = load_config(config_file, arg)
  for path in overrides:
    parts = path.split(".")
    if "world" in config and len(parts) > 3 and parts[1:3] == ["data", "options"] and (
        parts[0] != "world"):
      # The demo and the Table-3 job stamp config.world into every sub-job at run time
      # (runs/subjobs.with_world): an override here would be silently replaced.
      key = ".".join(parts[3:])
      raise ValueError(f"--config.{path} is not read: the world's options have one home, "
                       f"config.world (pass --config.world.{key}=... instead).")
    node, walked = config, []
    for part in path.split("."):
      if not hasattr(node, "keys") or part not in node:
        known = sorted(node.keys()) if hasattr(node, "keys") else []
        where = ".".join(walked) or "<root>"
        near = difflib.get_close_matches(part, known, n=3, cutoff=0.6)
        hint = f" Did you mean {' or '.join(repr(n) for n in near)}?" if near else ""
        raise ValueError(f"Unknown config key {path!r} in --config.{path}: {where} has no key "
                         f"{part!r}.{hint} Keys at {where}: {known}")
      node, walked = node[part], walked + [part]


def load_sibling_config(config_file: str, name: str, arg: str = "") -> ml_collections.ConfigDict:
  """`load_config` of configs/<name>.py, in the folder of `config_file` (`__file__` in a config):
  builds a config on another without making configs/ an importable package. One level only: the
  loaded file builds from config_lib's pieces and loads no config itself (tests/test_configs.py),
  so a value has one home a reader finds in one step."""
  return load_config(os.path.join(os.path.dirname(os.path.abspath(config_file)), name + ".py"),
                     arg)


def backbone(preset: str = "vit_b16", checkpoint: str = "", image_size: int = 0,
             family: str = "") -> ml_collections.ConfigDict:
  """Which backbone to build: a converted/PyTorch checkpoint, or a random-init preset.

  checkpoint: a converted folder (python -m metonymy.converters convert) or a PyTorch /
    safetensors / Hugging Face checkpoint; empty means random weights of `preset`. A two-stage
    training workdir gives its trained Stage-2 ViT (so the leakage benchmark, with
    `masks.source="stage1"` on the same workdir, reads Stage 2's isolated part features).
  image_size: input resolution in pixels; 0 means the backbone's own default.
  Training jobs also read `dtype` (compute dtype, e.g. "bfloat16" on accelerators) and
  `attention_impl` ("" = models/attention.py's XLA kernel; "cudnn" for cuDNN's fused attention
  on GPUs, with a 16-bit dtype).
  part_pooling: SAM's image encoder only (it has no CLS): opt into early masking by pooling each
    part's own tokens of a block-masked forward (models/sam_encoder.py), not the paper's method.
  """
  return ml_collections.ConfigDict({
      "preset": preset,
      "checkpoint": checkpoint,
      "family": family,
      "image_size": image_size,
      "dtype": "float32",
      "attention_impl": "",
      "part_pooling": False,
  })


# ------------------------------------------------------------------------------------------------
# Leakage benchmark (job "probe", metonymy/probe/): data, part masks, features, probes, metrics.


def random_backbone(preset: str = "vit_tiny_test", image_size: int = 0,
                    **arch) -> ml_collections.ConfigDict:
  """A random-init `backbone()` whose preset fields are overridden by `arch` (ViTConfig fields,
  e.g. patch_size=4, depth=4, pos_embed_grid=(12, 12)): small test backbones without a new
  preset. The init seed is the run's seed."""
  config = backbone(preset=preset, image_size=image_size)
  config.arch = ml_collections.ConfigDict(arch)
  return config


def probe_data(dataset: str, *, root: str = "", train: str = "train", val: str = "",
               test: str = "test", val_fraction: float = 0.2, max_train: int = 0,
               max_val: int = 0, max_test: int = 0, image_size: int = 0, resize: int = 0,
               read_threads: int = 1, options=None, source: str = "") -> ml_collections.ConfigDict:
  """Which splits the probes train, select weight decay and test on (metonymy/probe/benchmark.py).

  source: "" = the dataset's own files under `root`; "tfds" = CelebA from a TFDS data_dir
    (`root`; metonymy.data.SOURCES).

  val: a split name, or "" to carve `val_fraction` of train (seeded by the run's seed).
  max_<role>: a fixed random subset of that many examples (0 = all); the subset does not depend on
    the run's seed, so cached features are shared across seeds.
  image_size: backbone input (0 = the backbone's own); resize: shorter side before the centre
    crop (0 = image_size).
  options: the dataset's make_source options (SyntheticConfig fields, CheXpert's uncertainty ...).
  """
  return ml_collections.ConfigDict({
      "dataset": dataset, "root": root, "source": source, "train": train, "val": val,
      "test": test,
      "val_fraction": val_fraction, "max_train": max_train, "max_val": max_val,
      "max_test": max_test, "image_size": image_size, "resize": resize,
      "read_threads": read_threads, "options": dict(options or {}),
  })


def part_masks(source: str = "ground_truth", *, path: str = "", num_parts: int = 0,
               background: str = "last", part_names: str = "",
               patch_rule: str = "plurality") -> ml_collections.ConfigDict:
  """Where the part masks come from (metonymy/probe/masks.py) and the partial-patch rule.

  source: "ground_truth" (synthetic part_segmentation), "file" (part maps in `path`, a .npy/.npz;
    `{split}` in the path is replaced by the split name) or "stage1" (`path` = a Stage-1
    training workdir; its model predicts the masks).
  num_parts: K. 0 = taken from the maps ("file": an .npz's `num_parts` entry, else soft maps'
    channels - 1, else the largest label); any other value must match the file's K or the file
    is refused, naming both. background: label of the background in integer maps, "last" (= K,
    the largest label) or "first" (= 0); part_names: comma-separated display names of the K
    parts.
  patch_rule: "plurality" or "foreground" (see masks.py).
  """
  return ml_collections.ConfigDict({
      "source": source, "path": path, "num_parts": num_parts, "background": background,
      "part_names": part_names, "patch_rule": patch_rule,
  })


def part_features(*, prefix: str = "cls", late_weights: str = "hard", batch_size: int = 32,
                  chunk_size: int = 512, cache_dir: str = "") -> ml_collections.ConfigDict:
  """Feature extraction (metonymy/probe/features.py, extract.py).

  prefix: early-masked part feature, "cls" or "cls_registers" (mean of CLS and registers).
  late_weights: "hard" (the patches of the part) or "coverage" (each patch weighted by the
    fraction of its pixels in the part).
  chunk_size: examples per cache chunk (an interrupted extraction resumes at a chunk).
  cache_dir: feature cache root ("" = <workdir>/cache).
  """
  return ml_collections.ConfigDict({
      "maskings": ("late", "early"), "prefix": prefix, "late_weights": late_weights,
      "batch_size": batch_size, "chunk_size": chunk_size, "cache_dir": cache_dir,
  })


def linear_probe(*, weight_decays=(1.0, 1e-1, 1e-2, 1e-3, 1e-4), max_iters: int = 60,
                 tol: float = 1e-4, memory: int = 8, select: str = "per_part",
                 patience: int = 1) -> ml_collections.ConfigDict:
  """Linear probes (metonymy/probe/linear.py): the weight-decay path, chosen on val per part."""
  return ml_collections.ConfigDict({
      "weight_decays": tuple(weight_decays), "max_iters": max_iters, "tol": tol,
      "memory": memory, "select": select, "patience": patience,
  })


def probe_evaluation(*, tau: float = 0.1, manual_assignment: str = "", bootstrap: int = 200,
                     alpha: float = 0.05, leakage_images: int = 256,
                     overlay_images: int = 6) -> ml_collections.ConfigDict:
  """Metrics (metonymy/evaluation/).

  tau: contingency threshold of Sec. 3.0.1 (k joins K_g^+ if c_g^k > tau; the paper gives no
    value). manual_assignment: 'group:k,k;group:k' for groups without keypoints (or to override).
  bootstrap: resamples of the test images for every interval (0 = none); alpha: 1 - coverage.
  leakage_images: test images for the causal leakage score; overlay_images: part-map figures.
  """
  return ml_collections.ConfigDict({
      "tau": tau, "manual_assignment": manual_assignment, "bootstrap": bootstrap, "alpha": alpha,
      "leakage_images": leakage_images, "overlay_images": overlay_images,
  })


def backbone_pretraining(steps: int = 0, *, batch_size: int = 32, learning_rate: float = 1e-3,
                         weight_decay: float = 0.05, images: int = 4000,
                         loss: str = "group_softmax", augment: str = "flip",
                         evaluate_every: int = 0, checkpoint_every: int = 250,
                         objective: str = "attributes", stage_seed: int = -1,
                         registers: int = 0,
                         self_supervised: Optional[Dict] = None) -> ml_collections.ConfigDict:
  """Pretraining of a random-init backbone on the first `images` training examples
  (training/pretraining.py). `objective` "attributes": supervised, a CLS head and an attention
  read-out per part; `loss` "group_softmax" (softmax over one-hot attribute groups) or "bce";
  `augment` "flip" or "affine" (flips plus random similarities, pretraining.AUGMENTATIONS).
  "self_supervised": DINOv2's objectives; the block `self_supervised` holds every option of
  training/self_supervised_options.Recipe, its defaults updated by `self_supervised` (an
  unknown option is refused).
  steps = 0: the random weights as they are. `evaluate_every` > 0: the stand-in's quality on
  `val` every that many steps of its main stage (record key `quality_curve`); not part of the
  recipe, since it does not change the weights. `checkpoint_every`: the stand-in job (demo mode
  "stand_in") saves its state in DIR/pretraining_state that often and resumes from it when rerun;
  not part of the recipe either. `stage_seed` >= 0: this stage's own seed (its data order, views
  and fresh heads), so a stage that continues a shipped stand-in (`start_from`) can be rerun
  under several run seeds from one start; -1: the stand-in's seed (config.stand_in_seed), which
  also picks its init, as every stand-in shipped so far was made. `registers` > 0: a stage that
  continues another stand-in (`start_from`) gives it that many register tokens (Darcet et al.
  2024: "Vision Transformers Need Registers"; DINOv2 with registers uses 4), freshly drawn, so the
  image-level information has somewhere to go besides the patch tokens; 0 keeps the start's
  architecture (a stand-in pretrained from scratch takes its registers from
  backbone.arch.num_registers)."""
  return ml_collections.ConfigDict({"steps": steps, "batch_size": batch_size,
                                    "learning_rate": learning_rate, "weight_decay": weight_decay,
                                    "images": images, "loss": loss, "augment": augment,
                                    "evaluate_every": evaluate_every,
                                    "checkpoint_every": checkpoint_every,
                                    "objective": objective, "stage_seed": stage_seed,
                                    "registers": registers,
                                    "self_supervised": self_supervised_options.as_config(
                                        self_supervised) if objective == "self_supervised"
                                    else {}})


# ------------------------------------------------------------------------------------------------
# Part-discovery training (job "train"): model, losses, optimizer, data, trainer, mesh.


# Stage 1's prototype start (training/prototype_init.py): "uniform" (the paper's) or "kmeans"
# (centroids of the backbone's patch features on this many training images).
PROTOTYPE_INIT = {"prototype_init": "uniform", "prototype_init_images": 256}


def stage1_model(num_parts: int, temperature: float = 1.0) -> ml_collections.ConfigDict:
  """Stage 1 (models/stage1.py): K foreground parts + background, Gumbel-softmax temperature,
  the prototypes' start (PROTOTYPE_INIT), how the shared LayerNorm takes its statistics
  (`embedding_norm`: "per_part", or "joint" as PDiscoFormer; stage1.EMBEDDING_NORMS quotes the
  paper's sentence), whole-part dropout before the attribute head (`part_dropout`;
  PDiscoFormer's 0.3, the paper silent) and Gumbel noise in the evaluation maps
  (`evaluation_noise`; PDiscoFormer keeps it, the paper silent), how many prototypes the
  background has (`background_prototypes`; the paper's and PDiscoFormer's one, its channels
  summed when more; stage1.Stage1Head says why) and whether the backbone's
  CLS / register tokens and position table train (`trained_tokens`, optimizer group "tokens";
  the paper keeps the backbone "strictly frozen", PDiscoFormer trains them). Their defaults:
  the paper's reading where it speaks (per-part statistics, docs/models.md says why; frozen
  tokens), PDiscoFormer's where it is silent (part dropout 0.3); evaluation without Gumbel noise
  so that a model's scores do not depend on a noise draw."""
  return ml_collections.ConfigDict(dict({"name": "stage1", "num_parts": num_parts,
                                         "temperature": temperature,
                                         "embedding_norm": "per_part", "part_dropout": 0.3,
                                         "evaluation_noise": False, "trained_tokens": False,
                                         "background_prototypes": 1},
                                        **PROTOTYPE_INIT))


def part_losses(orthogonality: str = "decorrelated") -> ml_collections.ConfigDict:
  """Eq. 9's weights. PDiscoFormer's priors keep PDiscoFormer's weights (paper Appendix A):
  background presence 2 ("enforced"), everything else 1.

  orthogonality: "decorrelated" (the paper's L_bg + L_decorr) or "pdisco" (Table S4 ablation).
  orthogonality_on: "embeddings" (v^k of eq. 3, the paper's notation) or "modulated" (after the
    shared LayerNorm, where PDiscoFormer applies its loss).
  equivariance: PDiscoFormer's random affine: rotation +-degrees, translation +-translate of the
    image size, scale in `scale`.
  prior_decay: a counterfactual, off by default (the paper and PDiscoFormer keep the weights
    fixed): from `start` (a fraction of the run's steps) every prior's weight falls on a half
    cosine to `final` times itself at the last step (objective.prior_scale), so that the
    attribute losses, Stage 2's among them, can move parts the priors have placed.
  """
  return ml_collections.ConfigDict({
      "weights": {"attribute": 1.0, "orthogonality": 1.0, "total_variation": 1.0,
                  "equivariance": 1.0, "foreground_presence": 1.0, "background_presence": 2.0,
                  "entropy": 1.0},
      "orthogonality": orthogonality,
      "orthogonality_on": "embeddings",
      "equivariance": {"degrees": 90.0, "translate": 0.11, "scale": (0.8, 1.4)},
      "prior_decay": {"start": 1.0, "final": 1.0},
  })


# The part-shaping priors of eq. 9: every loss term but the attribute losses.
PRIOR_TERMS = ("orthogonality", "total_variation", "equivariance", "foreground_presence",
               "background_presence", "entropy")


def set_priors(loss: ml_collections.ConfigDict, priors: str,
               total_variation: float = -1.0) -> None:
  """`loss.weights` of every prior: "paper" (part_losses' weights) or "off" (0: the attribute
  losses alone). total_variation >= 0 sets that prior's weight instead of PDiscoFormer's (with
  "paper" only: "off" has none to set)."""
  if priors not in ("paper", "off"):
    raise ValueError(f"priors={priors!r}: expected 'paper' or 'off'.")
  if priors == "off" and total_variation >= 0:
    raise ValueError(f"total_variation={total_variation:g} with priors='off': the priors are "
                     "off, total variation among them; use priors='paper'.")
  paper = part_losses().weights
  for term in PRIOR_TERMS:
    loss.weights[term] = paper[term] if priors == "paper" else 0.0
  if total_variation >= 0:
    loss.weights.total_variation = float(total_variation)


def part_optimizer() -> ml_collections.ConfigDict:
  """AdamW (paper Appendix A): base rates at batch 64, square-root scaling to the actual batch,
  cosine annealing, global-norm clipping at 2, normalized weight decay 0.05. Groups are the
  models' `param_groups` names; "backbone" is Stage 2's trainable ViT.

  PDiscoFormer's own rates, as a counterfactual: Adam without weight decay (weight_decay=0), the
  rate halved every 4 of 28 epochs (schedule="step", step_halvings=7: the paper says "we
  employed a cosine annealing schedule", so cosine stays the default).

  weight_decay, weight_decay_normalized: with weight_decay_normalized=True (the paper's
    "normalized weight decay", Loshchilov & Hutter) AdamW decays by
    weight_decay * sqrt(1 / total_steps), total_steps = iterations_per_epoch * epochs, the run's
    number of optimizer steps, as PDiscoFormer computes it (9.5e-4 for CUB at batch 64, 30
    epochs); False applies weight_decay as is. Either way only 2-D weights decay (attribute
    heads, Stage 2's ViT matrices): never the prototypes, LayerNorms, biases, 1-D parameters or
    a ViT's CLS / register / position tokens (training/optimizer.py `decay_mask`).
  """
  return ml_collections.ConfigDict({
      # "tokens": Stage 1's trained backbone tokens (model.trained_tokens; PDiscoFormer's
      # 1.4e-6 at batch 32 is ~2e-6 at 64, square-root scaled).
      "learning_rates": {"prototypes": 1e-3, "heads": 1e-2, "backbone": 2e-6, "tokens": 2e-6},
      "base_batch_size": 64,
      "lr_scaling": "sqrt",
      "schedule": "cosine",
      "step_halvings": 7,  # schedule "step" only
      "warmup_steps": 0,
      "weight_decay": 0.05,
      "weight_decay_normalized": True,
      "clip_norm": 2.0,
      "b1": 0.9,
      "b2": 0.999,
      "eps": 1e-8,
  })


def train_data(dataset: str, *, image_size: int, train_split: str, eval_split: str,
               root: str = "", batch_size: int = 64, options=None,
               source: str = "") -> ml_collections.ConfigDict:
  """Sources and pipelines of a training run (training/inputs.py).

  source: "" = the dataset's own files under `root`; "tfds" = CelebA from a TFDS data_dir
    (`root`; metonymy.data.SOURCES).

  options: keyword options of the dataset's make_source (SyntheticConfig fields for
    "synthetic"; e.g. the uncertainty policy for "chexpert").
  train_examples: train on the first N examples of train_split (0 = all): a budget's train split
    (epochs count passes over these N).
  eval_examples: evaluate on the first N examples of eval_split (0 = all).
  """
  return ml_collections.ConfigDict({
      "dataset": dataset,
      "root": root,
      "source": source,
      "train_split": train_split,
      "eval_split": eval_split,
      "options": dict(options or {}),
      "image_size": image_size,
      "batch_size": batch_size,
      "eval_batch_size": batch_size,
      "train_examples": 0,
      "eval_examples": 0,
      "crop_scale": (0.5, 1.0),
      "worker_count": 0,
      "read_threads": 1,
  })


def trainer(num_epochs: int = 30) -> ml_collections.ConfigDict:
  """Run length (num_steps > 0 overrides num_epochs) and intervals (0 = once per epoch)."""
  return ml_collections.ConfigDict({
      "num_epochs": num_epochs,
      "num_steps": 0,
      "log_every_steps": 50,
      "eval_every_steps": 0,
      "checkpoint_every_steps": 0,
      # Also save when this long passed since the last save (0 = off), agreed by every process:
      # a hard kill loses at most this much work whatever the epoch length (preemption.py).
      "checkpoint_every_minutes": 30.0,
      "keep_checkpoints": 2,
      "eval_images": 8,
      # Also evaluate the untrained model at step 0 (e.g. Stage 2's mAP before it trains).
      "eval_at_start": False,
      # > 0: at step 0 and at the last step, the gradient norm each weighted loss term sends to
      # Stage 1's prototypes (objective.term_gradient_norms), mean over this many unaugmented
      # training batches, logged as mechanism/grad_norm/<term>.
      "term_gradient_batches": 0,
      # The chance row of NMI / ARI: k-means over the keypoint positions of this many training
      # images (evaluation/position_baseline.py), scored beside the model as
      # eval/parts/position_* (0 = off).
      "position_baseline_examples": 1000,
      # A JAX profiler trace of this many steps after the first (0 = off), in WORKDIR/tensorboard.
      "profile_steps": 0,
  })


def mesh(fsdp: int = 1) -> ml_collections.ConfigDict:
  """Device mesh (training/sharding.py): data = -1 takes every device fsdp leaves; with fsdp > 1
  arrays of at least fsdp_min_size elements are split over the fsdp axis."""
  return ml_collections.ConfigDict({"data": -1, "fsdp": fsdp, "fsdp_min_size": 2 ** 18})


def shrink_for_cpu(config: ml_collections.ConfigDict, image_size: int = 32,
                   steps: int = 4) -> ml_collections.ConfigDict:
  """The `runlocal` variant of a training config: a tiny random-init backbone, 32-px images,
  batch 4, a few steps, evaluation on 8 examples. Shapes change, nothing else does."""
  config.backbone.checkpoint = ""
  config.backbone.preset = "vit_tiny_test"
  config.backbone.image_size = image_size
  config.data.image_size = image_size
  config.data.batch_size = 4
  config.data.eval_batch_size = 4
  config.data.eval_examples = 8
  config.trainer.num_steps = steps
  config.trainer.log_every_steps = 1
  config.trainer.eval_every_steps = steps
  config.trainer.checkpoint_every_steps = 2
  config.trainer.eval_images = 4
  return config


def shrink_probe_for_cpu(config: ml_collections.ConfigDict,
                         image_size: int = 32) -> ml_collections.ConfigDict:
  """The `runlocal` variant of a real dataset's probe config: 32-px images (a `runlocal`
  training workdir's backbone), no bootstrap, few causal-leakage images. With a fixture
  (`python -m metonymy.data make-fixture`) and a trained `runlocal` workdir as backbone and mask
  source, the benchmark runs end to end in seconds."""
  config.backbone.image_size = image_size
  config.data.image_size = image_size
  config.data.read_threads = 1
  config.evaluation.bootstrap = 0
  config.evaluation.leakage_images = 8
  return config


def real_data_probe(arg: str, data: ml_collections.ConfigDict, masks: ml_collections.ConfigDict,
                    *, preset: str) -> ml_collections.ConfigDict:
  """The leakage benchmark of one pretrained backbone on a real dataset (job "probe",
  configs/probe_{cub,celeba,chexpert}.py): the file gives its `data` and `masks`, the other
  blocks are the paper's protocol. The checkpoint is given on the command line; `arg` is the
  file's: `preset=NAME`, the architecture built when no checkpoint is given (tests only; `preset`
  is its default), `runlocal` (shrink_probe_for_cpu)."""
  arg = parse_arg(arg, preset=preset, runlocal=False)
  config = ml_collections.ConfigDict()
  config.job = "probe"
  config.seeds = (0,)
  config.allow_random_backbone = False  # Real data: a checkpoint must be given.
  config.backbone = backbone(preset=arg.preset, image_size=224)
  config.backbone_name = ""  # Default: the checkpoint's folder name.
  config.data = data
  config.masks = masks
  config.backbone_pretraining = backbone_pretraining()
  config.features = part_features()
  config.probe = linear_probe()
  config.evaluation = probe_evaluation()
  config.report = ml_collections.ConfigDict({"title": ""})
  if arg.runlocal:
    shrink_probe_for_cpu(config)
  return config


# The options of Stage 1 beyond K and the temperature (stage1_model), the same in both models.
STAGE1_OPTIONS = tuple(PROTOTYPE_INIT) + ("embedding_norm", "part_dropout", "evaluation_noise",
                                          "trained_tokens", "background_prototypes")


def two_stage_model(num_parts: int, mask: str, *, temperature: float = 1.0,
                    **stage2) -> ml_collections.ConfigDict:
  """The two-stage model (models/two_stage.py): Stage 1 as in `stage1_model`, then Stage 2, a
  ViT that starts from the backbone's weights, trains at the optimizer's "backbone" rate and
  sees each part through `mask` in {"soft", "hard", "ste"} (paper §4.0.2); the loss is eq. 9
  unchanged.

  hard_gradient (hard masks only; models/two_stage.py Stage2): "selected", the default, is
  Appendix F's reading: in training every layer weights a patch in its part's clique by
  a_k / SG(a_k), so the forward stays the hard one bit for bit (zero leakage) and Stage 1's
  maps get a gradient through the selected part of each patch only: Stage 2 can shrink a part,
  not grow it. It is the default because Table 3's hard row improves part discovery over
  single-stage, which needs a gradient into Stage 1. "none" is the main text's reading (§4.0.2:
  the argmax blocks the gradient): Stage 1 then learns from its own losses alone, as single-stage.
  drop_background: at inference, hard / STE Stage 2 skips the background group (bit-identical
  foreground outputs, models/block_sparse.py). attention_tiles > 0: tiled block-sparse
  attention under hard masks.

  `stage2` overrides the other options of the model.stage2 block, whose defaults are
  models/stage2_options.DEFAULTS (Stage2's own). Values are checked where the model is built
  (two_stage.Stage2), after any command-line override.
  """
  unknown = sorted(set(stage2) - set(stage2_options.DEFAULTS))
  if unknown:
    raise TypeError(f"two_stage_model got unknown Stage-2 options {unknown}; known are "
                    f"{sorted(stage2_options.DEFAULTS)}")
  model = stage1_model(num_parts, temperature)
  model.name = "two_stage"
  model.stage2 = dict(stage2_options.DEFAULTS, mask=mask, **stage2)
  return model


def two_stage(config: ml_collections.ConfigDict, variant: str,
              **stage2) -> ml_collections.ConfigDict:
  """A copy of the single-stage training `config` with the two-stage model of `variant` (a mask,
  "soft", "hard" or "ste", or another name of models/stage2_options.VARIANTS; `stage2` over its
  options) at its K and temperature in place of Stage 1 alone."""
  options = dict(stage2_options.variant(variant), **stage2)
  config = copy.deepcopy(config)  # Keeps the key order (a to_dict round trip sorts it).
  single_model = config.model
  config.model = two_stage_model(config.model.num_parts, options.pop("mask"),
                                 temperature=config.model.temperature, **options)
  for key in STAGE1_OPTIONS:  # Stage 1's start and options carry over.
    if key in single_model:
      config.model[key] = single_model[key]
  return config


# ------------------------------------------------------------------------------------------------
# Part discovery on a dataset: configs/<dataset>_single.py, its two-stage siblings
# configs/<dataset>_<mask>.py, and the demo's training runs on the synthetic world.

DINOV3_VITB16 = ("vit_b16_dinov3", "converted/dinov3_vitb16", "")

# dataset -> what its part-discovery recipe sets (configs/<dataset>_single.py's docstring says
# why): the backbone (preset, converted checkpoint, family), the input size in pixels, K, the
# evaluation split, the options of the dataset's make_source and, for `runlocal`, the options
# that shrink it. Every other block is the paper's, the same for every dataset.
PART_DISCOVERY = {
    "celeba": dict(backbone=DINOV3_VITB16, image_size=224, num_parts=8, eval_split="val"),
    "chexpert": dict(backbone=("vit_b14_reg4", "converted/rad_dino", "rad_dino"), image_size=224,
                     num_parts=8, eval_split="valid",
                     options={"uncertainty": "ignore", "frontal_only": False, "masks": False}),
    "cub": dict(backbone=DINOV3_VITB16, image_size=512, num_parts=7, eval_split="test",
                options={"ignore_not_visible": False}),
    "folder": dict(backbone=DINOV3_VITB16, image_size=224, num_parts=8, eval_split="val"),
    # The world renders at the model's resolution (options.image_size follows data.image_size,
    # also when `runlocal` shrinks it), so no resize blurs its patterns.
    "synthetic": dict(backbone=DINOV3_VITB16, image_size=224, num_parts=5, eval_split="val",
                      options={"correlation": 0.8}, renders_at_model_size=True,
                      runlocal_options={"splits": (("train", 64), ("val", 16))}),
}


def part_discovery(dataset: str, arg: str = "", variant: str = "") -> ml_collections.ConfigDict:
  """Part discovery on `dataset` (job "train"): single-stage, Stage 1 on a frozen backbone
  (variant ""), or the two-stage `variant` of it (`two_stage`), which differs in `model` only.
  `arg` is the config file's: `runlocal` shrinks the run for a CPU smoke run (shrink_for_cpu;
  a real dataset is still read from config.data.root)."""
  runlocal = parse_arg(arg, runlocal=False).runlocal
  if dataset not in PART_DISCOVERY:
    raise ValueError(f"Unknown part-discovery dataset {dataset!r}; known are "
                     f"{sorted(PART_DISCOVERY)}.")
  recipe = PART_DISCOVERY[dataset]
  preset, checkpoint, family = recipe["backbone"]
  image_size = recipe["image_size"]
  options = dict(recipe.get("options", {}))
  if recipe.get("renders_at_model_size"):
    options = {"image_size": image_size, **options}
  config = ml_collections.ConfigDict()
  config.job = "train"
  config.seed = 0
  config.backbone = backbone(preset, checkpoint=checkpoint, image_size=image_size, family=family)
  config.data = train_data(dataset, image_size=image_size, train_split="train",
                           eval_split=recipe["eval_split"], options=options)
  config.model = stage1_model(num_parts=recipe["num_parts"])
  config.loss = part_losses()
  config.optimizer = part_optimizer()
  config.trainer = trainer(num_epochs=30)
  config.mesh = mesh()
  if runlocal:
    shrink_for_cpu(config)
    if recipe.get("renders_at_model_size"):
      config.data.options.image_size = config.data.image_size
    config.data.options.update(recipe.get("runlocal_options", {}))
  return two_stage(config, variant) if variant else config
