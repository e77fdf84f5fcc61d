"""The jobs the demo and the Table-3 job drive (the probe job for the leakage benchmark, the train
job for part discovery), each given the world as its dataset options and launched as a sub-run
(launcher.launch on a `Workdir.sub` handle), and the readers of what a train job logs. The
sub-jobs are the real ones, run on sub-configs, so the demo and Table 3 measure exactly what
`python -m metonymy.main` would."""

from typing import Dict, List

import ml_collections

from metonymy import launcher
from metonymy.workdir import Workdir

# Where each of the demo's sub-jobs writes, under its workdir.
BENCHMARK_DIR = "benchmark"
TRAIN_DIRS = {"single": "single", "two_stage": "two_stage_ste"}


def plain_world(world) -> Dict:
  """The world's options as a plain dict (a ConfigDict or a mapping: what worker processes get)."""
  return world.to_dict() if hasattr(world, "to_dict") else dict(world)


def with_world(sub: ml_collections.ConfigDict, world) -> ml_collections.ConfigDict:
  """A copy of a sub-job config whose dataset options are `world` (one source of truth)."""
  sub = ml_collections.ConfigDict(sub.to_dict())
  sub.data.options = plain_world(world)
  return sub


def run_benchmark(config, backbone: str, workdir: Workdir, world, title: str = "") -> Dict:
  """Step 2: the probe job on `backbone`, seeded with the run seed config.seed (its bootstrap
  draws), launched in `workdir` (a sub-run's handle: `backbone` recorded against its tree,
  Workdir.record); returns its results.json object."""
  sub = with_world(config.benchmark, world)
  sub.seeds = (int(config.seed),)
  sub.backbone.checkpoint = workdir.record(backbone)
  sub.backbone_pretraining.steps = 0  # the probe job pretrains random-init backbones only
  if title:
    sub.report.title = title
  return launcher.launch(sub, workdir)


def run_training(sub, backbone: str, workdir: Workdir, world, seed: int) -> Dict[str, float]:
  """Step 3: the train job from `backbone` with run seed `seed` (its prototype init, Gumbel
  noise, data order and augmentation; the world is `world`'s own seed), launched in `workdir`
  as run_benchmark; returns the last evaluation's scalars and each optimizer group's relative
  weight change at its end (`relative_change/<group>`; read back from metrics.jsonl, so a rerun
  that finds the run complete still reports them)."""
  sub = with_world(sub, world)
  sub.seed = int(seed)
  sub.backbone.checkpoint = workdir.record(backbone)
  launcher.launch(sub, workdir)
  changes = records(workdir, "train/relative_change/")
  moved = {f"relative_change/{k}": v for k, v in changes[max(changes)].items()} if changes else {}
  return dict(last_eval(workdir), **moved)


def records(workdir, prefix: str) -> Dict[int, Dict[str, float]]:
  """{step: {name: value}}: a train workdir's metrics whose names start with `prefix` (dropped),
  by step in order (workdir.Workdir.metric_records)."""
  return Workdir(workdir).metric_records(prefix)


def evaluations(workdir: str) -> List[Dict[str, float]]:
  """Every evaluation of a train workdir in step order: {"<head>/mAP": ..., "step": s}."""
  found = records(workdir, "eval/")
  if not found:
    raise ValueError(f"{Workdir(workdir).metrics_file} holds no evaluation: the run in "
                     f"{workdir} never evaluated.")
  return [dict(values, step=step) for step, values in found.items()]


def last_eval(workdir: str) -> Dict[str, float]:
  """{"<head>/mAP": ..., "parts/NMI": ..., "step": s}: the latest `eval/` record of a train
  workdir's metrics.jsonl (the prefix dropped); non-finite values (stored as strings) -> NaN."""
  return evaluations(workdir)[-1]


def last_train_losses(workdir: str) -> Dict[str, float]:
  """{"<term>": value}: the unweighted loss terms (`loss/<term>`) of the latest training record
  of a train workdir's metrics.jsonl."""
  found = records(workdir, "loss/")
  return found[max(found)] if found else {}
