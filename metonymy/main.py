"""The entry point: `python -m metonymy.main --config=configs/<name>.py[:arg] --workdir=DIR`,
then any number of `--config.a.b=v` overrides.

main parses the flags and hands the config to launcher.launch, which checks it, its inputs and
the workdir, then runs the job its `job` field names (launcher.JOBS: each job is a module with
`run(config, workdir)`). Configs are locked: an override of a key that does not exist fails
and names the key. `--print_config` prints the resolved config (overrides applied) and exits
without running.
"""

import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from metonymy import config_lib
from metonymy import launcher

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


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  if config is None:
    raise app.UsageError("--config=configs/<name>.py is required.")
  if _PRINT_CONFIG.value:
    print(config, end="")
    return
  try:
    launcher.launch(config, _WORKDIR.value, cluster={"coordinator_address": _COORDINATOR.value,
                                                     "num_processes": _NUM_PROCESSES.value,
                                                     "process_id": _PROCESS_ID.value})
  except launcher.NotStarted as e:
    sys.exit(f"error: {e}")


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
