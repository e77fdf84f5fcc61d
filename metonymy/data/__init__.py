"""Data: the synthetic parts world, CUB / CelebA / CheXpert, a user's own folder, and pipelines.

  source = data.make_source("synthetic", None, "train", image_size=64, correlation=0.0)
  source = data.make_source("cub", "/data/CUB_200_2011", "train")
  source = data.make_source("folder", "/data/my_insects", "train")      # folder.py's format
  source = data.make_source("celeba", "/data/tensorflow_datasets", "val", source="tfds")
  report = data.check("celeba", "/data/celeba")      # base.CheckReport

Dataset modules are imported lazily, so the synthetic world needs neither PIL-heavy readers nor
the real datasets' dependencies.
"""

import importlib
from typing import Tuple

from metonymy.data.base import CheckReport, DataError, DatasetInfo

# name -> module under metonymy.data providing make_source(root, split, **options) and
# check(root, **options).
DATASETS = {
    "synthetic": "metonymy.data.synthetic",
    "cub": "metonymy.data.cub",
    "celeba": "metonymy.data.celeba",
    "chexpert": "metonymy.data.chexpert",
    "folder": "metonymy.data.folder",
}
# (name, source) -> module reading the same dataset from another on-disk form (config.data.source;
# "" = the dataset's own files above).
SOURCES = {
    ("celeba", "tfds"): "metonymy.data.celeba_tfds",
}


def names() -> Tuple[str, ...]:
  return tuple(DATASETS)


def _module(dataset: str, source: str = ""):
  if dataset not in DATASETS:
    raise ValueError(f"Unknown dataset {dataset!r}; known datasets are {sorted(DATASETS)}.")
  if source:
    if (dataset, source) not in SOURCES:
      known = sorted(s for d, s in SOURCES if d == dataset)
      raise ValueError(f"Dataset {dataset!r} has no source {source!r}; its sources are "
                       f"{[''] + known} ('' = its own files).")
    return importlib.import_module(SOURCES[dataset, source])
  return importlib.import_module(DATASETS[dataset])


def make_source(dataset: str, root, split: str, *, source: str = "", **options):
  """The random-access source of `split` (see base.py for what an example holds).

  `root` is the dataset folder (ignored by "synthetic"); `source` another on-disk form of the
  dataset (`SOURCES`, e.g. "tfds": `root` is a TFDS data_dir); `options` go to the dataset's
  module (SyntheticConfig fields for "synthetic"; e.g. the uncertainty policy for "chexpert").
  """
  return _module(dataset, source).make_source(root, split, **options)


def make_source_from_config(data_config, split: str):
  """`make_source` of `split` for a config.data block: its dataset, root, source ("" when the
  block has none) and options. The trainer, the leakage benchmark and the preflight open
  splits here.

  An empty root is refused naming the flag that sets it (the synthetic world reads no files);
  without the check each dataset would fail on its own missing first file.
  """
  if data_config.dataset != "synthetic" and not data_config.root:
    raise ValueError(f"config.data.root is empty: set --config.data.root=DIR to the "
                     f"{data_config.dataset} folder.")
  return make_source(data_config.dataset, data_config.root or None, split,
                     source=data_config.get("source", ""), **source_options(data_config))


def source_options(data_config) -> dict:
  """config.data.options as the plain dict of keyword options `make_source` takes."""
  options = data_config.get("options") or {}
  return options.to_dict() if hasattr(options, "to_dict") else dict(options)


def check(dataset: str, root, *, source: str = "", **options) -> CheckReport:
  """Validate a dataset folder (raises DataError naming the file / line that is wrong)."""
  return _module(dataset, source).check(root, **options)


__all__ = ["CheckReport", "DataError", "DatasetInfo", "DATASETS", "SOURCES", "check", "make_source",
           "make_source_from_config", "names", "source_options"]
