"""One Table-3 run: a variant (single, hard, ste, soft) at one run seed, trained and benchmarked
through the project's own jobs, and its row read back from what they wrote."""

import math
import os
from typing import Dict, Optional

import ml_collections

from metonymy import config_lib
from metonymy.data import pipeline
from metonymy.models import stage2_options
from metonymy.runs import subjobs
from metonymy.runs import workers
from metonymy.training import optimizer
from metonymy.workdir import Workdir
from metonymy.workdir import layout

# Two-stage variants: name -> the Stage-2 options it sets (models/stage2_options.py's one table;
# "hard_none" is the counterfactual with no Stage-2 gradient into Stage 1).
TWO_STAGE = stage2_options.VARIANTS
ROW_KEYS = ("variant", "seed", "world_seed", "NMI", "ARI", "NMI_fg", "ARI_fg", "PS", "MPPO",
            "mAP_stage1", "mAP_stage2", "mAP_ensemble", "max_part_share", "background_share")


def feedback_scale(config) -> float:
  """config.stage2_feedback_scale: Stage 2's feedback into Stage 1 (1, eq. 9's, where the config
  predates the option)."""
  return float(config.get("stage2_feedback_scale", 1.0))


def training_config(config, variant: str) -> ml_collections.ConfigDict:
  """config.single for "single"; for a two-stage variant the same config with that variant's
  two-stage model (config_lib.two_stage), so the arms share everything else; Stage 2's
  feedback into Stage 1 scaled by `feedback_scale(config)`."""
  if variant == "single":
    return ml_collections.ConfigDict(config.single.to_dict())
  if variant not in TWO_STAGE:
    raise ValueError(f"config.variants: unknown variant {variant!r}; expected 'single' or one of "
                     f"{sorted(TWO_STAGE)}")
  return config_lib.two_stage(config.single, variant,
                              feedback_scale=feedback_scale(config))


def protocol(config, training) -> Dict:
  """The training protocol every variant shares, as run: epochs of the train split, steps, batch,
  the learning rates at that batch, the priors' weights, the evaluation split, Stage 1's options
  (config_lib.STAGE1_OPTIONS)."""
  data = training.data
  examples = int(data.train_examples) or int(dict(data.options.splits)["train"])
  per_epoch = pipeline.num_batches(examples, int(data.batch_size), train=True, shard_count=1)
  steps = int(training.trainer.num_steps) or int(training.trainer.num_epochs) * per_epoch
  opt = training.optimizer
  # Stage 1's backbone tokens have a rate only where they train (model.trained_tokens).
  groups = {g: lr for g, lr in opt.learning_rates.items()
            if g != "tokens" or training.model.get("trained_tokens", False)}
  rates = {g: optimizer.scaled_rate(float(lr), int(data.batch_size), int(opt.base_batch_size),
                                    opt.lr_scaling)
           for g, lr in groups.items()}
  return {"epochs": int(training.trainer.num_epochs) if not training.trainer.num_steps else None,
          "train_examples": examples, "batch_size": int(data.batch_size),
          "steps_per_epoch": per_epoch, "steps": steps, "base_learning_rates":
          groups, "learning_rates": rates, "schedule": opt.schedule,
          "loss_weights": dict(training.loss.weights), "eval_split": data.eval_split,
          "eval_examples": int(data.eval_examples), "image_size": int(data.image_size),
          "term_gradient_batches": int(training.trainer.get("term_gradient_batches", 0)),
          "stage2_feedback_scale": feedback_scale(config),
          "stage1_options": {k: training.model[k] for k in config_lib.STAGE1_OPTIONS
                             if k in training.model}}


def run_dir(workdir: Workdir, variant: str, seed: int) -> Workdir:
  """The workdir of `variant` at run seed `seed` in the job's `workdir`."""
  return workdir.sub(f"{variant}_seed{int(seed)}")


def finished(workdir: Workdir, variant: str, seed: int) -> bool:
  """Whether `variant` at run seed `seed` was trained and benchmarked in `workdir` (its probe,
  which reads the finished training run, wrote its results)."""
  return run_dir(workdir, variant, seed).sub("probe").results_file.exists()


def train(config, variant: str, seed: int, backbone: str, workdir: Workdir) -> Workdir:
  """Trains (or finds trained) `variant` at run seed `seed`; returns its train workdir."""
  directory = run_dir(workdir, variant, seed).sub("train")
  subjobs.run_training(training_config(config, variant), backbone, directory, config.world, seed)
  return directory


def benchmark(config, variant: str, seed: int, backbone: str, train_dir: Workdir,
              workdir: Workdir) -> Dict:
  """PS and MPPO of a trained model (paper Table 3): linear probes on its own part features over
  its discovered parts: late masking of the frozen backbone for single-stage (Stage 1's pooled
  features), early masking of the trained Stage-2 ViT for two-stage (Stage 2's isolated ones)."""
  directory = run_dir(workdir, variant, seed).sub("probe")
  if directory.results_file.exists():  # A rerun of the job: the probe already ran.
    return layout.read_json(directory.results_file)
  bench = ml_collections.ConfigDict(config.benchmark.to_dict())
  bench.masks.path = directory.record(train_dir)
  bench.features.maskings = ("late",) if variant == "single" else ("early",)
  bench.backbone_name = f"{variant} seed {seed}"
  source = backbone if variant == "single" else train_dir
  return subjobs.run_benchmark(ml_collections.ConfigDict({"benchmark": bench, "seed": seed}),
                               source, directory, config.world,
                               title=f"{variant}, run seed {seed}: its own part features")


def train_and_benchmark(config_dict: Dict, variant: str, seed: int, backbone: str,
                        workdir: str) -> None:
  """train, then benchmark: one run, as a worker process runs it (runs/workers.py; arguments
  that pickle)."""
  files = Workdir(workdir)
  config = ml_collections.ConfigDict(config_dict)
  benchmark(config, variant, seed, backbone, train(config, variant, seed, backbone, files), files)


def log_path(workdir: Workdir, variant: str, seed: int) -> str:
  """DIR/<variant>_seed<s>/log.txt: a run's output when a worker process ran it."""
  return os.path.join(os.fspath(run_dir(workdir, variant, seed)), workers.LOG_FILE)


def row(variant: str, seed: int, world_seed: int, train_dir: str, probe: Dict) -> Dict:
  """The results.json row of one run (ROW_KEYS first), plus what Stage 2's training and the
  mechanism need: Stage 2's mAP at step 0, the relative change of Stage 2's ViT, and the
  gradient norm of each loss term at Stage 1's prototypes at the start and the end."""
  evals = subjobs.evaluations(train_dir)
  first, last = evals[0], evals[-1]
  masking = "late" if variant == "single" else "early"
  mechanism = subjobs.records(train_dir, "mechanism/grad_norm/")
  change = subjobs.records(train_dir, "train/relative_change/")
  end = max(change) if change else None
  return {
      "variant": variant, "seed": int(seed), "world_seed": int(world_seed),
      "NMI": last.get("parts/NMI"), "ARI": last.get("parts/ARI"),
      "NMI_fg": last.get("parts/NMI_fg"), "ARI_fg": last.get("parts/ARI_fg"),
      "PS": _value(probe.get(f"ps_{masking}")), "MPPO": _value(probe.get(f"mppo_{masking}")),
      "mAP_stage1": last.get("stage1/mAP"), "mAP_stage2": last.get("stage2/mAP"),
      "mAP_ensemble": last.get("ensemble/mAP"), "max_part_share": last.get("part_share/max"),
      # The background channel's share of the patches beside the truth's (the collapse watch).
      "background_share": last.get("parts/background_share"),
      "background_share_true": last.get("parts/background_share_true"),
      "collapsed": bool(last.get("collapsed", 0.0)),
      "step": last["step"], "start_step": first["step"],
      "mAP_stage2_start": first.get("stage2/mAP") if first["step"] == 0 else None,
      "mAP_stage1_start": first.get("stage1/mAP") if first["step"] == 0 else None,
      "relative_change": change.get(end, {}) if end is not None else {},
      "grad_norm_start": mechanism.get(0, {}),
      "grad_norm_end": mechanism.get(max(mechanism), {}) if len(mechanism) > 1 else {},
      "part_share": [last[f"part_share/{k}"] for k in range(_num_groups(last))],
      # The chance row of NMI / ARI (a function of the world, K and the run seed only, so the
      # same for every variant of a seed) and the mask coverage of the true parts.
      **{f"position_{k}": last.get(f"parts/position_{k}") for k in ("NMI", "ARI", "NMI_fg",
                                                                     "ARI_fg")},
      **coverage(last),
  }


def coverage(scalars: Dict) -> Dict[str, Optional[float]]:
  """A row's mask coverage from an evaluation's scalars: "coverage" and "area_ratio" (means over
  the true parts), "coverage/<g>", "area_ratio/<g>" per true part g, "object_in_background" and
  "background_in_parts"; empty when the world gave none."""
  num_true = sum(1 for k in scalars if k.startswith("parts/coverage/"))
  out = {}
  for name in ("coverage", "area_ratio"):
    if f"parts/{name}" in scalars:
      out[name] = _finite(scalars[f"parts/{name}"])
      out.update({f"{name}/{g}": _finite(scalars.get(f"parts/{name}/{g}"))
                  for g in range(num_true)})
  # Which patches the background channel holds: the object's it takes, the background it leaves.
  for name in ("object_in_background", "background_in_parts"):
    if f"parts/{name}" in scalars:
      out[name] = _finite(scalars[f"parts/{name}"])
  return out


def _num_groups(scalars: Dict) -> int:
  return sum(1 for k in scalars if k.startswith("part_share/") and k.split("/")[1].isdigit())


def _value(x) -> Optional[float]:
  return None if x is None else float(x)


def _finite(x) -> Optional[float]:
  """None for a missing or non-finite value (metrics.jsonl keeps NaN as a string)."""
  try:
    value = float(x)
  except (TypeError, ValueError):
    return None
  return value if math.isfinite(value) else None
