"""CheXpert (`CheXpert-v1.0` or `CheXpert-v1.0-small`) with CheXlocalize masks.

CheXpert layout: `train.csv`, `valid.csv` and, if present, `test.csv` inside the dataset folder;
`root` may be that folder or its parent. Columns `Path, Sex, Age, Frontal/Lateral, AP/PA` and the
14 observations (`groupings.CHEXPERT_OBSERVATIONS`); only `Path` and the 10 localized tasks are
required (CheXlocalize's test CSV has no `Frontal/Lateral`: the file name decides then).

The test split's labels come with CheXlocalize, whose download ships them as
`CheXpert/test_labels.csv` (images in `CheXpert/test/`) beside its `CheXlocalize/` folder. They
are read from the first of `split_csv_candidates`: `<dataset>/test.csv`, then `test_labels.csv`
in `<chexlocalize_dir>/../CheXpert` (when given), `<dataset parent>/CheXpert`,
`<dataset>/CheXpert`, `<dataset>`: the download unpacked beside the CheXpert folder is read where
it lies.

`Path` is relative to the dataset's parent (`CheXpert-v1.0-small/train/patient00001/...`). Its first
component is replaced by the folder actually found, so a renamed folder still works, and a `Path`
without that component (`test/patient64741/...`, as in CheXlocalize's test labels) is taken
relative to the folder holding the CSV.

Labels: 1 positive, 0 negative, blank = not mentioned = 0, -1 uncertain, handled by `uncertainty`:
  "ignore" (default): attribute 0 and attribute_valid False, so losses and metrics skip it;
  "zeros" / "ones": the label becomes 0 / 1 (valid).
The paper does not say which policy it used.

CheXlocalize: `gt_segmentations_val.json` (for split `valid`) and `gt_segmentations_test.json`
(for `test`), each `{cxr_id: {task: {"size": [h, w], "counts": "<COCO compressed RLE>"}}}` at the
original resolution. `cxr_id` is the image path's last three components without the extension:
`.../valid/patient64541/study1/view1_frontal.jpg` -> `patient64541_study1_view1_frontal`. The JSON
name "Airspace Opacity" is the CSV's "Lung Opacity". Where the JSONs live: `chexlocalize_dir=` if
given, else the first folder holding the split's JSON among
  <dataset parent>/CheXlocalize, <dataset>/CheXlocalize, <dataset parent>, <dataset>.
The RLE codec is implemented here in NumPy (no pycocotools needed).

One example (`base` contract):
  image            uint8   [H, W, 3]   the grayscale radiograph repeated to RGB
  attributes       float32 [10]        `groupings.CHEXPERT_TASKS`, after the uncertainty policy
  attribute_valid  bool    [10]
  masks            bool    [10, H, W]  (with masks) nearest-resized to the image; a task missing
                                       from the JSON, or an image missing from it, is all zero
  has_masks        bool    []          (with masks) whether the image is in the CheXlocalize JSON
  index            int64   []
"""

import csv
import dataclasses
import functools
import json
import os
from pathlib import Path, PurePosixPath
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from metonymy.data import base
from metonymy.data import groupings
from metonymy.data.files import (check_split, example_index, load_rgb, require_file,
                                 verify_split_images)
from metonymy.evaluation import patch_grid

SPLITS: Tuple[str, ...] = ("train", "valid", "test")
DATASET_DIRS: Tuple[str, ...] = ("CheXpert-v1.0-small", "CheXpert-v1.0")
MASK_FILES: Dict[str, str] = {"valid": "gt_segmentations_val.json",
                              "test": "gt_segmentations_test.json"}
UNCERTAINTY_POLICIES: Tuple[str, ...] = ("ignore", "zeros", "ones")
# CheXlocalize's download: CheXpert/{test_labels.csv, test/} beside CheXlocalize/*.json.
CHEXLOCALIZE_LABELS_DIR = "CheXpert"
CHEXLOCALIZE_LABELS: Dict[str, str] = {"test": "test_labels.csv"}

PathLike = Union[str, os.PathLike]

# ------------------------------------------------------------------------------------------------
# COCO compressed RLE (pycocotools' maskApi.c `rleToString` / `rleFrString`), in NumPy.
#
# A mask [h, w] is flattened in column-major (Fortran) order into runs that alternate 0, 1, 0, ...
# starting with a (possibly empty) run of 0s. Each count is written as 5-bit groups, low first,
# as chars 48 + group (| 0x20 when more groups follow); from the third count on, the difference to
# the count two before is written instead, sign-extended from the last group's bit 0x10.


def rle_counts_to_string(counts: Sequence[int]) -> str:
  chars = []
  for i, x in enumerate(counts):
    x = int(x)
    if i > 2:
      x -= int(counts[i - 2])
    more = True
    while more:
      c = x & 0x1F
      x >>= 5
      more = (x != -1) if (c & 0x10) else (x != 0)
      if more:
        c |= 0x20
      chars.append(chr(c + 48))
  return "".join(chars)


def rle_counts_from_string(s: str) -> np.ndarray:
  """Run lengths int64 [R] from a compressed RLE string. Raises ValueError on a bad string."""
  counts: List[int] = []
  p, n = 0, len(s)
  while p < n:
    x = k = 0
    more = True
    while more:
      if p >= n:
        raise ValueError("RLE string ends inside a count")
      c = ord(s[p]) - 48
      if not 0 <= c < 64:
        raise ValueError(f"character {s[p]!r} at {p} is not an RLE character")
      x |= (c & 0x1F) << (5 * k)
      more = bool(c & 0x20)
      p += 1
      k += 1
      if not more and (c & 0x10):
        x |= -1 << (5 * k)
    if len(counts) > 2:
      x += counts[-2]
    if x < 0:
      raise ValueError(f"negative run length {x} at count {len(counts)}")
    counts.append(x)
  return np.asarray(counts, np.int64)


def rle_encode(mask: np.ndarray) -> Dict:
  """bool [h, w] -> {"size": [h, w], "counts": str}, as pycocotools `mask.encode` (str counts)."""
  mask = np.asarray(mask, bool)
  h, w = mask.shape
  flat = mask.ravel(order="F")
  if flat.size == 0:
    return {"size": [h, w], "counts": rle_counts_to_string([0])}
  change = np.flatnonzero(flat[1:] != flat[:-1]) + 1
  runs = np.diff(np.concatenate([[0], change, [flat.size]]))
  if flat[0]:
    runs = np.concatenate([[0], runs])  # Runs start with 0s, even an empty run of them.
  return {"size": [int(h), int(w)], "counts": rle_counts_to_string(runs.tolist())}


def _rle_counts(rle) -> Tuple[int, int, np.ndarray]:
  """Validated (h, w, counts) from a {"size", "counts"} dict; counts may be str or a list."""
  if not isinstance(rle, dict) or "size" not in rle or "counts" not in rle:
    raise ValueError("expected {'size': [h, w], 'counts': ...}")
  h, w = (int(v) for v in rle["size"])
  counts = rle["counts"]
  if isinstance(counts, bytes):
    counts = counts.decode("ascii")
  counts = rle_counts_from_string(counts) if isinstance(counts, str) else np.asarray(counts,
                                                                                     np.int64)
  if (counts < 0).any() or int(counts.sum()) != h * w:
    raise ValueError(f"run lengths sum to {int(counts.sum())}, size {h}x{w} needs {h * w}")
  return h, w, counts


def rle_decode(rle, out_size: Optional[Tuple[int, int]] = None) -> np.ndarray:
  """COCO RLE -> bool [h, w], or nearest-resized to `out_size` (H, W) without building [h, w].

  Nearest sampling takes, for output pixel (i, j), source pixel
  (floor((i + 0.5) h / H), floor((j + 0.5) w / W)), as `patch_grid.resize_nearest`.
  """
  h, w, counts = _rle_counts(rle)
  if out_size is None or tuple(out_size) == (h, w):
    values = (np.arange(len(counts)) % 2).astype(bool)
    return np.repeat(values, counts).reshape((h, w), order="F")
  rows, cols = (patch_grid.nearest_index(h, out_size[0]),
                patch_grid.nearest_index(w, out_size[1]))
  if len(counts) <= 1:
    return np.zeros(tuple(out_size), bool)  # All background: the common case, nothing to look up.
  flat = cols[None, :] * h + rows[:, None]  # Column-major position of each sampled pixel.
  run = np.searchsorted(np.cumsum(counts), flat, side="right")
  return (run % 2).astype(bool)


# ------------------------------------------------------------------------------------------------
# Files.


def find_dataset_dir(root: PathLike) -> Path:
  """`root` itself when it holds a CheXpert CSV, else `root/CheXpert-v1.0-small` or
  `root/CheXpert-v1.0` (the small one first when both exist: pass the folder to pick)."""
  root = Path(root)
  candidates = [root] + [root / d for d in DATASET_DIRS]
  for c in candidates:
    if (c / "valid.csv").is_file() or (c / "train.csv").is_file():
      return c
  raise base.DataError(f"missing required file: {root / 'valid.csv'} (nor in "
                       + ", ".join(str(root / d) for d in DATASET_DIRS) + ")")


def image_file(csv_dir: Path, csv_path: str) -> Path:
  """A CSV's `Path` as a file: relative to the folder holding the CSV, whose own name (the
  `Path`'s first component, when it has one) may differ from the one written."""
  parts = PurePosixPath(csv_path.replace("\\", "/")).parts
  if parts and parts[0].startswith("CheXpert"):
    parts = parts[1:]
  return csv_dir.joinpath(*parts)


def split_csv_candidates(dataset_dir: Path, split: str,
                         chexlocalize_dir: Optional[PathLike] = None) -> List[Path]:
  """Where a split's labels CSV may be, in the order looked at: CheXpert's `<split>.csv`, then
  (test) CheXlocalize's `test_labels.csv` where its download puts it."""
  candidates = [dataset_dir / f"{split}.csv"]
  if split in CHEXLOCALIZE_LABELS:
    dirs = [Path(chexlocalize_dir).parent / CHEXLOCALIZE_LABELS_DIR] if chexlocalize_dir else []
    dirs += [dataset_dir.parent / CHEXLOCALIZE_LABELS_DIR, dataset_dir / CHEXLOCALIZE_LABELS_DIR,
             dataset_dir]
    candidates += [d / CHEXLOCALIZE_LABELS[split] for d in dirs]
  return candidates


def find_split_csv(dataset_dir: Path, split: str,
                   chexlocalize_dir: Optional[PathLike] = None) -> Optional[Path]:
  for candidate in split_csv_candidates(dataset_dir, split, chexlocalize_dir):
    if candidate.is_file():
      return candidate
  return None


def require_split_csv(dataset_dir: Path, split: str,
                      chexlocalize_dir: Optional[PathLike] = None) -> Path:
  found = find_split_csv(dataset_dir, split, chexlocalize_dir)
  if found is not None:
    return found
  candidates = split_csv_candidates(dataset_dir, split, chexlocalize_dir)
  if len(candidates) == 1:
    return require_file(candidates[0])
  raise base.DataError(
      f"missing required file: {candidates[0]} (CheXpert's layout), nor CheXlocalize's "
      f"{CHEXLOCALIZE_LABELS[split]} as its download ships it (in its {CHEXLOCALIZE_LABELS_DIR}/ "
      f"folder, beside the {split}/ images): looked for "
      + ", ".join(str(c) for c in candidates[1:]))


def cxr_id(csv_path: str) -> str:
  """The CheXlocalize id of a CSV path: its last three components without the extension.

  `CheXpert-v1.0/valid/patient64541/study1/view1_frontal.jpg`
    -> `patient64541_study1_view1_frontal`.
  """
  parts = PurePosixPath(csv_path.replace("\\", "/")).parts[-3:]
  return "_".join(parts[:-1] + (PurePosixPath(parts[-1]).stem,))


def find_mask_file(dataset_dir: Path, split: str,
                   chexlocalize_dir: Optional[PathLike] = None) -> Optional[Path]:
  if split not in MASK_FILES:
    return None
  name = MASK_FILES[split]
  if chexlocalize_dir is not None:
    dirs = [Path(chexlocalize_dir)]
  else:
    dirs = [dataset_dir.parent / "CheXlocalize", dataset_dir / "CheXlocalize", dataset_dir.parent,
            dataset_dir]
  for d in dirs:
    if (d / name).is_file():
      return d / name
  return None


@dataclasses.dataclass
class CsvTable:
  path: Path
  paths: List[str]  # the CSV's Path column
  labels: np.ndarray  # int8 [N, 10]: 1, 0, -1 (blank -> 0)
  frontal: np.ndarray  # bool [N]
  num_uncertain: int


_LABELS = {"": 0, "1": 1, "1.0": 1, "0": 0, "0.0": 0, "-1": -1, "-1.0": -1}


def read_csv(path: Path) -> CsvTable:
  require_file(path)
  stamp = (path.stat().st_mtime_ns, path.stat().st_size)
  return _read_csv_cached(path, stamp)


@functools.lru_cache(maxsize=4)
def _read_csv_cached(path: Path, stamp: Tuple) -> CsvTable:
  del stamp  # Cache key only.
  with open(path, "r", encoding="utf-8", newline="") as f:
    reader = csv.reader(f)
    header = next(reader, None)
    if header is None:
      raise base.DataError(f"{path}:1: empty file, expected a header")
    header = [h.strip() for h in header]
    needed = ["Path"] + list(groupings.CHEXPERT_TASKS)
    missing = [c for c in needed if c not in header]
    if missing:
      raise base.DataError(f"{path}:1: malformed header, column {missing[0]!r} missing")
    path_col = header.index("Path")
    task_cols = [header.index(t) for t in groupings.CHEXPERT_TASKS]
    view_col = header.index("Frontal/Lateral") if "Frontal/Lateral" in header else None
    paths, labels, frontal = [], [], []
    for row in reader:
      lineno = reader.line_num
      if not row or (len(row) == 1 and not row[0].strip()):
        continue
      if len(row) != len(header):
        raise base.DataError(f"{path}:{lineno}: malformed line, expected {len(header)} fields, "
                             f"got {len(row)}")
      values = []
      for t, c in zip(groupings.CHEXPERT_TASKS, task_cols):
        v = _LABELS.get(row[c].strip())
        if v is None:
          raise base.DataError(f"{path}:{lineno}: malformed line, {t} is {row[c]!r}, expected "
                               "1, 0, -1 or blank")
        values.append(v)
      p = row[path_col].strip()
      if not p:
        raise base.DataError(f"{path}:{lineno}: malformed line, empty Path")
      if view_col is not None:
        view = row[view_col].strip()
        if view not in ("Frontal", "Lateral"):
          raise base.DataError(f"{path}:{lineno}: malformed line, Frontal/Lateral is {view!r}")
        frontal.append(view == "Frontal")
      else:
        frontal.append("frontal" in PurePosixPath(p).name.lower())
      paths.append(p)
      labels.append(values)
  labels = np.asarray(labels, np.int8).reshape(-1, len(groupings.CHEXPERT_TASKS))
  return CsvTable(path, paths, labels, np.asarray(frontal, bool), int((labels == -1).sum()))


@functools.lru_cache(maxsize=4)
def _read_masks_cached(path: Path, stamp: Tuple) -> Dict[str, Dict[str, dict]]:
  """{cxr_id: {CSV task name: rle}}, structure checked (the run lengths are checked lazily)."""
  del stamp
  try:
    with open(path, "r", encoding="utf-8") as f:
      data = json.load(f)
  except (OSError, ValueError) as e:
    raise base.DataError(f"malformed CheXlocalize file {path}: {e}") from None
  if not isinstance(data, dict):
    raise base.DataError(f"malformed CheXlocalize file {path}: expected an object of cxr_ids")
  csv_name = {j: c for c, j in zip(groupings.CHEXPERT_TASKS, groupings.CHEXLOCALIZE_TASKS)}
  out = {}
  for image_id, tasks in data.items():
    if not isinstance(tasks, dict):
      raise base.DataError(f"malformed CheXlocalize file {path}: {image_id!r} is not an object")
    entry = {}
    for task, rle in tasks.items():
      name = csv_name.get(task, task if task in groupings.CHEXPERT_TASKS else None)
      if name is None:
        raise base.DataError(f"malformed CheXlocalize file {path}: unknown task {task!r} "
                             f"for {image_id!r}")
      if not isinstance(rle, dict) or "size" not in rle or "counts" not in rle:
        raise base.DataError(f"malformed CheXlocalize file {path}: {image_id!r} / {task!r} is "
                             "not {'size', 'counts'}")
      entry[name] = rle
    out[image_id] = entry
  return out


def read_masks(path: Path) -> Dict[str, Dict[str, dict]]:
  require_file(path)
  return _read_masks_cached(path, (path.stat().st_mtime_ns, path.stat().st_size))


# ------------------------------------------------------------------------------------------------
# Source and check.


def dataset_info() -> base.DatasetInfo:
  return base.DatasetInfo(
      name="chexpert",
      attribute_names=groupings.CHEXPERT_TASKS,
      part_names=groupings.CHEXPERT_PARTS,
      attribute_part=tuple(range(len(groupings.CHEXPERT_TASKS))),
      keypoint_groups=(),
      mask_tasks=groupings.CHEXPERT_TASKS)


def apply_policy(labels: np.ndarray, uncertainty: str) -> Tuple[np.ndarray, np.ndarray]:
  """int8 [..., T] in {1, 0, -1} -> (float32 attributes, bool valid) under an uncertainty policy."""
  if uncertainty not in UNCERTAINTY_POLICIES:
    raise ValueError(f"uncertainty must be one of {UNCERTAINTY_POLICIES}, not {uncertainty!r}")
  is_uncertain = labels == -1
  attributes = (labels == 1).astype(np.float32)
  valid = np.ones(labels.shape, bool)
  if uncertainty == "ignore":
    valid = ~is_uncertain
  elif uncertainty == "ones":
    attributes[is_uncertain] = 1.0
  return attributes, valid


class ChexpertSource:
  """Random-access source over one split (`train` / `valid` / `test`) of CheXpert."""

  def __init__(self, root: PathLike, split: str, *, uncertainty: str = "ignore",
               frontal_only: bool = False, masks: Optional[bool] = None,
               chexlocalize_dir: Optional[PathLike] = None):
    check_split(split, SPLITS, "CheXpert")
    self.split = split
    self.dataset_dir = find_dataset_dir(root)
    self.csv_file = require_split_csv(self.dataset_dir, split, chexlocalize_dir)
    table = read_csv(self.csv_file)
    keep = table.frontal if frontal_only else np.ones(len(table.paths), bool)
    rows = np.flatnonzero(keep)
    self.csv_paths = [table.paths[r] for r in rows]
    self.labels = table.labels[rows]  # int8 [N, 10], before the policy.
    self._attributes, self._valid = apply_policy(self.labels, uncertainty)
    self.mask_file = find_mask_file(self.dataset_dir, split, chexlocalize_dir)
    if masks is None:
      masks = self.mask_file is not None
    if masks and self.mask_file is None and split in MASK_FILES:
      where = chexlocalize_dir if chexlocalize_dir is not None else (
          f"{self.dataset_dir.parent / 'CheXlocalize'} or beside {self.dataset_dir}")
      raise base.DataError(f"missing required file: {MASK_FILES[split]} (looked in {where})")
    self.with_masks = bool(masks)
    self._masks = read_masks(self.mask_file) if (masks and self.mask_file) else {}
    self.cxr_ids = [cxr_id(p) for p in self.csv_paths]
    self._info = dataset_info()

  @property
  def info(self) -> base.DatasetInfo:
    return self._info

  def __len__(self) -> int:
    return len(self.csv_paths)

  def image_path(self, i: int) -> Path:
    return image_file(self.csv_file.parent, self.csv_paths[i])

  def num_with_masks(self) -> int:
    return sum(1 for c in self.cxr_ids if c in self._masks)

  def masks_for(self, i: int, size: Tuple[int, int]) -> Tuple[np.ndarray, bool]:
    """bool [10, H, W] ground truth of example i resized to `size`, and whether it exists."""
    entry = self._masks.get(self.cxr_ids[i])
    out = np.zeros((len(groupings.CHEXPERT_TASKS),) + tuple(size), bool)
    if entry is None:
      return out, False
    for t, task in enumerate(groupings.CHEXPERT_TASKS):
      if task in entry:
        try:
          out[t] = rle_decode(entry[task], size)
        except (ValueError, TypeError) as e:
          raise base.DataError(f"malformed CheXlocalize mask in {self.mask_file}: "
                               f"{self.cxr_ids[i]!r} / {task!r}: {e}") from None
    return out, True

  def __getitem__(self, i) -> Dict[str, np.ndarray]:
    i = example_index(i, len(self), f"CheXpert {self.split}")
    image = load_rgb(self.image_path(i))
    example = {
        "image": image,
        "attributes": self._attributes[i].copy(),
        "attribute_valid": self._valid[i].copy(),
        "index": np.asarray(i, np.int64),
    }
    if self.with_masks:
      masks, has = self.masks_for(i, image.shape[:2])
      example["masks"] = masks
      example["has_masks"] = np.asarray(has, bool)
    return example


def make_source(root: PathLike, split: str, *, uncertainty: str = "ignore",
                frontal_only: bool = False, masks: Optional[bool] = None,
                chexlocalize_dir: Optional[PathLike] = None) -> ChexpertSource:
  """CheXpert split `train`, `valid` or `test`.

  Args:
    uncertainty: policy for -1 labels: "ignore" (invalid), "zeros" or "ones".
    frontal_only: keep frontal views only.
    masks: emit `masks` / `has_masks`. None: when the split's CheXlocalize JSON is found. True:
      always (the JSON is then required for valid/test; train gets all-zero masks). False: never.
    chexlocalize_dir: the folder holding gt_segmentations_{val,test}.json (default: searched);
      the test labels are also looked for in its sibling CheXpert/ (split_csv_candidates).
  """
  return ChexpertSource(root, split, uncertainty=uncertainty, frontal_only=frontal_only, masks=masks,
                        chexlocalize_dir=chexlocalize_dir)


def check(root: PathLike, *, uncertainty: str = "ignore", frontal_only: bool = False,
          chexlocalize_dir: Optional[PathLike] = None, verify_images: int = 16, progress=None
          ) -> base.CheckReport:
  """Reads train.csv and valid.csv (required), the test labels (if found: test.csv or
  CheXlocalize's CheXpert/test_labels.csv, see split_csv_candidates) and the CheXlocalize JSONs
  (if found; every run length is checked), checks every image exists and decodes the first
  `verify_images` of each split (all when negative; every bad image is listed, `progress` as in
  files.verify_split_images)."""
  dataset_dir = find_dataset_dir(root)
  for name in ("train.csv", "valid.csv"):
    require_file(dataset_dir / name)
  splits = [s for s in SPLITS if find_split_csv(dataset_dir, s, chexlocalize_dir) is not None]
  sources = {s: ChexpertSource(dataset_dir, s, uncertainty=uncertainty, frontal_only=frontal_only,
                               chexlocalize_dir=chexlocalize_dir) for s in splits}
  warnings: List[str] = []
  num_masks = 0
  for s, src in sources.items():
    n_unc = int((src.labels == -1).sum())
    if n_unc:
      warnings.append(f"{s}: {n_unc} uncertain (-1) label(s), policy {uncertainty!r}")
    if s not in MASK_FILES:
      continue
    if src.mask_file is None:
      warnings.append(f"{s}: no CheXlocalize {MASK_FILES[s]} found: no masks for this split")
      continue
    entries = read_masks(src.mask_file)
    for image_id, tasks in entries.items():
      for task, rle in tasks.items():
        try:
          _rle_counts(rle)
        except (ValueError, TypeError) as e:
          raise base.DataError(f"malformed CheXlocalize mask in {src.mask_file}: {image_id!r} / "
                               f"{task!r}: {e}") from None
    matched = src.num_with_masks()
    num_masks += matched
    unmatched = len(set(entries) - set(src.cxr_ids))
    if unmatched:
      warnings.append(f"{src.mask_file}: {unmatched} cxr_id(s) match no image of {s}"
                      + (" (frontal_only drops lateral views)" if frontal_only else ""))
  info = dataset_info()
  report = base.CheckReport(
      dataset="chexpert",
      splits={s: len(src) for s, src in sources.items()},
      num_attributes=info.num_attributes,
      attribute_groups=info.attribute_groups(),
      keypoint_groups=[],
      masks=num_masks,
      warnings=warnings)
  report.images_decoded = verify_split_images(
      {s: [src.image_path(i) for i in range(len(src))] for s, src in sources.items()},
      verify_images, progress)
  return report
