"""Data: the synthetic parts world and the CUB / CelebA / CheXpert sources and pipelines.

  source = data.make_source("synthetic", None, "train", image_size=64, correlation=0.0)
  source = data.make_source("cub", "/data/CUB_200_2011", "train")
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
}


def names() -> Tuple[str, ...]:
  return tuple(DATASETS)


def _module(dataset: str):
  if dataset not in DATASETS:
    raise ValueError(f"Unknown dataset {dataset!r}; known datasets are {sorted(DATASETS)}.")
  return importlib.import_module(DATASETS[dataset])


def make_source(dataset: str, root, split: str, **options):
  """The random-access source of `split` (see base.py for what an example holds).

  `root` is the dataset folder (ignored by "synthetic"); `options` go to the dataset's module
  (SyntheticConfig fields for "synthetic"; e.g. the uncertainty policy for "chexpert").
  """
  return _module(dataset).make_source(root, split, **options)


def check(dataset: str, root, **options) -> CheckReport:
  """Validate a dataset folder (raises DataError naming the file / line that is wrong)."""
  return _module(dataset).check(root, **options)


__all__ = ["CheckReport", "DataError", "DatasetInfo", "DATASETS", "check", "make_source", "names"]
