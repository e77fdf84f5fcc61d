"""The stand-in for DINO that the demo and Table 3 start from: a tiny ViT pretrained on the world's
images (training/pretraining.py: self-supervised as DINOv2, or on image-level attributes), since
a real DINO checkpoint neither fits the synthetic world nor runs in minutes on a CPU. `pretrained_backbone` (use a given backbone, reuse
DIR/backbone, take the one shipped in metonymy/assets/ when it was made by exactly this recipe,
else pretrain one) and the demo's mode "stand_in" that remakes the shipped files."""

import datetime
import json
import os
from typing import Dict, Optional, Tuple

import jax
import ml_collections

from metonymy import console
from metonymy import loading
from metonymy import reporting
from metonymy.converters import store
from metonymy.models import vit
from metonymy.probe import benchmark
from metonymy.runs import subjobs
from metonymy.training import pretraining
from metonymy.training import self_supervised_options as ssl_options
from metonymy.workdir import layout
from metonymy.workdir import Workdir
from metonymy.workdir import writers

ASSETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets")
BACKBONE_DIR = layout.BACKBONE_DIR  # DIR/backbone: a converted backbone folder
STAND_IN_FILE = "stand_in"  # DIR/backbone/stand_in.{npz,json}: the heads and the record
# backbone_pretraining keys that do not change the weights, so not part of the recipe: a shipped
# stand-in made without them is still the one a config with them asks for.
RECIPE_FREE_KEYS = ("shipped", "evaluate_every", "checkpoint_every", "stand_in_name")
# The random stream (folded into the stage seed) that draws the register tokens a continued stage
# adds (backbone_pretraining.registers).
REGISTER_STREAM = 7


def shipped_stand_in(config, world_seed: int) -> str:
  """Path prefix of the stand-in shipped for the config's world (config.stand_in_name) and a
  world seed (it may not exist)."""
  name = config.get("stand_in_name", "demo_stand_in_world{seed}")
  return os.path.join(ASSETS, name.format(seed=int(world_seed)))


def objective_name(config) -> str:
  """The stand-in's `stand_in_objective` (configs/demo.py): attributes, self_supervised, or
  attributes_then_dense (a stage that continues another)."""
  if config.backbone_pretraining.get("start_from"):
    return "attributes_then_dense"
  return config.backbone_pretraining.get("objective", "attributes")


def dense_stages(config) -> int:
  """How many stages continue the first stand-in (configs/demo.py `dense_stages`): the length
  of the backbone_pretraining.start_from chain."""
  stages, pre = 0, config.backbone_pretraining
  while pre.get("start_from"):
    stages, pre = stages + 1, pre.start_from
  return stages


def stand_in_command(config, world) -> str:
  """The command that pretrains this stand-in anew (mode "stand_in")."""
  arg = "stand_in" + (f",world={config.world_name}" if config.get("world_name", "v1") != "v1"
                      else "")
  arg += f",stand_in_objective={objective_name(config)}"
  arg += f",registers={int(config.backbone.arch.get('num_registers', 0))}"
  stages = dense_stages(config)
  if stages > 1:  # Left out at 1, as the commands of the stand-ins shipped before it read.
    arg += f",dense_stages={stages}"
  return (f"python -m metonymy.main --config=configs/demo.py:{arg} "
          f"--config.world.seed={int(world.seed)} --workdir=DIR")


def _seed(config) -> int:
  """The stand-in's seed (its init and pretraining): config.stand_in_seed, apart from the run
  seed config.seed of the jobs trained on it."""
  return int(config.get("stand_in_seed", 0))


def _stage_seed(config, pre) -> int:
  """The seed of one pretraining stage (`pre`, a backbone_pretraining block): its own
  `stage_seed` when set (>= 0), else the stand-in's."""
  stage_seed = int(pre.get("stage_seed", -1))
  return stage_seed if stage_seed >= 0 else _seed(config)


def stand_in_recipe(config, world) -> Dict:
  """Everything the stand-in is a function of: architecture, init seed, pretraining options and
  the world its training images come from (the val/test sizes do not matter)."""
  pre = _pretraining_recipe(config.backbone_pretraining.to_dict())
  world = world.to_dict() if hasattr(world, "to_dict") else dict(world)
  world = dict(world, splits={"train": int(dict(world["splits"])["train"])})
  arch = config.backbone.arch.to_dict()
  if not arch.get("num_registers", 0):
    arch.pop("num_registers", None)  # As the stand-ins shipped before the key were recorded.
  return json.loads(json.dumps({"arch": arch, "preset":
                                config.backbone.preset, "seed": _seed(config),
                                "pretraining": pre, "world": world}))


def _pretraining_recipe(pre: Dict) -> Dict:
  """A backbone_pretraining block without the keys that do not change the weights, the stage it
  starts from (`start_from`) included."""
  pre = {k: v for k, v in pre.items() if k not in RECIPE_FREE_KEYS}
  if pre.get("stage_seed", -1) == -1:
    pre.pop("stage_seed", None)  # The stand-in's own seed, as the shipped stand-ins were made.
  if not pre.get("registers", 0):
    pre.pop("registers", None)  # The start's architecture, as the shipped stand-ins were made.
  if pre.get("objective", "attributes") == "attributes":
    # The supervised recipe as it was before the self-supervised one existed: the stand-ins
    # shipped for it keep matching.
    pre.pop("objective", None)
    pre.pop("self_supervised", None)
  elif pre.get("self_supervised"):
    pre["self_supervised"] = {k: v for k, v in pre["self_supervised"].items()
                              if ssl_options.ADDED_LATER.get(k, object()) != v}
  if pre.get("start_from"):
    pre["start_from"] = _pretraining_recipe(pre["start_from"])
  return pre


def shipped_record(config, world) -> Tuple[str, Optional[Dict], bool]:
  """(path prefix of the stand-in shipped for config's world seed, its record, whether it was made
  by exactly config's recipe). The record is None when shipping is off
  (backbone_pretraining.shipped) or no such file is shipped."""
  prefix = shipped_stand_in(config, world.seed)
  if not (config.backbone_pretraining.get("shipped") and os.path.exists(prefix + ".json")):
    return prefix, None, False
  recorded = pretraining.read_stand_in_record(prefix)
  return prefix, recorded, recorded.get("recipe") == stand_in_recipe(config, world)


def recipe_differences(shipped: Dict, wanted: Dict, prefix: str = "") -> list:
  """The dotted keys whose values differ between two recipes (either side missing counts)."""
  keys = sorted(set(shipped) | set(wanted))
  out = []
  for key in keys:
    a, b = shipped.get(key), wanted.get(key)
    if isinstance(a, dict) and isinstance(b, dict):
      out += recipe_differences(a, b, f"{prefix}{key}.")
    elif a != b:
      out.append(f"{prefix}{key}")
  return out


def pretrain(model, params, source, transforms, pre, seed: int, **kwargs):
  """training/pretraining.pretrain with the options of a `backbone_pretraining` config block
  (config_lib.backbone_pretraining); kwargs: the loop's other arguments (state, evaluation)."""
  options = {"steps": int(pre.steps), "batch_size": int(pre.batch_size),
             "learning_rate": float(pre.learning_rate), "weight_decay": float(pre.weight_decay),
             "images": int(pre.images), "loss": str(pre.loss), "augment": str(pre.augment),
             "objective": str(pre.get("objective", "attributes"))}
  if options["objective"] == "self_supervised":
    options["self_supervised_options"] = pre.self_supervised.to_dict()
  options.update(kwargs)
  return pretraining.pretrain(model, params, source, transforms, seed=seed, **options)


def pretrain_stand_in(config, world, state_dir: str = "", writer=None):
  """(vit_config, pretraining.Pretrained, record): config.backbone initialised with the stand-in
  seed (config.stand_in_seed) and pretrained on the world's training split
  (training/pretraining.py). With `state_dir`, each stage saves its state in a folder of it every
  backbone_pretraining.checkpoint_every steps, and a rerun resumes there; `writer`
  (training/writers.MetricWriter) takes the main stage's loss terms and quality curve."""
  pre = config.backbone_pretraining
  options = {"checkpoint_every": int(pre.get("checkpoint_every", 0))} if state_dir else {}
  stage_dir = lambda stage: os.path.join(state_dir, stage) if state_dir else ""
  heads, record = None, {}
  if pre.get("start_from"):
    # A stand-in that continues another one: that one first (shipped or pretrained here).
    vit_config, params, heads, start_record = start_stand_in(config, world, stage_dir("start"))
    registers = int(pre.get("registers", 0))
    if registers:
      # Drawn from the stage's seed, so each stage seed is a run of its own and a resumed
      # stage redraws the same tokens before its saved state replaces them.
      vit_config, params = vit.with_registers(
          vit_config, params, registers,
          jax.random.fold_in(jax.random.PRNGKey(_stage_seed(config, pre)), REGISTER_STREAM))
      console.console(f"[demo] the continued stage adds {registers} register tokens")
    model = vit.VisionTransformer(vit_config)
    record["start"] = start_record
  else:
    if int(pre.get("registers", 0)):
      raise ValueError(
          f"backbone_pretraining.registers={int(pre.registers)} adds register tokens to the "
          "stand-in a stage continues (backbone_pretraining.start_from), and this stage "
          "continues none: registers from the first step are the demo's `registers=N` "
          "(backbone.arch.num_registers).")
    model, params, vit_config = loading.build_backbone(config.backbone, _seed(config))
  warmup_steps = int(pre.get("warmup_steps", 0))
  if warmup_steps:
    # A first stage on a sibling world (e.g. every pixel of a part showing its attributes): a
    # world whose evidence is small leaves the loss on the constant predictor's plateau for
    # hundreds of steps (docs/experiments.md, "The world"); image-level labels only, as after.
    warm_world = ml_collections.ConfigDict(world.to_dict())
    warm_world.update(pre.warmup_world.to_dict())
    warm_source, transforms = _training_images(config, warm_world, vit_config)
    console.console(f"[demo] warm-up: {warmup_steps} pretraining steps on the world with "
                    f"{pre.warmup_world.to_dict()}")
    warm_pre = ml_collections.ConfigDict(pre.to_dict())
    warm_pre.steps = warmup_steps
    warm = pretrain(model, params, warm_source, transforms, warm_pre, _stage_seed(config, pre),
                    state_dir=stage_dir("warmup"), **options)
    params, heads = warm.params, warm.heads
    record["warmup_loss_history"] = warm.loss_history
  source, transforms = _training_images(config, world, vit_config)

  def evaluate(step, params, heads):
    quality = stand_in_quality(config, world, vit_config, params, heads)
    blocks = " / ".join(reporting.fmt(quality.get(f"kmeans_fg/NMI/block{b + 1}"), 1)
                        for b in range(vit_config.depth))
    console.console(f"[demo] stand-in at step {step}, on val: k-means fg NMI "
                    f"{reporting.fmt(quality.get('kmeans_fg/NMI'), 1)} (blocks {blocks}; position "
                    f"alone {reporting.fmt(quality.get('position_fg/NMI'), 1)}), a patch's part "
                    f"{reporting.fmt(quality.get('part_probe/balanced_accuracy'))}, CLS attribute "
                    f"probe mAP {reporting.fmt(quality.get('cls_probe/mAP'))} (pooled patch "
                    f"tokens {reporting.fmt(quality.get('pooled_probe/mAP'))})")
    return quality

  console.console(f"[demo] pretraining a ViT (patch {vit_config.patch_size}, width "
                  f"{vit_config.width}, depth {vit_config.depth}) at {vit_config.image_size} px "
                  f"for {int(pre.steps)} steps on {min(int(pre.images), len(source))} training "
                  "images")
  trained = pretrain(model, params, source, transforms, pre, _stage_seed(config, pre),
                     heads=heads, evaluate=evaluate,
                     evaluate_every=int(pre.get("evaluate_every", 0)),
                     state_dir=stage_dir("main"), writer=writer, **options)
  if trained.evaluations:
    record["quality_curve"] = [[int(step), quality] for step, quality in trained.evaluations]
  record.update({"recipe": stand_in_recipe(config, world),
            "command": stand_in_command(config, world),
            "date": datetime.datetime.now().isoformat(timespec="seconds")})
  return vit_config, trained, record


def start_config(config) -> ml_collections.ConfigDict:
  """The config of the stand-in `config`'s stand-in starts from (backbone_pretraining.start_from):
  the same world, architecture and seed, that stage's pretraining and shipped name."""
  start = ml_collections.ConfigDict(config.to_dict())
  block = config.backbone_pretraining.start_from.to_dict()
  start.stand_in_name = block.pop("stand_in_name", start.stand_in_name)
  start.backbone_pretraining = ml_collections.ConfigDict(block)
  return start


def start_stand_in(config, world, state_dir: str = "") -> Tuple:
  """(vit_config, params, heads, record) of the stand-in `config`'s continues: shipped in
  metonymy/assets/ when made by exactly its recipe, else pretrained here. Its attribute heads go
  on learning where the continuing stage has an attribute term."""
  start = start_config(config)
  shipped, _, matches = shipped_record(start, world)
  if matches:
    vit_config, params, heads, _ = pretraining.load_stand_in(shipped)
    console.console(f"[demo] continuing the stand-in shipped in {shipped}.npz")
    return vit_config, params, heads, {"source": os.path.relpath(shipped, ASSETS)}
  console.console("[demo] pretraining the stand-in this one continues "
                  f"({stand_in_command(start, world)})")
  vit_config, trained, record = pretrain_stand_in(start, world, state_dir)
  return vit_config, trained.params, trained.heads, {"source": "pretrained in this run",
                                                      "seconds": trained.seconds}


def _training_images(config, world, vit_config):
  """(the world's training split, the stand-in's transforms), as the benchmark reads them."""
  data_cfg = subjobs.with_world(config.benchmark, world).data
  source, _, _ = benchmark.open_split(data_cfg, data_cfg.train, 0)
  return source, benchmark.eval_transforms(vit_config, data_cfg)


def stand_in_quality(config, world, vit_config, params, heads) -> Dict:
  """On the world's `val` images: the stand-in's own attribute mAP (CLS head, part read-out
  head; supervised stand-ins only) beside the constant predictor's, and how its tokens hold the
  parts and the attributes (`pretraining.part_legibility`: k-means per block, the position-only
  k-means, the patch-part probe, the attribute probes on the CLS token and the pooled patch
  tokens)."""
  data_cfg = subjobs.with_world(config.benchmark, world).data
  # The world's own val split, whatever the benchmark's probes use it for (`split=val` of the
  # Table-3 job scores the probes on it and leaves benchmark.data.val empty).
  source, _, _ = benchmark.open_split(data_cfg, "val", 0)
  model = vit.VisionTransformer(vit_config)
  transforms = benchmark.eval_transforms(vit_config, data_cfg)
  # A self-supervised stand-in has no attribute heads; the CLS probe measures it instead.
  quality = (pretraining.head_quality(model, params, heads, source, transforms)
             if heads else {})
  legibility = pretraining.part_legibility(model, params, source, transforms,
                                           seed=_seed(config))
  quality.update(legibility or {})
  return quality


def pretrained_backbone(config, workdir, world) -> Tuple[str, Optional[Dict]]:
  """Step 1: (the converted backbone folder the rest of the demo uses, its record or None).

  A given checkpoint (config.benchmark.backbone.checkpoint) is used as is. Otherwise the stand-in
  is DIR/backbone when present (a rerun), else the shipped one when made by this very recipe
  (config.backbone_pretraining.shipped), else pretrained here; its record (recipe, loss curve,
  and its quality on `val`, measured in this run) goes beside it.
  """

  given = config.benchmark.backbone.checkpoint
  if given:
    if not os.path.exists(given):
      raise FileNotFoundError(f"config.benchmark.backbone.checkpoint={given!r} does not exist.")
    console.console(f"[demo] using the given backbone {given}; no pretraining")
    return given, None
  path = os.fspath(Workdir(workdir).backbone)
  prefix = os.path.join(path, STAND_IN_FILE)
  if store.is_converted(path) and os.path.exists(prefix + ".json"):
    console.console(f"[demo] reusing the backbone pretrained earlier in {path}")
    vit_config, params, heads, record = pretraining.load_stand_in(prefix)
  else:
    shipped, recorded, matches = shipped_record(config, world)
    record = None
    if recorded is not None:
      if matches:
        vit_config, params, heads, record = pretraining.load_stand_in(shipped)
        console.console(f"[demo] using the stand-in shipped in {shipped}.npz (made by this recipe: "
                        f"{record['command']})")
        record = dict(record, source=os.path.relpath(shipped, ASSETS))
      else:
        differ = recipe_differences(recorded.get("recipe") or {},
                                    stand_in_recipe(config, world))
        console.console(f"[demo] the shipped stand-in {shipped} was made by another recipe "
                        f"(it differs in {', '.join(differ[:6]) or 'its format'}); pretraining "
                        f"one here, as it took {float(recorded.get('seconds', 0)) / 60:.0f} min "
                        "on its machine (--config.benchmark.backbone.checkpoint=DIR uses one "
                        "you have)")
    elif config.backbone_pretraining.get("shipped"):
      console.console(f"[demo] no stand-in is shipped as {shipped}.npz for this recipe; "
                      f"pretraining one here ({int(config.backbone_pretraining.steps)} steps; "
                      "--config.benchmark.backbone.checkpoint=DIR uses one you have)")
    if record is None:
      vit_config, trained, record = pretrain_stand_in(config, world)
      params, heads = trained.params, trained.heads
      record["source"] = "pretrained in this run"
    quality = stand_in_quality(config, world, vit_config, params, heads)
    record = dict(record, quality_val=quality)
    store.save_converted(path, vit_config, params, source=f"demo stand-in: {record['source']}")
    trained = pretraining.Pretrained(params, heads, record.pop("loss_history", []),
                                  record.pop("seconds", 0.0))
    pretraining.save_stand_in(prefix, vit_config, trained, record)
    console.console(f"[demo] saved the backbone to {path} (a converted folder: "
                    f"--config.backbone.checkpoint={path} works in every config)")
  quality = record.get("quality_val") or {}
  console.console(f"[demo] the stand-in on val: k-means of its last block's foreground tokens "
                  f"NMI {reporting.fmt(quality.get('kmeans_fg/NMI'), 1)} (position alone "
                  f"{reporting.fmt(quality.get('position_fg/NMI'), 1)}), CLS attribute probe mAP "
                  f"{reporting.fmt(quality.get('cls_probe/mAP'))} (constant predictor "
                  f"{reporting.fmt(quality.get('cls_probe/chance'))})")
  return path, record


def run_stand_in(config, workdir: str) -> Dict:
  """Mode "stand_in": pretrain the stand-in anew and write it to config.stand_in_output."""
  if not config.stand_in_output:
    raise ValueError("mode 'stand_in' needs config.stand_in_output (a path prefix).")
  world = config.world
  # A killed run resumes from here (~50 min of pretraining for v3 on 2 CPU cores); a local
  # workdir only (the stand-in itself is written to a local path too).
  files = Workdir(workdir)
  state_dir = (os.path.join(os.fspath(files.path), "pretraining_state")
               if layout.is_local(files.path) else "")
  # TensorBoard (`tensorboard --logdir DIR`): the loss terms and the quality curve.
  writer = writers.MetricWriter(files)
  try:
    vit_config, trained, record = pretrain_stand_in(config, world, state_dir, writer)
  finally:
    writer.close()
  record["quality_val"] = stand_in_quality(config, world, vit_config, trained.params,
                                           trained.heads)
  prefix = config.stand_in_output.format(seed=int(world.seed))
  written = pretraining.save_stand_in(prefix, vit_config, trained, record)
  console.console(f"[demo] wrote {', '.join(written)}; quality on val {record['quality_val']}")
  return record
