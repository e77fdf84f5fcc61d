"""Mode "story" (configs/demo.py): the paper's story end to end on one synthetic world.

  1. the stand-in for DINO (stand_in.py), saved as DIR/backbone;
  2. its leakage benchmark, ground-truth masks, late vs early masking (the probe job, in
     DIR/benchmark);
  3. single-stage and two-stage STE part discovery from it (the train job, in DIR/single and
     DIR/two_stage_ste); on a CPU, 2 and 3 run side by side in two worker processes
     (config.run_processes, runs/workers.py), each sub-run's output in its DIR/<sub-run>/log.txt;
  4. DIR/report.md and DIR/results.json gathering the numbers (report.py), and with
     config.readme=PATH the README blocks (readme.py).

Every number written is the one measured in this run; nothing is tuned to a story.
"""

import datetime
import math
import os
import platform
from typing import Dict, Optional

import jax
import ml_collections

from metonymy import console
from metonymy.converters import store
from metonymy.demo import progress
from metonymy.demo import readme
from metonymy.demo import report
from metonymy.demo import tables
from metonymy.runs import machine_load
from metonymy.runs import references
from metonymy.runs import stand_in
from metonymy.runs import subjobs
from metonymy.runs import workers
from metonymy.workdir import layout
from metonymy.workdir import Workdir


def run_story(config, workdir) -> Dict:
  load_at_start = machine_load.load_average()  # Was the machine shared? Said in the block.
  processes = workers.process_count(int(config.get("run_processes", 1)), 3)
  steps = progress.Steps(3 if processes > 1 else 4)
  world = config.world
  files = Workdir(workdir).make()
  console.console(f"[demo] the synthetic parts world at {world.image_size} px, cross-part "
                  f"correlation {world.correlation:g}, splits {dict(world.splits)}; outputs in "
                  f"{files}")

  steps.begin("pretrain", "pretraining the stand-in for DINO")
  backbone, stand_in_record = stand_in.pretrained_backbone(config, files, world)

  if processes > 1:  # Side by side: the longest (two-stage) first.
    steps.begin("benchmark_and_part_discovery", "leakage benchmark (ground-truth part masks, late "
                "vs early masking) and part discovery (single-stage, two-stage STE), side by side")
    two_stage, bench, single = workers.run_all(
        [_training_task(config, "two_stage", backbone, files, world),
         workers.Task("leakage benchmark", _log(files, subjobs.BENCHMARK_DIR), _benchmark,
                      (config.to_dict(), backbone, os.fspath(files), subjobs.plain_world(world))),
         _training_task(config, "single", backbone, files, world)], processes, "[demo]")
    trained = {"single": single, "two_stage": two_stage}
  else:
    steps.begin("benchmark", "leakage benchmark: ground-truth part masks, late vs early masking")
    bench = subjobs.run_benchmark(config, backbone, files.sub(subjobs.BENCHMARK_DIR), world)
    steps.begin("part_discovery", "part discovery: single-stage, then two-stage STE")
    trained = {key: _train(config[key].to_dict(), backbone, os.fspath(files), key,
                           subjobs.plain_world(world), int(config.seed))
               for key in ("single", "two_stage")}

  steps.begin("report", "writing report.md and results.json")
  chance = references.chance_map(subjobs.with_world(config.single, world).data)
  priors = prior_costs(config, backbone, files, world)
  seconds = steps.finish()
  results = story_results(config, files.record(backbone), stand_in_record, bench, trained,
                          seconds)
  results["machine"].update(machine_load.at_end(load_at_start, processes))
  results["part_discovery"]["chance_mAP"] = chance
  results["part_discovery"]["priors"] = priors
  results["summary"]["map_chance"] = chance
  written = report.write_story(files, results)
  if config.readme:
    if int(world.seed) == 0:  # The headline block is the default world's.
      readme.write_results(config.readme, results)
    readme.write_seed_row(config.readme, results)
    written.append(config.readme)
  console.console(f"[demo] done in {seconds['total']:.0f} s; wrote " + ", ".join(written))
  console.console(tables.summary_line(results))
  for line in tables.collapse_warnings(results):
    console.console(f"[demo] WARNING: {line}")
  return results


def _log(files: Workdir, directory: str) -> str:
  """A worker's log: DIR/<sub-run>/log.txt."""
  return os.path.join(os.fspath(files.sub(directory)), workers.LOG_FILE)


def _benchmark(config_dict: Dict, backbone: str, root: str, world: Dict) -> Dict:
  """Step 2 in a worker process (arguments that pickle)."""
  return subjobs.run_benchmark(ml_collections.ConfigDict(config_dict), backbone,
                               Workdir(root).sub(subjobs.BENCHMARK_DIR),
                               ml_collections.ConfigDict(world))


def _train(sub: Dict, backbone: str, root: str, key: str, world: Dict, seed: int) -> Dict:
  """Step 3's `key` ("single" or "two_stage") run, here or in a worker process."""
  sub = ml_collections.ConfigDict(sub)
  console.console(f"[demo] training {key} ({sub.model.name}"
                  f"{', ' + sub.model.stage2.mask if 'stage2' in sub.model else ''}) for "
                  f"{sub.trainer.num_steps} steps at batch {sub.data.batch_size}")
  return subjobs.run_training(sub, backbone, Workdir(root).sub(subjobs.TRAIN_DIRS[key]),
                              ml_collections.ConfigDict(world), seed)


def _training_task(config, key: str, backbone: str, files: Workdir, world) -> workers.Task:
  return workers.Task(f"{key} training", _log(files, subjobs.TRAIN_DIRS[key]), _train,
                      (config[key].to_dict(), backbone, os.fspath(files), key,
                       subjobs.plain_world(world), int(config.seed)))


def prior_costs(config, backbone: str, files: Workdir, world) -> Optional[Dict[str, Dict]]:
  """{"truth" | "single" | "two_stage_ste": {prior: value}}: the map priors of the ground truth
  on the backbone's patch grid, and of each trained model's last training batch. None when the
  backbone's patch size is unknown (not a converted ViT folder)."""
  try:
    arch = layout.read_json(os.path.join(backbone, store.ARCH_FILE))
    patch_size = int(arch["vit_config"]["patch_size"])
  except (OSError, KeyError, ValueError):
    return None
  costs = {"truth": references.priors_of_the_truth(
      subjobs.with_world(config.single, world).data, patch_size)}
  for key, directory in subjobs.TRAIN_DIRS.items():
    trained = subjobs.last_train_losses(files.sub(directory))
    costs["single" if key == "single" else "two_stage_ste"] = {
        name: trained.get(name) for name in references.MAP_PRIORS}
  return costs


def story_results(config, backbone: str, stand_in_record: Optional[Dict], bench: Dict,
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
  record = stand_in_record or {}
  return {
      "job": "demo",
      "seed": int(config.seed),  # the run seed of every sub-job; the world's is world.seed
      "world": config.world.to_dict(),
      "backbone": {"path": backbone,
                   "arch": config.backbone.arch.to_dict() if pretrained_here else None,
                   "pretraining_steps": (int(config.backbone_pretraining.steps)
                                         if pretrained_here else None),
                   "pretraining_objective": str(config.backbone_pretraining.get(
                       "objective", "attributes")),
                   # The supervised stand-in it continues (attributes_then_dense), if any.
                   "pretraining_start": (record.get("start") or {}).get("source"),
                   # The attribute term's weight beside a self-supervised one, if any.
                   "attribute_weight": _attribute_weight(config.backbone_pretraining),
                   "source": record.get("source"),
                   "quality_val": record.get("quality_val")},
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
          # Both runs fit it on the same training keypoints with the same K and seed.
          "nmi_position": (single["position_baseline"] or {}).get("NMI"),
          "ari_position": (single["position_baseline"] or {}).get("ARI"),
          "max_part_share_single": single["max_part_share"],
          "max_part_share_two_stage": two["max_part_share"],
          "collapsed": single["collapsed"] or two["collapsed"],
          "stand_in_cls_map_val": readme.stand_in_cls_map(record.get("quality_val") or {})},
      "seconds": seconds,
      "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                  "backend": _backend()},
      "date": datetime.datetime.now().isoformat(timespec="seconds"),
  }


def _attribute_weight(pretraining) -> Optional[float]:
  """The attribute term's weight in a self-supervised pretraining block (None: not one)."""
  if pretraining.get("objective", "attributes") != "self_supervised":
    return None
  return float((pretraining.get("self_supervised") or {}).get("attributes", 0.0))


def _part_discovery(scalars: Dict[str, float]) -> Dict:
  """A train run's last evaluation, grouped: mAP/AUROC per head, NMI/ARI, part shares."""
  heads = sorted({k.split("/")[0] for k in scalars if k.endswith("/mAP")})
  out = {"step": scalars.get("step"),
         "mAP": {h: _pick(scalars, f"{h}/mAP") for h in heads},
         "AUROC": {h: _pick(scalars, f"{h}/AUROC") for h in heads}}
  for k in ("NMI", "ARI", "NMI_fg", "ARI_fg"):
    out[k] = _pick(scalars, f"parts/{k}")
  # The chance row: k-means on the training keypoints' positions, scored at the same keypoints
  # (evaluation/position_baseline.py); None where the run fit none.
  out["position_baseline"] = ({k: _pick(scalars, f"parts/position_{k}")
                               for k in ("NMI", "ARI", "NMI_fg", "ARI_fg")}
                              if "parts/position_NMI" in scalars else None)
  out["num_examples"] = scalars.get("num_examples")
  # Does Stage 2 train? |theta - theta_0| / |theta_0| of its ViT over the run (two-stage only).
  out["stage2_vit_relative_change"] = _pick(scalars, "relative_change/backbone")
  # Collapse watch (training/evaluate.py): each part's share of the evaluation patches.
  shares = sorted((int(k.split("/")[1]), v) for k, v in scalars.items()
                  if k.startswith("part_share/") and k.split("/")[1].isdigit())
  out["part_share"] = [v for _, v in shares]
  out["max_part_share"] = _pick(scalars, "part_share/max")
  out["background_share"] = _pick(scalars, "parts/background_share")
  out["background_share_true"] = _pick(scalars, "parts/background_share_true")
  out["empty_parts"] = _pick(scalars, "part_share/num_empty")
  out["collapsed"] = bool(scalars.get("collapsed", 0.0))
  return out


def _pick(d: Dict, key: str) -> Optional[float]:
  v = d.get(key)
  return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else v


def _backend() -> str:
  return f"{jax.default_backend()} x {jax.device_count()}"
