"""The entry point: `python -m metonymy.main --config=configs/<name>.py[:arg] --workdir=DIR`,
then any number of `--config.a.b=v` overrides.

main parses the flags and hands the config to launcher.launch, which checks it, its inputs and
the workdir, then runs the job its `job` field names (launcher.JOBS: each job is a module with
`run(config, workdir)`). Configs are locked: an override of a key that does not exist fails
and names the key. `--print_config` prints the resolved config (overrides applied) and exits
without running.
"""

import ast
import difflib
import logging
import os
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from metonymy import allocator
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


CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
USAGE = ("usage: python -m metonymy.main --config=configs/<name>.py[:arg] --workdir=DIR "
         "[--config.a.b=v ...] [--print_config]")


def config_list(folder: str = CONFIGS) -> str:
  """Every configs/*.py with the first line of its docstring, one per line."""
  lines = []
  for name in sorted(f for f in os.listdir(folder) if f.endswith(".py")):
    with open(os.path.join(folder, name)) as f:
      doc = ast.get_docstring(ast.parse(f.read())) or ""
    lines.append(f"  configs/{name:<28} {doc.strip().splitlines()[0] if doc.strip() else ''}")
  return "\n".join(lines)


def help_text() -> str:
  return (f"{USAGE}\n\nRuns the job a config names (launcher.JOBS) in DIR; docs/configs.md has "
          f"every config's :args and keys.\n\nconfigs:\n{config_list()}\n\nflags: --workdir, "
          "--print_config, --coordinator_address / --num_processes / --process_id (clusters); "
          "--helpfull lists absl's.")


def check_config_path(argv) -> None:
  """Raises ValueError naming the nearest configs when --config names a file that is not
  there (config_flags would print a traceback)."""
  spec = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
  if spec is None:
    raise ValueError("--config=configs/<name>.py is required.")
  path = spec.partition(":")[0]
  if not os.path.isfile(path):
    names = sorted(f"configs/{f}" for f in os.listdir(CONFIGS) if f.endswith(".py"))
    near = difflib.get_close_matches(path.replace(os.sep, "/").split("configs/")[-1],
                                     [n[len("configs/"):] for n in names], n=3, cutoff=0.5)
    hint = ("did you mean " + " or ".join(f"configs/{n}" for n in near) + "? "
            if near else "")
    raise ValueError(f"no config file {path}: {hint}`python -m metonymy.main --help` lists "
                     "them all.")


def check_overrides(argv) -> None:
  """The config's path and config_lib.check_overrides, as absl's usage error (one `error:`
  line from run())."""
  try:
    check_config_path(argv)
    config_lib.check_overrides(argv)
  except (FileNotFoundError, ValueError) as e:
    raise app.UsageError(str(e)) from e


def quiet_backend_probe() -> None:
  """JAX logs "Unable to initialize backend 'tpu'" at INFO on every machine without one; a
  CPU or GPU run has nothing to do about it."""
  logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)


def run():
  argv = sys.argv[1:]
  if not argv or any(a in ("--help", "-h", "-?", "--helpshort") for a in argv):
    print(help_text(), file=sys.stdout if argv else sys.stderr)
    return 0 if argv else 2
  flags.mark_flags_as_required(["config"])
  try:
    check_overrides(argv)
  except app.UsageError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  quiet_backend_probe()
  app.run(main)


if __name__ == "__main__":
  allocator.use_jemalloc("metonymy.main")  # where installed: twice the steps/s on CPUs
  sys.exit(run())
