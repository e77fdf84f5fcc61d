"""The entry point: `python -m metonymy.main --config=configs/<name>.py[:arg] --workdir=DIR`,
then any number of `--config.a.b=v` overrides.

The config's `job` field names what to run; each job is a module with `run(config, workdir)`.
Configs are locked: an override of a key that does not exist fails and names the key.
`--print_config` prints the resolved config (overrides applied) and exits without running.
"""

import importlib
import os
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from metonymy import console
from metonymy import config_checks
from metonymy import config_lib
from metonymy import distributed
from metonymy import preflight
from metonymy.workdir import claim as workdir_claim
from metonymy.workdir import layout as workdir_layout

# config_flags calls the file's get_config(arg) as config_lib.load_config does, then applies the
# --config.a.b=v overrides.
_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a configs/*.py file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where outputs, logs and checkpoints go.")
_PRINT_CONFIG = flags.DEFINE_bool("print_config", False,
                                  "Print the resolved config (after --config.a=b) and exit.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None,
                                   "host:port of process 0, for clusters JAX does not detect.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "With --coordinator_address.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "With --coordinator_address.")

# job name -> module with run(config, workdir).
JOBS = {
    "backbone_smoke": "metonymy.probe.smoke",
    "probe": "metonymy.probe",  # Leakage benchmark: late vs early masked features, PS, MPPO.
    "train": "metonymy.training.trainer",  # Part discovery (Stage 1, two-stage) training.
    "demo": "metonymy.demo",  # The end-to-end story on the synthetic world.
    "table3": "metonymy.table3",  # Single- vs two-stage part discovery, paired run seeds.
}
# Jobs that run on one host: the leakage benchmark's probes and reports are single-host work
# (the feature extraction uses that host's devices). Started as several processes they would
# repeat the same work and race on the same files, so they refuse.
SINGLE_PROCESS_JOBS = ("probe", "demo", "table3")
# Jobs whose outputs (figures, caches, sub-runs) are written as local files: on an object-store
# workdir (gs://) they run in a local copy that is copied back when they end. Training writes
# to any workdir directly, from every host.
STAGED_JOBS = ("backbone_smoke",) + SINGLE_PROCESS_JOBS
# Jobs that may run without --workdir: each has one config family, and workdir_claim refuses a
# default workdir holding another config's run. Training and the benchmark need --workdir.
DEFAULT_WORKDIRS = {"demo": os.path.join("workdirs", "demo"),
                    "backbone_smoke": os.path.join("workdirs", "backbone_smoke")}


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  if config is None:
    raise app.UsageError("--config=configs/<name>.py is required.")
  if _PRINT_CONFIG.value:
    print(config, end="")
    return
  if "job" not in config:
    raise app.UsageError(f"The config has no `job` field; known jobs: {sorted(JOBS)}.")
  if config.job not in JOBS:
    raise app.UsageError(f"Unknown job {config.job!r}; known jobs: {sorted(JOBS)}.")
  try:
    config_checks.check(config)
    preflight.check(config)  # Every input exists before the workdir is claimed or written.
  except ValueError as e:
    sys.exit(f"error: {e}")
  distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  import jax  # After initialize(): asking for the process count starts the backend.
  if config.job in SINGLE_PROCESS_JOBS and jax.process_count() > 1:
    raise app.UsageError(
        f"The {config.job!r} job runs on one host, but this is process {jax.process_index()} of "
        f"{jax.process_count()}: start it as one process (not with launch/local.sh N > 1 or a "
        f"multi-task SLURM job). Multi-host jobs: {sorted(set(JOBS) - set(SINGLE_PROCESS_JOBS))}.")
  workdir = _WORKDIR.value or DEFAULT_WORKDIRS.get(config.job)
  if workdir is None:
    raise app.UsageError(
        f"--workdir=DIR is required for the {config.job!r} job: it writes checkpoints and "
        f"outputs there, and a shared default would mix runs of different configs.")
  try:  # Locked, and the config checked, before anything is written into the workdir.
    lock = workdir_claim.claim(workdir, config)
  except (workdir_claim.WorkdirBusyError, workdir_claim.ConfigMismatchError) as e:
    sys.exit(f"error: {e}")
  console.quiet_library_logs()  # Every job's console: our lines, the libraries' warnings.
  try:
    logging.info("Running job %s in %s", config.job, workdir)
    job = importlib.import_module(JOBS[config.job])
    if config.job in STAGED_JOBS:  # Single-host writers of local files: gs:// via a copy.
      with workdir_layout.staged_locally(workdir) as local:
        job.run(config, local)
    else:
      job.run(config, workdir)
  finally:
    if lock is not None:
      lock.release()


def check_overrides(argv) -> None:
  """config_lib.check_overrides, as absl's usage error (one `error:` line from run())."""
  try:
    config_lib.check_overrides(argv)
  except (FileNotFoundError, ValueError) as e:
    raise app.UsageError(str(e)) from e


def run():
  flags.mark_flags_as_required(["config"])
  try:
    check_overrides(sys.argv[1:])
  except app.UsageError as e:
    sys.exit(f"error: {e}")
  app.run(main)


if __name__ == "__main__":
  sys.exit(run())
