"""run(config, workdir): the stand-in, then every (run seed, variant) trained and benchmarked
(config.run_processes at a time, runs/workers.py), then the figure's part maps (part_maps.py), then
results.json, report.md, the figure and README's block (report.py, which formats what this
computed). A rerun on the same workdir skips the runs that finished (their probe is read back)
and resumes the others (the train job resumes from its checkpoint)."""

import datetime
import os
import platform
import time
from typing import Dict

from metonymy import console
from metonymy.runs import machine_load
from metonymy.runs import references
from metonymy.runs import stand_in
from metonymy.runs import subjobs
from metonymy.runs import workers
from metonymy.table3 import part_maps
from metonymy.table3 import report
from metonymy.table3 import stats
from metonymy.table3 import variants
from metonymy.workdir import Workdir


def run(config, workdir) -> Dict:
  start = time.perf_counter()
  load_at_start = machine_load.load_average()  # Was the machine shared? Said in the block.
  files = Workdir(workdir).make()
  world = config.world
  for variant in config.variants:
    variants.training_config(config, variant)  # An unknown variant fails before any training.
  backbone, record = stand_in.pretrained_backbone(config, files, world)
  # Seed-major: an early stop still leaves complete pairs.
  runs = [(int(seed), variant) for seed in config.seeds for variant in config.variants]
  pending = [(seed, variant) for seed, variant in runs
             if not variants.finished(files, variant, seed)]
  processes = workers.process_count(int(config.get("run_processes", 1)), len(pending))
  if processes > 1:
    workers.run_all([workers.Task(f"{variant}, run seed {seed}",
                                  variants.log_path(files, variant, seed),
                                  variants.train_and_benchmark,
                                  (config.to_dict(), variant, seed, backbone, os.fspath(files)))
                     for seed, variant in pending], processes, "[table3]")
  rows, dirs = [], {}
  for seed, variant in runs:
    if variants.finished(files, variant, seed):  # Trained and benchmarked (here or earlier).
      train_dir = variants.run_dir(files, variant, seed).sub("train")
    else:
      done = len(rows)
      eta = ((time.perf_counter() - start) / done * (len(runs) - done)) if done else None
      console.console(f"[table3] ({done + 1}/{len(runs)}) {variant}, run seed {seed}, world seed "
                      f"{int(world.seed)}" + (f"; ETA {eta / 60:.0f} min" if eta else ""))
      train_dir = variants.train(config, variant, seed, backbone, files)
    probe = variants.benchmark(config, variant, seed, backbone, train_dir, files)
    rows.append(variants.row(variant, seed, world.seed, train_dir, probe))
    dirs[(variant, seed)] = train_dir
    console.console(report.row_line(rows[-1]))
  training = variants.training_config(config, config.variants[0])
  eval_data = subjobs.with_world(training, world).data
  true_parts = list(references.evaluated_examples(eval_data)[0].info.part_names)
  coverage = stats.coverage_metrics(len(true_parts)) if any("coverage" in r for r in rows) else ()
  results = {
      "job": "table3",
      "world": world.to_dict(),
      "world_seed": int(world.seed),
      "world_name": config.get("world_name", "v1"),  # configs/demo.py's WORLDS key
      "stand_in_objective": stand_in.objective_name(config),
      "seeds": [int(s) for s in config.seeds],
      "backbone": {"path": files.record(backbone), "source": (record or {}).get("source"),
                   "quality_val": (record or {}).get("quality_val")},
      "protocol": variants.protocol(config, training),
      "chance_mAP": references.chance_map(eval_data),
      "true_parts": true_parts,
      "rows": rows,
      "summary": stats.summary(rows, stats.METRICS + stats.POSITION_METRICS + coverage),
      "paired": stats.paired(rows, metrics=stats.METRICS + coverage),
      # Table 3's chance row of NMI / ARI: mean over seeds, checked equal across variants.
      "position_baseline": stats.position_baseline(rows),
      "seconds": time.perf_counter() - start,
      # Runs an earlier invocation on this workdir trained: "seconds" is then not the job's time.
      "runs_read_back": len(runs) - len(pending),
      "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                  **machine_load.at_end(load_at_start, processes)},
      "date": datetime.datetime.now().isoformat(timespec="seconds"),
  }
  maps = part_maps.compute(config, dirs, int(config.seeds[0]), int(config.figure_images))
  written = report.write(files, results, maps, config.readme)
  console.console(f"[table3] done in {results['seconds'] / 60:.1f} min; wrote "
                  + ", ".join(written))
  for line in report.summary_lines(results):
    console.console(f"[table3] {line}")
  return results
