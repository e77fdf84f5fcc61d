"""The demo job (`job = "demo"`): the paper's story end to end on the synthetic parts world.

  python -m metonymy.main --config=configs/demo.py --workdir=DIR                    # mode "story"
  python -m metonymy.main --config=configs/demo_correlation_sweep.py --workdir=DIR  # the sweep

Story (configs/demo.py), on the world of `config.world` (cross-part correlation 0; its seed,
config.world.seed, draws every image of every step):
  1. the stand-in for DINO: a tiny ViT pretrained on the world's attributes (probe/pretrain.py;
     image-level labels only). The one shipped in metonymy/assets/ for this world seed is used
     when it was made by exactly this recipe (mode "stand_in" remakes it), else it is pretrained
     here; its own attribute mAP on `val` is measured in this run. Saved as a converted backbone
     folder, DIR/backbone (checkpoints/store.py), with the heads and the record beside it. Skipped
     when config.benchmark.backbone.checkpoint is given; reused when DIR/backbone holds one;
  2. the leakage benchmark of it, ground-truth masks, late vs early masking: the probe job in
     DIR/benchmark (its own report.md / results.json / PNGs);
  3. single-stage and two-stage STE part discovery from it: the train job in DIR/single and
     DIR/two_stage_ste (metrics.jsonl, images/);
  4. DIR/report.md and DIR/results.json gathering the numbers (part shares and a collapse warning
     included), with the sub-jobs' figures linked; with config.readme=PATH, the results table
     also replaces the block between README_BEGIN / README_END in that file (world seed 0 only),
     and this world seed's row of the SEEDS_BEGIN / SEEDS_END table.

Correlation sweep (configs/demo_correlation_sweep.py): one backbone pretrained as in step 1, then
the benchmark of it on worlds whose correlation runs over config.sweep.correlations (each in
DIR/correlation_<c>), and a plot of PS against correlation for late and early masking
(DIR/ps_vs_correlation.png), a table (DIR/report.md) and DIR/results.json. The backbone is held
fixed on purpose: only the data's real cross-part correlation changes, so the fall of early PS
with correlation is real correlation, and the gap between late and early at correlation 0 is
leakage.

Every number written is the one measured in this run; nothing is tuned to a story.
"""

import datetime
import json
import math
import os
import platform
import time
from typing import Dict, List, Optional, Tuple

import ml_collections
import numpy as np

README_BEGIN = "<!-- demo:results:begin -->"
README_END = "<!-- demo:results:end -->"
# One row per world seed, each written by the demo run on that world.
SEEDS_BEGIN = "<!-- demo:seeds:begin -->"
SEEDS_END = "<!-- demo:seeds:end -->"
SEEDS_HEADER = ["world seed", "stand-in CLS mAP (val)", "PS late / early", "single mAP",
                "single NMI / ARI", "two-stage STE stage-2 mAP", "ensemble mAP",
                "two-stage NMI / ARI", "largest part share (single / two-stage)",
                "chance mAP", "wall time"]
BACKBONE_DIR = "backbone"
BENCHMARK_DIR = "benchmark"
TRAIN_DIRS = {"single": "single", "two_stage": "two_stage_ste"}


def run(config, workdir: str) -> Dict:
  mode = config.get("mode", "story")
  if mode == "story":
    return run_story(config, workdir)
  if mode == "correlation_sweep":
    return run_sweep(config, workdir)
  if mode == "stand_in":
    return run_stand_in(config, workdir)
  raise ValueError(f"config.mode must be 'story', 'correlation_sweep' or 'stand_in', got "
                   f"{mode!r}")


# ------------------------------------------------------------------------------------------------
# Progress.


class _Steps:
  """One console line per step with the elapsed time, so a newcomer sees where the run is."""

  def __init__(self, total: int):
    self.total, self.index, self.start = total, 0, time.perf_counter()
    self.seconds: Dict[str, float] = {}
    self._name, self._began = None, None

  def begin(self, name: str, what: str) -> None:
    self._close()
    self.index += 1
    self._name, self._began = name, time.perf_counter()
    print(f"\n[demo] ({self.index}/{self.total}) {what}  [{self.elapsed():.0f} s elapsed]",
          flush=True)

  def _close(self) -> None:
    if self._name is not None:
      self.seconds[self._name] = time.perf_counter() - self._began
      print(f"[demo] {self._name} done in {self.seconds[self._name]:.0f} s", flush=True)
      self._name = None

  def finish(self) -> Dict[str, float]:
    self._close()
    self.seconds["total"] = self.elapsed()
    return self.seconds

  def elapsed(self) -> float:
    return time.perf_counter() - self.start


# ------------------------------------------------------------------------------------------------
# Steps.


def _with_world(sub: ml_collections.ConfigDict, world) -> ml_collections.ConfigDict:
  """A copy of a sub-job config whose dataset options are `world` (one source of truth)."""
  sub = ml_collections.ConfigDict(sub.to_dict())
  sub.data.options = world.to_dict() if hasattr(world, "to_dict") else dict(world)
  return sub


ASSETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets")
STAND_IN_FILE = "stand_in"  # DIR/backbone/stand_in.{npz,json}: the heads and the record


def shipped_stand_in(world_seed: int) -> str:
  """Path prefix of the stand-in shipped for a world seed (it may not exist)."""
  return os.path.join(ASSETS, f"demo_stand_in_world{int(world_seed)}")


def stand_in_recipe(config, world) -> Dict:
  """Everything the stand-in is a function of: architecture, init seed, pretraining options and
  the world its training images come from (the val/test sizes do not matter)."""
  pre = {k: v for k, v in config.backbone_pretraining.to_dict().items() if k != "shipped"}
  world = world.to_dict() if hasattr(world, "to_dict") else dict(world)
  world = dict(world, splits={"train": int(dict(world["splits"])["train"])})
  return json.loads(json.dumps({"arch": config.backbone.arch.to_dict(), "preset":
                                config.backbone.preset, "seed": int(config.seed),
                                "pretraining": pre, "world": world}))


def pretrain_stand_in(config, world):
  """(vit_config, pretrain.Pretrained, record): config.backbone initialised with config.seed and
  pretrained on the world's training split (probe/pretrain.py)."""
  from metonymy import loading
  from metonymy.probe import benchmark
  from metonymy.probe import job as probe_job
  from metonymy.probe import pretrain
  model, params, vit_config = loading.build_backbone(config.backbone, int(config.seed))
  pre = config.backbone_pretraining
  data_cfg = _with_world(config.benchmark, world).data
  source, _, _ = benchmark.open_split(data_cfg, data_cfg.train, 0)
  print(f"[demo] pretraining a ViT (patch {vit_config.patch_size}, width {vit_config.width}, "
        f"depth {vit_config.depth}) at {vit_config.image_size} px for {int(pre.steps)} steps on "
        f"{min(int(pre.images), len(source))} training images", flush=True)
  transforms = benchmark.eval_transforms(vit_config, data_cfg)
  trained = pretrain.pretrain(model, params, source, transforms, seed=int(config.seed),
                              **probe_job.pretrain_options(pre))
  record = {"recipe": stand_in_recipe(config, world),
            "command": "python -m metonymy.main --config=configs/demo.py:stand_in "
                       f"--config.world.seed={int(world.seed)} --workdir=DIR",
            "date": datetime.datetime.now().isoformat(timespec="seconds")}
  return vit_config, trained, record


def stand_in_quality(config, world, vit_config, params, heads) -> Dict:
  """The stand-in's own attribute mAP (CLS head, part read-out head) on the world's `val`
  images, beside the constant predictor's, and how legible part identity is in its patch tokens
  (`pretrain.part_legibility`)."""
  from metonymy.models import vit
  from metonymy.probe import benchmark
  from metonymy.probe import pretrain
  data_cfg = _with_world(config.benchmark, world).data
  source, _, _ = benchmark.open_split(data_cfg, data_cfg.val, 0)
  model = vit.VisionTransformer(vit_config)
  transforms = benchmark.eval_transforms(vit_config, data_cfg)
  quality = pretrain.head_quality(model, params, heads, source, transforms)
  legibility = pretrain.part_legibility(model, params, source, transforms,
                                        seed=int(config.seed))
  quality.update(legibility or {})
  return quality


def pretrained_backbone(config, workdir: str, world) -> Tuple[str, Optional[Dict]]:
  """Step 1: (the converted backbone folder the rest of the demo uses, its record or None).

  A given checkpoint (config.benchmark.backbone.checkpoint) is used as is. Otherwise the stand-in
  is DIR/backbone when present (a rerun), else the shipped one when made by this very recipe
  (config.backbone_pretraining.shipped), else pretrained here; its record (recipe, loss curve,
  and its quality on `val`, measured in this run) goes beside it.
  """
  from metonymy.checkpoints import store
  from metonymy.probe import pretrain

  given = config.benchmark.backbone.checkpoint
  if given:
    if not os.path.exists(given):
      raise FileNotFoundError(f"config.benchmark.backbone.checkpoint={given!r} does not exist.")
    print(f"[demo] using the given backbone {given}; no pretraining", flush=True)
    return given, None
  path = os.path.join(workdir, BACKBONE_DIR)
  prefix = os.path.join(path, STAND_IN_FILE)
  recipe = stand_in_recipe(config, world)
  if store.is_converted(path) and os.path.exists(prefix + ".json"):
    print(f"[demo] reusing the backbone pretrained earlier in {path}", flush=True)
    vit_config, params, heads, record = pretrain.load_stand_in(prefix)
  else:
    shipped = shipped_stand_in(world.seed)
    record = None
    if config.backbone_pretraining.get("shipped") and os.path.exists(shipped + ".json"):
      if pretrain.read_stand_in_record(shipped).get("recipe") == recipe:
        vit_config, params, heads, record = pretrain.load_stand_in(shipped)
        print(f"[demo] using the stand-in shipped in {shipped}.npz (made by this recipe: "
              f"{record['command']})", flush=True)
        record = dict(record, source=os.path.relpath(shipped, ASSETS))
      else:
        print(f"[demo] the shipped stand-in {shipped} was made by another recipe; "
              "pretraining one here", flush=True)
    if record is None:
      vit_config, trained, record = pretrain_stand_in(config, world)
      params, heads = trained.params, trained.heads
      record["source"] = "pretrained in this run"
    quality = stand_in_quality(config, world, vit_config, params, heads)
    record = dict(record, quality_val=quality)
    store.save_converted(path, vit_config, params, source=f"demo stand-in: {record['source']}")
    trained = pretrain.Pretrained(params, heads, record.pop("loss_history", []),
                                  record.pop("seconds", 0.0))
    pretrain.save_stand_in(prefix, vit_config, trained, record)
    print(f"[demo] saved the backbone to {path} (a converted folder: "
          f"--config.backbone.checkpoint={path} works in every config)", flush=True)
  quality = record.get("quality_val") or {}
  print(f"[demo] the stand-in's own attribute mAP on val: CLS head "
        f"{_fmt(quality.get('cls/mAP'))}, part read-out {_fmt(quality.get('parts/mAP'))} "
        f"(constant predictor {_fmt(quality.get('chance/mAP'))})", flush=True)
  return path, record


def run_stand_in(config, workdir: str) -> Dict:
  """Mode "stand_in": pretrain the stand-in anew and write it to config.stand_in_output."""
  from metonymy.probe import pretrain
  if not config.stand_in_output:
    raise ValueError("mode 'stand_in' needs config.stand_in_output (a path prefix).")
  world = config.world
  vit_config, trained, record = pretrain_stand_in(config, world)
  record["quality_val"] = stand_in_quality(config, world, vit_config, trained.params,
                                           trained.heads)
  prefix = config.stand_in_output.format(seed=int(world.seed))
  written = pretrain.save_stand_in(prefix, vit_config, trained, record)
  print(f"[demo] wrote {', '.join(written)}; quality on val {record['quality_val']}", flush=True)
  return record


def run_benchmark(config, backbone: str, workdir: str, world, title: str = "") -> Dict:
  """Step 2: the probe job on `backbone`; returns its results.json object."""
  from metonymy import probe
  sub = _with_world(config.benchmark, world)
  sub.backbone.checkpoint = os.path.abspath(backbone)
  sub.backbone_pretraining.steps = 0  # the probe job pretrains random-init backbones only
  if title:
    sub.report.title = title
  os.makedirs(workdir, exist_ok=True)
  _write_config(sub, workdir)
  return probe.run(sub, workdir)


def run_training(sub, backbone: str, workdir: str, world) -> Dict[str, float]:
  """Step 3: the train job from `backbone`; returns the last evaluation's scalars (read back
  from metrics.jsonl, so a rerun that finds the run complete still reports them)."""
  from metonymy.training import trainer
  sub = _with_world(sub, world)
  sub.backbone.checkpoint = os.path.abspath(backbone)
  os.makedirs(workdir, exist_ok=True)
  _write_config(sub, workdir)
  trainer.run(sub, workdir)
  return last_eval(workdir)


def last_eval(workdir: str) -> Dict[str, float]:
  """{"<head>/mAP": ..., "parts/NMI": ..., "step": s}: the latest `eval/` record of a train
  workdir's metrics.jsonl (the prefix dropped); non-finite values (stored as strings) -> NaN."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} not found: the training run in {workdir} wrote no metrics.")
  latest: Dict[str, float] = {}
  with open(path) as f:
    for line in f:
      record = json.loads(line)
      values = {k[len("eval/"):]: _float(v) for k, v in record.items() if k.startswith("eval/")}
      if values:
        latest = dict(values, step=int(record["step"]))
  if not latest:
    raise ValueError(f"{path} holds no evaluation: the run in {workdir} never evaluated.")
  return latest


def evaluated_examples(data_cfg):
  """(source, count): the split a train job evaluates on (`eval_split`) and how many of its first
  examples it scores (`eval_examples`, 0 = all)."""
  from metonymy import data as data_lib
  options = data_cfg.options.to_dict() if hasattr(data_cfg.options, "to_dict") else dict(
      data_cfg.options)
  source = data_lib.make_source(data_cfg.dataset, data_cfg.root or None, data_cfg.eval_split,
                                **options)
  return source, min(len(source), int(data_cfg.eval_examples) or len(source))


# The part-shaping priors that depend on the maps alone: objective.loss_fn's term name -> the
# function in metonymy/training/losses.py.
MAP_PRIORS = {"total_variation": "total_variation", "foreground_presence": "foreground_presence",
              "background_presence": "background_presence", "entropy": "pixel_entropy"}


def priors_of_the_truth(data_cfg, patch_size: int) -> Dict[str, float]:
  """What the part-shaping priors charge the ground-truth segmentation: the world's part labels
  on the patch grid (plurality per patch) as one-hot maps [B, K+1, h, w] (background last), for
  the first `eval_examples` of `data_cfg.eval_split`, scored in batches of the training batch size
  (the presence priors take a max over the batch) and averaged. A diagnostic only: compared with
  the trained maps' values (`last_train_losses`), it says whether the priors, at this patch grid,
  prefer the true parts to what Stage 1 found."""
  import jax
  from metonymy.training import losses
  from metonymy.probe import masks
  source, count = evaluated_examples(data_cfg)
  num_parts = len(source.info.part_names)
  labels = masks.segmentation_part_labels(
      np.stack([source[i]["part_segmentation"] for i in range(count)]), num_parts)
  ids, _ = masks.patch_part_ids(labels, num_parts, patch_size)
  maps = np.moveaxis(np.eye(num_parts + 1, dtype=np.float32)[ids], -1, 1)
  batch = int(data_cfg.batch_size)
  chunks = [maps[i:i + batch] for i in range(0, count - batch + 1, batch)] or [maps]
  return {name: float(np.mean([jax.device_get(getattr(losses, function)(chunk))
                               for chunk in chunks]))
          for name, function in MAP_PRIORS.items()}


def last_train_losses(workdir: str) -> Dict[str, float]:
  """{"<term>": value}: the unweighted loss terms (`loss/<term>`) of the latest training record
  of a train workdir's metrics.jsonl."""
  latest: Dict[str, float] = {}
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      record = json.loads(line)
      terms = {k[len("loss/"):]: _float(v) for k, v in record.items() if k.startswith("loss/")}
      if terms:
        latest = terms
  return latest


def prior_costs(config, backbone: str, workdir: str, world) -> Optional[Dict[str, Dict]]:
  """{"truth" | "single" | "two_stage_ste": {prior: value}}: the map priors of the ground truth
  on the backbone's patch grid, and of each trained model's last training batch. None when the
  backbone's patch size is unknown (not a converted ViT folder)."""
  from metonymy.checkpoints import store
  try:
    with open(os.path.join(backbone, store.ARCH_FILE)) as f:
      patch_size = int(json.load(f)["vit_config"]["patch_size"])
  except (OSError, KeyError, ValueError):
    return None
  costs = {"truth": priors_of_the_truth(_with_world(config.single, world).data, patch_size)}
  for key, directory in TRAIN_DIRS.items():
    trained = last_train_losses(os.path.join(workdir, directory))
    costs["single" if key == "single" else "two_stage_ste"] = {
        name: trained.get(name) for name in MAP_PRIORS}
  return costs


def chance_map(data_cfg) -> Optional[float]:
  """mAP of a constant predictor on the evaluation images the train job scores (the first
  `eval_examples` of `eval_split`): a constant score's AP is the attribute's positive rate, so
  this is the mean positive rate over attributes with a positive, the floor to read mAP against."""
  source, count = evaluated_examples(data_cfg)
  labels = np.stack([np.asarray(source[i]["attributes"], np.float64) for i in range(count)])
  valid = np.stack([np.asarray(source[i]["attribute_valid"], bool) for i in range(count)])
  positives, total = (labels * valid).sum(0), valid.sum(0)
  keep = positives > 0
  return float(np.mean(positives[keep] / total[keep])) if keep.any() else None


def _float(value) -> float:
  try:
    return float(value)
  except (TypeError, ValueError):
    return float("nan")


def _write_config(sub, workdir: str) -> None:
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(sub.to_json_best_effort(indent=2))


# ------------------------------------------------------------------------------------------------
# The story.


def run_story(config, workdir: str) -> Dict:
  steps = _Steps(4)
  world = config.world
  os.makedirs(workdir, exist_ok=True)
  print(f"[demo] the synthetic parts world at {world.image_size} px, cross-part correlation "
        f"{world.correlation:g}, splits {dict(world.splits)}; outputs in {workdir}", flush=True)

  steps.begin("pretrain", "pretraining the stand-in for DINO")
  backbone, stand_in = pretrained_backbone(config, workdir, world)

  steps.begin("benchmark", "leakage benchmark: ground-truth part masks, late vs early masking")
  bench = run_benchmark(config, backbone, os.path.join(workdir, BENCHMARK_DIR), world)

  steps.begin("part_discovery", "part discovery: single-stage, then two-stage STE")
  trained = {}
  for key, sub in (("single", config.single), ("two_stage", config.two_stage)):
    print(f"[demo] training {key} ({sub.model.name}"
          f"{', ' + sub.model.stage2.mask if 'stage2' in sub.model else ''}) for "
          f"{sub.trainer.num_steps} steps at batch {sub.data.batch_size}", flush=True)
    trained[key] = run_training(sub, backbone, os.path.join(workdir, TRAIN_DIRS[key]), world)

  steps.begin("report", "writing report.md and results.json")
  chance = chance_map(_with_world(config.single, world).data)
  priors = prior_costs(config, backbone, workdir, world)
  seconds = steps.finish()
  results = story_results(config, backbone, stand_in, bench, trained, seconds)
  results["part_discovery"]["chance_mAP"] = chance
  results["part_discovery"]["priors"] = priors
  results["summary"]["map_chance"] = chance
  written = write_story(workdir, config, results)
  if config.readme:
    if int(world.seed) == 0:  # The headline block is the default world's.
      update_readme(config.readme, readme_block(results))
    update_readme_seed_row(config.readme, results)
    written.append(config.readme)
  print(f"[demo] done in {seconds['total']:.0f} s; wrote " + ", ".join(written), flush=True)
  print(summary_line(results), flush=True)
  for line in collapse_warnings(results):
    print(f"[demo] WARNING: {line}", flush=True)
  return results


def _pick(d: Dict, key: str) -> Optional[float]:
  v = d.get(key)
  return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else v


def _part_discovery(scalars: Dict[str, float]) -> Dict:
  heads = sorted({k.split("/")[0] for k in scalars if k.endswith("/mAP")})
  out = {"step": scalars.get("step"),
         "mAP": {h: _pick(scalars, f"{h}/mAP") for h in heads},
         "AUROC": {h: _pick(scalars, f"{h}/AUROC") for h in heads}}
  for k in ("NMI", "ARI", "NMI_fg", "ARI_fg"):
    out[k] = _pick(scalars, f"parts/{k}")
  out["num_examples"] = scalars.get("num_examples")
  # Collapse watch (training/evaluate.py): each part's share of the evaluation patches.
  shares = sorted((int(k.split("/")[1]), v) for k, v in scalars.items()
                  if k.startswith("part_share/") and k.split("/")[1].isdigit())
  out["part_share"] = [v for _, v in shares]
  out["max_part_share"] = _pick(scalars, "part_share/max")
  out["empty_parts"] = _pick(scalars, "part_share/num_empty")
  out["collapsed"] = bool(scalars.get("collapsed", 0.0))
  return out


def collapse_warnings(results: Dict) -> List[str]:
  """One line per part-discovery model whose evaluation flagged a collapse."""
  lines = []
  for key, name in (("single", "single-stage"), ("two_stage_ste", "two-stage STE")):
    r = results["part_discovery"][key]
    if r.get("collapsed"):
      shares = r.get("part_share") or []
      lines.append(f"**Collapse** ({name}): a part holds {_fmt(r.get('max_part_share'))} of the "
                   f"evaluation patches or a part is empty ({_int(r.get('empty_parts'))} empty); "
                   f"shares (background last): {', '.join(_fmt(v, 2) for v in shares)}.")
  return lines


def story_results(config, backbone: str, stand_in: Optional[Dict], bench: Dict,
                  trained: Dict[str, Dict], seconds: Dict[str, float]) -> Dict:
  """The results.json object: world, backbone, benchmark, part discovery, timing."""
  bench_keys = ("ps_late", "ps_early", "ps_gap", "causal_leakage_late", "causal_leakage_early",
                "mppo_late", "mppo_early", "nmi_with_background", "ari_with_background")
  benchmark = {k: bench.get(k) for k in bench_keys if k in bench}
  benchmark.update({f"{k}_ci": bench[f"{k}_ci"] for k in bench_keys if f"{k}_ci" in bench})
  first = bench["backbones"][bench["backbone"]]["seeds"][0]
  benchmark.update({"map_matrix_late": bench.get("map_matrix_late"),
                    "map_matrix_early": bench.get("map_matrix_early"),
                    "part_names": first.get("part_names"), "groups": first.get("groups"),
                    "num_train": first.get("num_train"), "num_val": first.get("num_val"),
                    "num_test": first.get("num_test")})
  single = _part_discovery(trained["single"])
  two = _part_discovery(trained["two_stage"])
  pretrained_here = not config.benchmark.backbone.checkpoint
  return {
      "job": "demo",
      "world": config.world.to_dict(),
      "backbone": {"path": os.path.abspath(backbone),
                   "arch": config.backbone.arch.to_dict() if pretrained_here else None,
                   "pretraining_steps": (int(config.backbone_pretraining.steps)
                                         if pretrained_here else None),
                   "source": (stand_in or {}).get("source"),
                   "quality_val": (stand_in or {}).get("quality_val")},
      "benchmark": benchmark,
      "part_discovery": {
          "single": single, "two_stage_ste": two,
          "eval_split": config.single.data.eval_split,
          "train_steps": {"single": int(config.single.trainer.num_steps),
                          "two_stage_ste": int(config.two_stage.trainer.num_steps)}},
      # The headline numbers, flat: what README's table shows.
      "summary": {
          "ps_late": benchmark.get("ps_late"), "ps_early": benchmark.get("ps_early"),
          "causal_leakage_late": benchmark.get("causal_leakage_late"),
          "causal_leakage_early": benchmark.get("causal_leakage_early"),
          "map_single": single["mAP"].get("stage1"),
          "map_two_stage_stage1": two["mAP"].get("stage1"),
          "map_two_stage_stage2": two["mAP"].get("stage2"),
          "map_two_stage_ensemble": two["mAP"].get("ensemble"),
          "nmi_single": single["NMI"], "ari_single": single["ARI"],
          "nmi_two_stage": two["NMI"], "ari_two_stage": two["ARI"],
          "nmi_fg_single": single["NMI_fg"], "ari_fg_single": single["ARI_fg"],
          "nmi_fg_two_stage": two["NMI_fg"], "ari_fg_two_stage": two["ARI_fg"],
          "max_part_share_single": single["max_part_share"],
          "max_part_share_two_stage": two["max_part_share"],
          "collapsed": single["collapsed"] or two["collapsed"],
          "stand_in_cls_map_val": ((stand_in or {}).get("quality_val") or {}).get("cls/mAP")},
      "seconds": seconds,
      "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                  "backend": _backend()},
      "date": datetime.datetime.now().isoformat(timespec="seconds"),
  }


def _backend() -> str:
  import jax
  return f"{jax.default_backend()} x {jax.device_count()}"


def _fmt(value, digits: int = 3) -> str:
  if value is None or (isinstance(value, float) and not math.isfinite(value)):
    return "n/a"
  return f"{value:.{digits}f}"


def _with_ci(results_block: Dict, key: str, digits: int = 3) -> str:
  value, ci = results_block.get(key), results_block.get(f"{key}_ci")
  if ci and all(c is not None for c in ci):
    return f"{_fmt(value, digits)} [{_fmt(ci[0], digits)}, {_fmt(ci[1], digits)}]"
  return _fmt(value, digits)


def _table(header: List[str], rows: List[List[str]]) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def results_tables(results: Dict) -> List[str]:
  """The two headline tables (markdown lines), shared by report.md and README."""
  b, pd = results["benchmark"], results["part_discovery"]
  leak = _table(["Masking", "PS (higher = part-specific)", "Causal leakage (0 = none)",
                 "MPPO"], [
      ["late (pool a plain forward in the part mask)", _with_ci(b, "ps_late"),
       _with_ci(b, "causal_leakage_late", 4), _with_ci(b, "mppo_late")],
      ["early (block-masked forward)", _with_ci(b, "ps_early"),
       _with_ci(b, "causal_leakage_early", 4), _with_ci(b, "mppo_early")]])
  rows = []
  for name, key, heads in (("single-stage", "single", ("stage1",)),
                           ("two-stage STE", "two_stage_ste", ("stage1", "stage2", "ensemble"))):
    r = pd[key]
    label = {"stage1": "Stage 1 head", "stage2": "Stage 2 head (isolated parts)",
             "ensemble": "ensemble (sum of logits)"}
    for i, h in enumerate(heads):
      parts = ([_fmt(r["NMI"], 1), _fmt(r["ARI"], 1), _fmt(r["NMI_fg"], 1), _fmt(r["ARI_fg"], 1),
                _fmt(r.get("max_part_share"), 2)] if i == 0 else ["", "", "", "", ""])
      rows.append([name, label[h], _fmt(r["mAP"].get(h))] + parts)
  chance = pd.get("chance_mAP")
  rows.append(["constant predictor", "(chance level)", _fmt(chance), "0", "0", "0", "0", ""])
  discovery = _table(["Model", "Attribute head", "mAP", "NMI", "ARI", "NMI fg", "ARI fg",
                      "largest part share"], rows)
  quality = (results["backbone"].get("quality_val") or {})
  rows = [["attribute mAP of its CLS head", _fmt(quality.get("cls/mAP")),
           _fmt(quality.get("chance/mAP"))],
          ["attribute mAP of its part read-out head", _fmt(quality.get("parts/mAP")),
           _fmt(quality.get("chance/mAP"))]]
  if "part_probe/balanced_accuracy" in quality:
    rows += [["a patch token's part, logistic probe (balanced accuracy)",
              _fmt(quality["part_probe/balanced_accuracy"]), _fmt(quality["part_probe/chance"])],
             ["k-means on the foreground patch tokens vs the true parts (NMI x100)",
              _fmt(quality["kmeans_fg/NMI"], 1), "0"]]
  stand_in = _table(["Stand-in backbone, on `val`", "value", "chance level"],
                    rows) if quality else ""
  return [leak, "", discovery, "", stand_in, "", priors_table(pd.get("priors"))]


def priors_table(priors: Optional[Dict[str, Dict]]) -> str:
  """What the part-shaping priors charge (unweighted; lower is preferred) the ground-truth parts
  on the patch grid and each model's maps at its last training step."""
  if not priors:
    return ""
  rows = [[label, *(_fmt(priors[key].get(name)) for name in MAP_PRIORS)]
          for key, label in (("truth", "ground-truth parts on the patch grid (one-hot)"),
                             ("single", "single-stage maps, last training batch"),
                             ("two_stage_ste", "two-stage STE maps, last training batch"))
          if key in priors]
  return _table(["Part-shaping priors (unweighted, lower = preferred)", "total variation",
                 "foreground presence", "background presence", "entropy"], rows)


def _describe(results: Dict) -> str:
  w, pd = results["world"], results["part_discovery"]
  b = results["benchmark"]
  pre = results["backbone"]["pretraining_steps"]
  arch = results["backbone"]["arch"] or {}
  source = results["backbone"].get("source")
  backbone = (f"a ViT (patch {arch.get('patch_size')}, width {arch.get('width')}, depth "
              f"{arch.get('depth')}) pretrained for {pre} steps on the world's attributes"
              f"{' (' + source + ')' if source else ''}" if pre is not None
              else f"the backbone `{results['backbone']['path']}`")
  return (f"Synthetic parts world (seed {w.get('seed', 0)}) at {w['image_size']} px, "
          f"cross-part correlation {w['correlation']:g}; {backbone}. Benchmark: ground-truth part masks, train/val/test "
          f"{b.get('num_train')}/{b.get('num_val')}/{b.get('num_test')} images, 95% bootstrap "
          f"intervals over test images. Part discovery: {pd['train_steps']['single']} "
          f"(single-stage) and {pd['train_steps']['two_stage_ste']} (two-stage STE) training "
          f"steps, evaluated on the {_int(pd['single'].get('num_examples'))} first "
          f"`{pd['eval_split']}` images (NMI/ARI x100, keypoints vs argmax part; \"fg\": argmax "
          f"over the foreground parts only; largest part share: the biggest share of the "
          f"evaluation patches any part, background included, takes). Wall time {results['seconds']['total']:.0f} s on "
          f"{results['machine']['cpu_count']} CPU core(s) ({results['machine']['backend']}).")


def _int(value) -> str:
  return "n/a" if value is None else str(int(value))


def _figures(workdir: str) -> List[str]:
  """Markdown image lines for the PNGs the sub-jobs wrote (paths relative to workdir)."""
  import glob
  lines = []
  bench = os.path.join(workdir, BENCHMARK_DIR)
  for pattern, caption in (("table1.png", "PS and causal leakage"),
                           ("map_matrices_*.png",
                            "attribute mAP per part (rows) and group, late vs early"),
                           ("ps_scatter_*.png", "matched vs unmatched mAP (Fig. S6 layout)"),
                           ("overlays_*.png", "test images with their ground-truth part maps")):
    for path in sorted(glob.glob(os.path.join(bench, pattern))):
      lines += [f"![{caption}]({os.path.relpath(path, workdir)})", ""]
  for key, sub in TRAIN_DIRS.items():
    found = sorted(glob.glob(os.path.join(workdir, sub, "images", "eval_part_maps_*.png")))
    if found:
      lines += [f"Discovered part maps, {key.replace('_', '-')} (top: images; bottom: argmax "
                "part, background uncoloured):", "",
                f"![{key} part maps]({os.path.relpath(found[-1], workdir)})", ""]
  return lines


def write_story(workdir: str, config, results: Dict) -> List[str]:
  """DIR/results.json and DIR/report.md; returns their paths."""
  from metonymy.probe import report as probe_report
  path_json = os.path.join(workdir, "results.json")
  with open(path_json, "w") as f:
    json.dump(probe_report.sanitize(results), f, indent=2, allow_nan=False)
  b = results["benchmark"]
  lines = ["# metonymy demo: intra-object leakage on the synthetic parts world", "",
           _describe(results), "",
           "## 1. Leakage of the pretrained backbone (late vs early masking)", "",
           "PS = how much better a part's feature predicts its own part's attributes than the "
           "other parts' (paper eq. 1); MPPO = how often the most predictive part of an attribute "
           "is its own (eq. 2). Causal leakage = relative change of part k's feature when "
           "every pixel outside part k is replaced by another image's. At correlation 0 any "
           "cross-part predictability is leakage.", "",
           results_tables(results)[0], ""]
  parts, groups = b.get("part_names"), b.get("groups")
  for m in ("late", "early"):
    matrix = b.get(f"map_matrix_{m}")
    if matrix is not None and parts and groups:
      rows = [[parts[i]] + [_fmt(v) for v in matrix[i]] for i in range(len(matrix))]
      lines += [f"Attribute mAP, {m} masking (rows: part features, columns: attribute groups):",
                "", _table([""] + list(groups), rows), ""]
  lines += ["Full benchmark report: [benchmark/report.md](benchmark/report.md).", "",
            "## 2. Part discovery from the same backbone", "",
            "Single-stage: Stage 1 on the frozen backbone. Two-stage STE: Stage 1's maps drive "
            "Stage 2's isolated part streams (hard forward, soft backward); its Stage 2 head sees "
            "each part's pixels only.", "",
            results_tables(results)[2], ""] + [w + "\n" for w in collapse_warnings(results)]
  lines += ["## The stand-in backbone", "", results_tables(results)[4], ""]
  if results["part_discovery"].get("priors"):
    lines += ["## What the part-shaping priors charge", "",
              "The priors Stage 1 is trained with (PDiscoFormer's, at its weights), on the true "
              "parts and on the maps Stage 1 found: when the truth costs more than the found "
              "maps, the priors pull Stage 1 away from the real parts.", "",
              results_tables(results)[6], ""]
  lines += ["## Figures", ""] + _figures(workdir)
  lines += ["## Timing", "",
            _table(["step", "seconds"], [[k, f"{v:.0f}"] for k, v in results["seconds"].items()]),
            ""]
  path_md = os.path.join(workdir, "report.md")
  with open(path_md, "w") as f:
    f.write("\n".join(lines) + "\n")
  return [path_json, path_md]


def summary_line(results: Dict) -> str:
  s = results["summary"]
  return ("[demo] PS late {} / early {}; causal leakage late {} / early {}; mAP single {} / "
          "two-stage stage 2 {} / ensemble {}; NMI single {} / two-stage {}").format(
              _fmt(s["ps_late"]), _fmt(s["ps_early"]), _fmt(s["causal_leakage_late"], 4),
              _fmt(s["causal_leakage_early"], 4), _fmt(s["map_single"]),
              _fmt(s["map_two_stage_stage2"]), _fmt(s["map_two_stage_ensemble"]),
              _fmt(s["nmi_single"], 1), _fmt(s["nmi_two_stage"], 1))


# ------------------------------------------------------------------------------------------------
# README block.


def readme_block(results: Dict) -> str:
  """The markdown that goes between README_BEGIN and README_END."""
  return "\n".join([
      "Generated by `python -m metonymy.main --config=configs/demo.py --workdir=DIR "
      "--config.readme=README.md` on " + results["date"][:10] + "; do not edit by hand.", "",
      _describe(results), "", *results_tables(results), "",
      *[w + "\n" for w in collapse_warnings(results)]]).rstrip()


def _read_block(path: str, begin_marker: str, end_marker: str):
  """(text, begin, end) of `path`, whose block lies between the two markers."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"config.readme={path!r} does not exist.")
  with open(path) as f:
    text = f.read()
  begin, end = text.find(begin_marker), text.find(end_marker)
  if begin < 0 or end < 0 or end < begin:
    raise ValueError(f"{path} has no '{begin_marker}' ... '{end_marker}' block (in that order); "
                     "add the two marker lines where the demo's results should go.")
  return text, begin + len(begin_marker), end


def update_readme(path: str, block: str, begin_marker: str = README_BEGIN,
                  end_marker: str = README_END) -> None:
  """Replaces what lies between the markers (README_BEGIN / README_END) in `path` with `block`."""
  text, begin, end = _read_block(path, begin_marker, end_marker)
  text = text[:begin] + "\n" + block.rstrip() + "\n" + text[end:]
  with open(path, "w") as f:
    f.write(text)


def seed_row(results: Dict) -> List[str]:
  """This run's row of the per-seed table (SEEDS_HEADER)."""
  s, q = results["summary"], (results["backbone"].get("quality_val") or {})
  pair = lambda a, b, d=1: f"{_fmt(s[a], d)} / {_fmt(s[b], d)}"
  return [f"{results['world'].get('seed', 0)}", _fmt(q.get("cls/mAP")), pair("ps_late", "ps_early", 3),
          _fmt(s["map_single"]), pair("nmi_single", "ari_single"),
          _fmt(s["map_two_stage_stage2"]), _fmt(s["map_two_stage_ensemble"]),
          pair("nmi_two_stage", "ari_two_stage"),
          pair("max_part_share_single", "max_part_share_two_stage", 2), _fmt(s["map_chance"]),
          f"{results['seconds']['total']:.0f} s"]


def update_readme_seed_row(path: str, results: Dict) -> None:
  """Writes this run's row into the SEEDS_BEGIN / SEEDS_END table of `path`, keeping the other
  seeds' rows (sorted by seed)."""
  text, begin, end = _read_block(path, SEEDS_BEGIN, SEEDS_END)
  rows = {}
  for line in text[begin:end].splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if line.startswith("|") and cells and cells[0].isdigit():
      rows[int(cells[0])] = cells
  row = seed_row(results)
  rows[int(row[0])] = row
  update_readme(path, _table(SEEDS_HEADER, [rows[k] for k in sorted(rows)]), SEEDS_BEGIN,
                SEEDS_END)


# ------------------------------------------------------------------------------------------------
# The correlation sweep.


def run_sweep(config, workdir: str) -> Dict:
  correlations = [float(c) for c in config.sweep.correlations]
  if not correlations or any(not 0.0 <= c <= 1.0 for c in correlations):
    raise ValueError(f"config.sweep.correlations must be values in [0, 1], got {correlations}")
  steps = _Steps(len(correlations) + 2)
  os.makedirs(workdir, exist_ok=True)
  steps.begin("pretrain", "one backbone for every point: the given one, or pretrained once on "
                          f"the world at correlation {config.world.correlation:g}")
  backbone, _ = pretrained_backbone(config, workdir, config.world)
  points = []
  for c in correlations:
    steps.begin(f"correlation_{c:g}", f"benchmark at cross-part correlation {c:g}")
    world = ml_collections.ConfigDict(config.world.to_dict())
    world.correlation = c
    # One workdir (and feature cache) per world: the cache key does not hold the correlation.
    sub_dir = os.path.join(workdir, f"correlation_{c:g}")
    r = run_benchmark(config, backbone, sub_dir, world,
                      title=f"synthetic parts world, correlation {c:g}, the demo's tiny ViT")
    points.append({"correlation": c, "workdir": os.path.relpath(sub_dir, workdir),
                   **{k: r.get(k) for k in ("ps_late", "ps_early", "ps_late_ci", "ps_early_ci",
                                            "causal_leakage_late", "causal_leakage_early")}})
  steps.begin("report", "plotting PS against correlation")
  seconds = steps.finish()
  results = {"job": "demo", "mode": "correlation_sweep", "backbone": os.path.abspath(backbone),
             "world": config.world.to_dict(), "points": points, "seconds": seconds,
             "date": datetime.datetime.now().isoformat(timespec="seconds")}
  written = write_sweep(workdir, results)
  print(f"[demo] sweep done in {seconds['total']:.0f} s; wrote " + ", ".join(written), flush=True)
  return results


SWEEP_PNG = "ps_vs_correlation.png"


def plot_sweep(path: str, points: List[Dict]) -> None:
  """PS against correlation, late and early masking, with bootstrap intervals when present."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(5.2, 3.8))
  x = np.array([p["correlation"] for p in points])
  for masking, color, marker in (("late", "tab:red", "o"), ("early", "tab:blue", "s")):
    y = np.array([np.nan if p.get(f"ps_{masking}") is None else p[f"ps_{masking}"]
                  for p in points], float)
    ci = [p.get(f"ps_{masking}_ci") for p in points]
    if all(c is not None and None not in c for c in ci):
      err = np.abs(np.array(ci, float).T - y)
      ax.errorbar(x, y, yerr=err, color=color, marker=marker, capsize=3,
                  label=f"{masking} masking")
    else:
      ax.plot(x, y, color=color, marker=marker, label=f"{masking} masking")
  ax.set_xlabel("cross-part attribute correlation of the world")
  ax.set_ylabel("part specificity (PS)")
  ax.set_title("Leakage vs real correlation")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def write_sweep(workdir: str, results: Dict) -> List[str]:
  from metonymy.probe import report as probe_report
  png = os.path.join(workdir, SWEEP_PNG)
  plot_sweep(png, results["points"])
  path_json = os.path.join(workdir, "results.json")
  with open(path_json, "w") as f:
    json.dump(probe_report.sanitize(results), f, indent=2, allow_nan=False)
  rows = [[f"{p['correlation']:g}", _with_ci(p, "ps_late"), _with_ci(p, "ps_early"),
           _fmt(None if p["ps_late"] is None or p["ps_early"] is None
                else p["ps_early"] - p["ps_late"]),
           _fmt(p["causal_leakage_late"], 4), _fmt(p["causal_leakage_early"], 4),
           f"[report]({p['workdir']}/report.md)"] for p in results["points"]]
  w = results["world"]
  lines = ["# PS against cross-part correlation", "",
           f"One backbone (`{results['backbone']}`) benchmarked on synthetic worlds at "
           f"{w['image_size']} px that differ only in their cross-part attribute correlation. "
           "Early masking removes leakage, so what is left of cross-part predictability under it "
           "is the world's real correlation; the late-early gap is leakage.", "",
           _table(["correlation", "PS late", "PS early", "gap (early - late)",
                   "causal leakage late", "causal leakage early", ""], rows), "",
           f"![PS against correlation]({SWEEP_PNG})", "",
           f"Wall time {results['seconds']['total']:.0f} s.", ""]
  path_md = os.path.join(workdir, "report.md")
  with open(path_md, "w") as f:
    f.write("\n".join(lines))
  return [png, path_json, path_md]
