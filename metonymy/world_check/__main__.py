"""The world check's command line, for a demo or Table-3 config without a workdir:

  python -m metonymy.world_check --config=configs/demo.py:world=v2 [--config.world.seed=1] \
      [--backbone=DIR] [--output=FILE.json]

The job (`python -m metonymy.main --config=configs/world_check.py --workdir=DIR`) is the same
measurement through the launcher's checks, with its report written to the workdir.
"""

import json
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from metonymy import console
from metonymy.world_check import measure


def _define_flags():
  """The command line's flags, defined when the command runs: importing this module (a test, a
  notebook, beside export_part_maps' own --config) defines none."""
  return {
      "config": config_flags.DEFINE_config_file(
          "config", None, "A demo or Table-3 config (configs/demo.py[:world=v2]); its `world` "
          "block is the world checked.", lock_config=True),
      "backbone": flags.DEFINE_string(
          "backbone", "", "A converted backbone folder for the mechanism probes (default: the "
          "world's shipped stand-in when its recipe matches; none: the probes are skipped)."),
      "split": flags.DEFINE_string("split", "val", "The split measured (val; test is for "
                                   "results)."),
      "train_images": flags.DEFINE_integer("train_images", 1500, "Training images the probes "
                                           "and the position baseline are fit on."),
      "images": flags.DEFINE_integer("images", 500, "Images of --split measured."),
      "seed": flags.DEFINE_integer("seed", 0, "Seed of the quarters and the k-means."),
      "output": flags.DEFINE_string("output", "", "Also write the numbers to this JSON file."),
  }


def main(argv, flag_values) -> int:
  del argv
  console.quiet_library_logs()
  value = {name: holder.value for name, holder in flag_values.items()}
  out = measure.check(value["config"], backbone=value["backbone"], split=value["split"],
              train_images=value["train_images"], images=value["images"], seed=value["seed"])
  print(measure.format_report(out), flush=True)
  if value["output"]:
    with open(value["output"], "w") as f:
      json.dump(out, f, indent=1)
  return 0


def command(argv=None) -> None:
  """The command line (argv: the flags; default sys.argv[1:])."""
  flag_values = _define_flags()
  argv = sys.argv[1:] if argv is None else list(argv)
  if any(a in ("--help", "-h", "--helpshort") for a in argv):
    # absl's own --help lists every library's flags and exits 1; these are the command's.
    print("usage: python -m metonymy.world_check --config=configs/demo.py[:world=v2] "
          "[--config.world.seed=N] [flags]\n\n" + (__doc__ or "").strip().split("\n\n")[0]
          + "\n\nflags:")
    for name in flag_values:
      flag = flags.FLAGS[name]
      print(f"  --{name} (default {flag.default!r}): {flag.help}")
    sys.exit(0)
  app.run(lambda args: main(args, flag_values), argv=[sys.argv[0]] + argv)


if __name__ == "__main__":
  command()
