"""What a run reads, checked before it writes anything (the launcher, before the claim).

A missing dataset file or checkpoint found after the claim would leave a `config.json` that
refuses the next run of another config on the same workdir, over a run that never started. So
every input path the config names is checked first, and each problem becomes one `error:` line
naming the key and the path:

  backbone.checkpoint, backbones.<name>.checkpoint   exists (a converted folder, a PyTorch /
                                                     safetensors file or a Hugging Face folder)
  data.root with data.train_split / eval_split       the dataset's reader opens the split (it
    (training) or data.train / val / test (probe)    names the first missing or malformed file)
  masks.path (masks.source "file" or "stage1")       exists, for every split it names
  the probe job's backbone                           a checkpoint, unless random weights are
                                                     asked for (allow_random_backbone)

A path a sub-run records relative to its workdir ("workdir:../backbone", workdir/layout.py) is
checked where it points from the workdir the run is given. Nothing here writes; opening a split reads its annotation files (the readers do the same again
when the run starts, so a check costs seconds on CelebA's 200k lines, nothing on the others).
"""

import os
from typing import Iterator, List, Tuple

from metonymy import data as data_lib
from metonymy.workdir import Workdir
from metonymy.workdir import as_path
from metonymy.workdir import is_local
from metonymy.workdir import layout


class InputError(ValueError):
  """An input the run needs is missing or unreadable; the message names the key and the path."""


def _checkpoints(config) -> Iterator[Tuple[str, str]]:
  if "backbone" in config and config.backbone.get("checkpoint"):
    yield "backbone.checkpoint", config.backbone.checkpoint
  for name, backbone in (config.get("backbones") or {}).items():
    if backbone.get("checkpoint"):
      yield f"backbones.{name}.checkpoint", backbone.checkpoint


def _splits(data_config) -> List[str]:
  """The splits a data block names: a training block's train/eval splits, a probe block's
  train/val/test roles (val may be carved out of train: "")."""
  if "train_split" in data_config:
    names = [data_config.train_split, data_config.eval_split]
  else:
    names = [data_config.get(role, "") for role in ("train", "val", "test")]
  return list(dict.fromkeys(n for n in names if n))


def _probe_backbone_problems(config) -> List[str]:
  """The probe job's own refusals of its backbone, made here so that they come before the
  workdir is claimed: a single backbone without a checkpoint (a suite skips those), and a
  pretraining asked of a backbone that loads one."""
  found = []
  pretraining = config.get("backbone_pretraining")
  pretrains = pretraining is not None and int(pretraining.get("steps", 0)) > 0
  if "backbones" not in config and "backbone" in config:
    if not config.backbone.get("checkpoint") and not config.get("allow_random_backbone"):
      found.append("config.backbone.checkpoint is empty: the leakage benchmark measures a "
                   "pretrained backbone; pass --config.backbone.checkpoint=PATH (a converted "
                   "folder or a PyTorch / safetensors / Hugging Face checkpoint), or "
                   "--config.allow_random_backbone=True to measure random weights")
  if pretrains:
    for key, path in _checkpoints(config):
      found.append(f"config.backbone_pretraining.steps={pretraining.steps} pretrains "
                   f"random-init backbones only, but config.{key}={path!r} loads one")
  return found


def _world_check_problems(config, files) -> List[str]:
  """The world check's own refusals: the split it measures and the backbone it is given."""
  found = []
  options = config.world_check
  if options.split == "test":
    found.append("config.world_check.split='test': a world is checked on val; test is for "
                 "results only")
  if options.backbone and not as_path(files.resolve(options.backbone)).exists():
    found.append(f"config.world_check.backbone={options.backbone!r} does not exist (a converted "
                 f"backbone folder; '' takes the world's shipped stand-in)")
  return found


def problems(config, workdir) -> List[str]:
  """Every missing input of `config` run in `workdir`, one message each (empty: it can start)."""
  files = Workdir(workdir)
  found = []
  for key, path in _checkpoints(config):
    if not as_path(files.resolve(path)).exists():
      found.append(f"config.{key}={path!r} does not exist (convert a checkpoint with "
                   f"`python -m metonymy.converters convert --input FILE --output DIR`, or "
                   f"set it to '' for a random-init backbone)")
  if config.get("job") == "probe":
    found += _probe_backbone_problems(config)
  if config.get("job") == "world_check":
    found += _world_check_problems(config, files)
  data_config = config.get("data")
  if data_config is not None and data_config.get("dataset", "synthetic") != "synthetic":
    root = data_config.get("root", "")
    if root and not is_local(root):
      found.append(f"config.data.root={root!r}: the dataset readers read a local folder (they "
                   f"stat and seek their files); copy the dataset to the host's disk or mount "
                   f"the bucket (gcsfuse) and pass that path")
    elif root and not os.path.exists(root):
      found.append(f"config.data.root={root!r} does not exist")
    else:  # Opened as the run will open it (an empty root is refused there, naming the flag).
      for split in _splits(data_config):
        try:
          data_lib.make_source_from_config(data_config, split)
        except (data_lib.DataError, OSError, ValueError, KeyError, ImportError) as e:
          found.append(f"config.data.root={root!r}, split {split!r}: {e}" if root else str(e))
          break  # The next split would name the same missing file.
  masks = config.get("masks")
  if masks is not None and masks.get("source") in ("file", "stage1"):
    if not masks.get("path"):
      found.append(f"config.masks.path is empty: masks.source={masks.source!r} needs it")
    elif masks.source == "stage1" and not Workdir(files.resolve(masks.path)).is_training_workdir():
      found.append(f"config.masks.path={masks.path!r} is not a training workdir (it has no "
                   f"{layout.MODEL_FILE})")
    elif masks.source == "file":
      for split in _splits(data_config) if data_config is not None else [""]:
        path = files.resolve(masks.path).replace("{split}", split)
        if not as_path(path).is_file():
          found.append(f"config.masks.path={masks.path!r}: {path} does not exist")
  return found


def check(config, workdir) -> None:
  """Raises InputError with every problem (one per line) when the run cannot start."""
  found = problems(config, workdir)
  if found:
    raise InputError("\nerror: ".join(found))
