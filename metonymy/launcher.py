"""How every run starts, top or sub: `launch(config, workdir)`, in this order:

  1. the checks    the config names a known job, its sizes and rates are in range
                   (config_checks), and a single-host job runs as one process
  2. the preflight every input the config names exists (preflight), read from `workdir`
  3. the claim     the workdir's lock and config.json (workdir/claim.py)
  4. the staging   a single-host job's local copy of an object-store workdir (gs://)
  5. the job       JOBS[config.job].run(config, workdir), `workdir` a layout.Workdir handle

main.py parses the flags and calls `launch`. A sub-run (the demo's benchmark and trainings, a
Table-3 run) is launched on a handle made by its parent's `Workdir.sub`: the same checks, the
same config.json, no second lock (its parent holds the tree's), and no second staging (the
parent's handle is already the local copy), so a sub-run's files are those of a top run.
"""

import importlib
import os
from typing import Any, Dict, Optional

from absl import logging
import jax

from metonymy import allocator
from metonymy import config_checks
from metonymy import console
from metonymy import distributed
from metonymy import preflight
from metonymy.workdir import claim as workdir_claim
from metonymy.workdir import layout

# job name -> module with run(config, workdir).
JOBS = {
    "backbone_smoke": "metonymy.probe.smoke",
    "probe": "metonymy.runs.probe",  # Leakage benchmark: late vs early masked features, PS, MPPO.
    "train": "metonymy.training.trainer",  # Part discovery (Stage 1, two-stage) training.
    "demo": "metonymy.demo",  # The end-to-end story on the synthetic world.
    "table3": "metonymy.table3",  # Single- vs two-stage part discovery, paired run seeds.
    "world_check": "metonymy.world_check",  # Does a synthetic world host the claims it tests?
}
# Jobs that run on one host: the leakage benchmark's probes and reports are single-host work
# (the feature extraction uses that host's devices). Started as several processes they would
# repeat the same work and race on the same files, so they refuse.
SINGLE_PROCESS_JOBS = ("probe", "demo", "table3", "world_check")
# Jobs whose outputs (figures, caches, sub-runs) are written as local files: on an object-store
# workdir (gs://) they run in a local copy that is copied back when they end. Training writes
# to any workdir directly, from every host.
STAGED_JOBS = ("backbone_smoke",) + SINGLE_PROCESS_JOBS
# Jobs that may run without --workdir: each has one config family, and the claim refuses a
# default workdir holding another config's run. Training and the benchmark need --workdir.
DEFAULT_WORKDIRS = {"demo": os.path.join("workdirs", "demo"),
                    "backbone_smoke": os.path.join("workdirs", "backbone_smoke")}


class NotStarted(RuntimeError):
  """A check, the preflight or the claim refused the run before it wrote anything; the message
  is one or more sentences, each worth an `error:` line."""


def _check(config) -> None:
  """Step 1 but the process count: a known job, and sizes and rates in range."""
  if "job" not in config:
    raise NotStarted(f"The config has no `job` field; known jobs: {sorted(JOBS)}.")
  if config.job not in JOBS:
    raise NotStarted(f"Unknown job {config.job!r}; known jobs: {sorted(JOBS)}.")
  try:
    config_checks.check(config)
  except ValueError as e:
    raise NotStarted(str(e)) from None


def _check_hosts(config) -> None:
  if config.job in SINGLE_PROCESS_JOBS and jax.process_count() > 1:
    raise NotStarted(
        f"The {config.job!r} job runs on one host, but this is process {jax.process_index()} of "
        f"{jax.process_count()}: start it as one process (not with launch/local.sh N > 1 or a "
        f"multi-task SLURM job). Multi-host jobs: {sorted(set(JOBS) - set(SINGLE_PROCESS_JOBS))}.")


def launch(config, workdir, cluster: Optional[Dict[str, Any]] = None) -> Any:
  """Runs `config`'s job in `workdir` after the checks, the preflight and the claim; returns what
  the job returns. Raises NotStarted when one of those refuses, before anything is written.

  workdir: a path (None: the job's DEFAULT_WORKDIRS entry, where it has one), or a sub-run's
    handle from its parent's `Workdir.sub`.
  cluster: distributed.initialize's arguments (main's --coordinator_address etc.) for a top run;
    a sub-run runs in its parent's processes.
  """
  _check(config)
  if workdir is None:
    workdir = DEFAULT_WORKDIRS.get(config.job)
    if workdir is None:
      raise NotStarted(
          f"--workdir=DIR is required for the {config.job!r} job: it writes checkpoints and "
          f"outputs there, and a shared default would mix runs of different configs.")
  files = layout.Workdir(workdir)
  try:  # Every input exists before the workdir is claimed or written.
    preflight.check(config, files)
  except preflight.InputError as e:
    raise NotStarted(str(e)) from None
  if not files.is_sub_run:
    distributed.initialize(**(cluster or {}))
  _check_hosts(config)
  lock = None
  try:  # Locked, and the config checked, before anything is written into the workdir.
    if files.is_sub_run:  # Its parent holds the tree's lock.
      workdir_claim.record_config(files, config)
    else:
      lock = workdir_claim.claim(files, config)
  except (workdir_claim.WorkdirBusyError, workdir_claim.ConfigMismatchError) as e:
    raise NotStarted(str(e)) from None
  try:
    job = importlib.import_module(JOBS[config.job])
    if not files.is_sub_run:
      console.quiet_library_logs()  # Every job's console: our lines, the libraries' warnings.
      logging.info("Running job %s in %s (host allocator: %s)", config.job, files,
                   allocator.name())
    if config.job in STAGED_JOBS and not files.is_local:  # Single-host writers of local files.
      with layout.staged_locally(files) as local:
        return job.run(config, layout.Workdir(local))
    return job.run(config, files)
  finally:
    if lock is not None:
      lock.release()
