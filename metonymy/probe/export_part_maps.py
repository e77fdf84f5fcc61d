r"""A trained part-discovery workdir's part maps, written as the file the leakage benchmark reads
(`masks.source="file"`), for every image of one split:

  python -m metonymy.probe.export_part_maps --config=configs/probe_cub.py \
      --config.data.root=/data/CUB_200_2011 --workdir=workdirs/cub_ste --split=test \
      --output=parts/cub_part_maps_{split}.npz
  python -m metonymy.main --config=configs/probe_cub.py --config.data.root=/data/CUB_200_2011 \
      --config.masks.source=file --config.masks.path=parts/cub_part_maps_{split}.npz --workdir=W

The format (probe/masks.py `FileMasks`): integer labels [N, H, W], N = every example of the
split in the dataset reader's order (the probe looks a map up by its example's index), value k
in 0..K-1 for discovered part k+1 and K for the background. H x W is the probe's evaluation crop
(`--config`'s data block and backbone: resize, centre crop, image size); the probe resizes a map
of another resolution with nearest neighbours. A `.npz` also records `num_parts` = K, so a part
that wins no pixel anywhere still counts; `{split}` in --output is replaced by the split.

The maps are exactly what `masks.source="stage1"` computes on the fly (the model's argmax over
its K + 1 maps in evaluation mode), so the benchmark gives the same numbers from either; the
file is for sharing the parts, or for running the benchmark without the trained model.
The workdir may be local or gs://.
"""

import sys

from absl import app
from absl import flags
from ml_collections import config_flags
import numpy as np

from metonymy import config_lib
from metonymy import console
from metonymy import data as data_lib
from metonymy import loading
from metonymy.data import pipeline as pipeline_lib
from metonymy.probe import benchmark
from metonymy.workdir import as_path


def _define_flags():
  """The command's flags, defined when it runs as a command: absl's flags are global, and
  `metonymy.main` (imported beside this module, e.g. in one test process) defines --config too."""
  return {
      "config": config_flags.DEFINE_config_file(
          "config", None, "A leakage-benchmark config (configs/probe_*.py): the data and the "
          "backbone whose evaluation crop the maps are aligned to.", lock_config=True),
      "workdir": flags.DEFINE_string("workdir", None,
                                     "The trained part-discovery run (local or gs://)."),
      "split": flags.DEFINE_string("split", "test", "The split to export."),
      "output": flags.DEFINE_string("output", None,
                                    ".npy or .npz to write; {split} -> the split."),
      "batch_size": flags.DEFINE_integer("batch_size", 32, "Images per forward pass."),
  }


def export(config, workdir, split: str, output: str, batch_size: int = 32) -> str:
  """Writes the part labels of every example of `split` to `output`; returns its path."""
  if not output.endswith((".npy", ".npz")):
    raise ValueError(f"--output={output!r}: part maps are written as a .npy or .npz file.")
  path = output.replace("{split}", split)
  trained = loading.load_trained_part_model(workdir)
  _, _, arch = loading.build_backbone(config.backbone, 0)
  source = data_lib.make_source_from_config(config.data, split)
  transforms = benchmark.eval_transforms(arch, config.data)
  size = int(config.data.image_size or arch.image_size)
  labels = np.zeros((len(source), size, size), np.uint8 if trained.num_parts < 255 else np.int16)
  seen = np.zeros(len(source), bool)
  batches = pipeline_lib.make_pipeline(source, batch_size=batch_size, train=False,
                                       transforms=transforms, shard_index=0, shard_count=1)
  for batch in batches:
    valid = np.asarray(batch["valid"], bool)
    index = np.asarray(batch["index"], np.int64)[valid]
    predicted, _ = trained.pixel_labels(np.asarray(batch["image"], np.float32),
                                        arch.image_mean, arch.image_std)
    labels[index] = np.asarray(predicted)[valid]
    seen[index] = True
  if not seen.all():
    raise RuntimeError(f"examples {np.flatnonzero(~seen)[:10].tolist()} of split {split!r} were "
                       f"never read; nothing was written.")
  target = as_path(path)
  target.parent.mkdir(parents=True, exist_ok=True)
  with target.open("wb") as f:
    if path.endswith(".npz"):
      np.savez_compressed(f, **{split: labels, "num_parts": np.int64(trained.num_parts)})
    else:
      np.save(f, labels)
  counts = np.bincount(labels.ravel(), minlength=trained.num_parts + 1)
  shares = " ".join(f"{c / counts.sum():.2f}" for c in counts)
  console.console(f"Wrote {path}: {len(source)} maps of {size}x{size}, K = {trained.num_parts} "
                  f"(pixel shares {shares}, background last), from {workdir} step "
                  f"{trained.meta['step']}.")
  return path


def main(argv, defined):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  for name in ("config", "workdir", "output"):
    if defined[name].value is None:
      raise app.UsageError(f"--{name} is required.")
  value = {name: flag.value for name, flag in defined.items()}
  try:
    export(value["config"], value["workdir"], value["split"], value["output"],
           value["batch_size"])
  except (FileNotFoundError, ValueError) as e:
    sys.exit(f"error: {e}")


def run():
  try:
    config_lib.check_overrides(sys.argv[1:])  # Unknown --config.x keys: one line, named.
  except (FileNotFoundError, ValueError) as e:
    sys.exit(f"error: {e}")
  defined = _define_flags()
  app.run(lambda argv: main(argv, defined))


if __name__ == "__main__":
  run()
