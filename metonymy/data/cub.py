"""CUB-200-2011 read from its official on-disk layout.

Layout (all whitespace-separated, no header):

  CUB_200_2011/images.txt                           id, relative path under images/
  CUB_200_2011/image_class_labels.txt               id, class 1..200
  CUB_200_2011/train_test_split.txt                 id, 1 = train / 0 = test
  CUB_200_2011/bounding_boxes.txt                   id, x, y, w, h
  CUB_200_2011/parts/parts.txt                      part id 1..15, name (may hold spaces)
  CUB_200_2011/parts/part_locs.txt                  id, part id, x, y, visible
  CUB_200_2011/attributes/image_attribute_labels.txt  id, attribute id, is_present, certainty, time
  attributes.txt                                    attribute id, name (312 names)

`root` may be `CUB_200_2011/` or its parent. The official tarball puts `attributes.txt` beside
`CUB_200_2011/`; it is also accepted inside it, or in its `attributes/` folder, or given
explicitly (`attributes_txt=`). The real `image_attribute_labels.txt` has a few lines with an extra
sixth field: they are read (first four fields) and counted in the warnings; any other field count
raises `DataError` naming the file and line.

One example (`base` contract):
  image             uint8   [H, W, 3]  RGB, at the file's own resolution
  attributes        float32 [248]      Table S9's attributes, in `groupings.CUB_ATTRIBUTES` order
  attribute_valid   bool    [248]      False where the file has no label for the pair (or, with
                                       ignore_not_visible=True, where certainty is "not visible")
  keypoints         float32 [15, 2]    (x, y) pixels of the 15 parts in `groupings.CUB_KEYPOINTS`
                                       order, each at its own location with its Table S7 group's
                                       label (`info.keypoint_group_ids`); nothing is averaged
  keypoint_visible  bool    [15]       the file's flag (an invisible point keeps the file's 0, 0)
  label             int32   []         class 0..199
  index             int64   []         position in the split
"""

import dataclasses
import functools
import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from metonymy.data import base
from metonymy.data import groupings
from metonymy.data.files import (check_split, example_index, load_rgb, parse_float, parse_int,
                                 read_rows, require_file, verify_split_images)

SPLITS: Tuple[str, ...] = ("train", "test")
DATASET_DIR = "CUB_200_2011"

PathLike = Union[str, os.PathLike]

# ------------------------------------------------------------------------------------------------
# CUB tables.


def find_dataset_dir(root: PathLike) -> Path:
  """`root` itself when it holds images.txt, else `root/CUB_200_2011`."""
  root = Path(root)
  for candidate in (root, root / DATASET_DIR):
    if (candidate / "images.txt").is_file():
      return candidate
  raise base.DataError(
      f"missing required file: {root / 'images.txt'} (nor {root / DATASET_DIR / 'images.txt'}); "
      "--root must be CUB_200_2011/ or its parent")


def find_attributes_txt(dataset_dir: Path, attributes_txt: Optional[PathLike] = None) -> Path:
  if attributes_txt is not None:
    return require_file(Path(attributes_txt))
  candidates = (dataset_dir.parent / "attributes.txt", dataset_dir / "attributes.txt",
                dataset_dir / "attributes" / "attributes.txt")
  for c in candidates:
    if c.is_file():
      return c
  raise base.DataError("missing required file: attributes.txt (looked for "
                       + ", ".join(str(c) for c in candidates) + ")")


@dataclasses.dataclass
class CubTables:
  """Every annotation of the dataset, one row per line of images.txt (in file order)."""
  dataset_dir: Path
  image_ids: np.ndarray  # int64 [N]
  paths: List[str]  # relative to images/
  is_train: np.ndarray  # bool [N]
  labels: np.ndarray  # int32 [N], 0..199
  bboxes: np.ndarray  # float32 [N, 4] x, y, w, h
  keypoints: np.ndarray  # float32 [N, 15, 2], groupings.CUB_KEYPOINTS order
  keypoint_visible: np.ndarray  # bool [N, 15]
  attributes: np.ndarray  # uint8 [N, 248] is_present, Table S9 order
  certainty: np.ndarray  # uint8 [N, 248] 1..4 (1 = not visible), 0 where unlabelled
  extra_field_lines: int
  warnings: List[str]


def _claim_row(path: Path, rows: Dict[int, int], seen: np.ndarray, image_id: int,
               lineno: int) -> int:
  row = rows.get(image_id)
  if row is None:
    raise base.DataError(f"{path}:{lineno}: image id {image_id} is not in images.txt")
  if seen[row]:
    raise base.DataError(f"{path}:{lineno}: second line for image id {image_id}")
  seen[row] = True
  return row


def _require_all(path: Path, seen: np.ndarray, image_ids: np.ndarray) -> None:
  if not seen.all():
    first = int(image_ids[np.argmin(seen)])
    raise base.DataError(f"{path}: no line for image id {first} "
                         f"({int((~seen).sum())} image(s) without one)")


def _stamp(paths: Sequence[Path]) -> Tuple:
  return tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in paths)


def _files(dataset_dir: Path, attributes_txt: Path) -> Dict[str, Path]:
  d = dataset_dir
  return {
      "images": d / "images.txt",
      "labels": d / "image_class_labels.txt",
      "split": d / "train_test_split.txt",
      "bboxes": d / "bounding_boxes.txt",
      "parts": d / "parts" / "parts.txt",
      "part_locs": d / "parts" / "part_locs.txt",
      "attribute_labels": d / "attributes" / "image_attribute_labels.txt",
      "attribute_names": attributes_txt,
  }


def load_tables(root: PathLike, attributes_txt: Optional[PathLike] = None) -> CubTables:
  """Parses (and caches per process, keyed on the files' mtimes) every CUB annotation file."""
  dataset_dir = find_dataset_dir(root)
  attributes_path = find_attributes_txt(dataset_dir, attributes_txt)
  files = _files(dataset_dir, attributes_path)
  for p in files.values():
    require_file(p)
  return _load_tables_cached(dataset_dir, attributes_path, _stamp(list(files.values())))


@functools.lru_cache(maxsize=2)
def _load_tables_cached(dataset_dir: Path, attributes_path: Path, stamp: Tuple) -> CubTables:
  del stamp  # Only part of the cache key: an edited file is parsed again.
  files = _files(dataset_dir, attributes_path)
  warnings: List[str] = []

  # images.txt fixes the row order and the id -> row map.
  ids, paths, rows = [], [], {}
  p = files["images"]
  for lineno, f in read_rows(p, min_fields=2, maxsplit=1):
    image_id = parse_int(f[0], p, lineno)
    if image_id in rows:
      raise base.DataError(f"{p}:{lineno}: duplicate image id {image_id}")
    rows[image_id] = len(ids)
    ids.append(image_id)
    paths.append(f[1].strip())
  if not ids:
    raise base.DataError(f"{p}: no images listed")
  n = len(ids)
  image_ids = np.asarray(ids, np.int64)

  def per_image(key: str, nfields: int, parse) -> np.ndarray:
    path = files[key]
    seen = np.zeros(n, bool)
    values = [None] * n
    for lineno, f in read_rows(path, min_fields=nfields):
      row = _claim_row(path, rows, seen, parse_int(f[0], path, lineno), lineno)
      values[row] = parse(f[1:], path, lineno)
    _require_all(path, seen, image_ids)
    return np.asarray(values)

  def parse_label(f, path, lineno):
    c = parse_int(f[0], path, lineno)
    if not 1 <= c <= 200:
      raise base.DataError(f"{path}:{lineno}: malformed line, class {c} is not in 1..200")
    return c - 1

  def parse_split(f, path, lineno):
    s = parse_int(f[0], path, lineno)
    if s not in (0, 1):
      raise base.DataError(f"{path}:{lineno}: malformed line, split flag {s} is not 0 or 1")
    return s == 1

  labels = per_image("labels", 2, parse_label).astype(np.int32)
  is_train = per_image("split", 2, parse_split).astype(bool)
  bboxes = per_image(
      "bboxes", 5, lambda f, path, ln: [parse_float(t, path, ln) for t in f]).astype(np.float32)

  # parts.txt: names -> keypoint index (checked against the 15 names Table S7 groups).
  p = files["parts"]
  part_index = {}
  for lineno, f in read_rows(p, min_fields=2, maxsplit=1):
    part_id, name = parse_int(f[0], p, lineno), " ".join(f[1].split()).lower()
    if name not in groupings.CUB_KEYPOINTS:
      raise base.DataError(f"{p}:{lineno}: unknown part name {name!r}")
    part_index[part_id] = groupings.CUB_KEYPOINTS.index(name)
  if sorted(part_index.values()) != list(range(len(groupings.CUB_KEYPOINTS))):
    raise base.DataError(f"{p}: expected the 15 CUB parts {groupings.CUB_KEYPOINTS}")

  p = files["part_locs"]
  keypoints = np.zeros((n, 15, 2), np.float32)
  keypoint_visible = np.zeros((n, 15), bool)
  for lineno, f in read_rows(p, min_fields=5):
    image_id, part_id = parse_int(f[0], p, lineno), parse_int(f[1], p, lineno)
    row = rows.get(image_id)
    if row is None:
      raise base.DataError(f"{p}:{lineno}: image id {image_id} is not in images.txt")
    k = part_index.get(part_id)
    if k is None:
      raise base.DataError(f"{p}:{lineno}: part id {part_id} is not in parts.txt")
    keypoints[row, k] = (parse_float(f[2], p, lineno), parse_float(f[3], p, lineno))
    v = parse_int(f[4], p, lineno)
    if v not in (0, 1):
      raise base.DataError(f"{p}:{lineno}: malformed line, visible flag {v} is not 0 or 1")
    keypoint_visible[row, k] = v == 1

  # attributes.txt: attribute id -> column of Table S9's 248 (or -1 for the holistic ones).
  p = files["attribute_names"]
  wanted = {name: i for i, name in enumerate(groupings.CUB_ATTRIBUTES)}
  found: Dict[str, int] = {}
  column_of: Dict[int, int] = {}
  for lineno, f in read_rows(p, min_fields=2, maxsplit=1):
    attribute_id, name = parse_int(f[0], p, lineno), f[1].strip()
    if attribute_id in column_of:
      raise base.DataError(f"{p}:{lineno}: duplicate attribute id {attribute_id}")
    prefix = groupings.cub_attribute_prefix(name)
    if prefix in groupings.CUB_ATTRIBUTE_PREFIX_PART and name not in wanted:
      raise base.DataError(f"{p}:{lineno}: {name!r} is not among Table S9's values of {prefix}")
    column_of[attribute_id] = wanted.get(name, -1)
    if name in wanted:
      if name in found:
        raise base.DataError(f"{p}:{lineno}: duplicate attribute name {name!r}")
      found[name] = attribute_id
  absent = [a for a in groupings.CUB_ATTRIBUTES if a not in found]
  if absent:
    raise base.DataError(f"{p}: {len(absent)} of Table S9's attributes are missing, "
                         f"first: {absent[0]!r}")
  if len(column_of) != groupings.CUB_NUM_RAW_ATTRIBUTES:
    warnings.append(f"{p}: {len(column_of)} attributes listed, CUB has "
                    f"{groupings.CUB_NUM_RAW_ATTRIBUTES}")
  max_attr = max(column_of)
  column_lut = np.full(max_attr + 1, -1, np.int64)
  for attribute_id, col in column_of.items():
    if attribute_id >= 0:
      column_lut[attribute_id] = col

  attributes, certainty, extra = _read_attribute_labels(
      files["attribute_labels"], rows, image_ids, column_lut)
  if extra:
    warnings.append(f"{files['attribute_labels']}: {extra} line(s) with an extra sixth field "
                    "tolerated (first four fields used)")
  unlabelled = int((certainty == 0).sum())
  if unlabelled:
    warnings.append(f"{files['attribute_labels']}: {unlabelled} (image, attribute) pair(s) "
                    "without a label (attribute_valid False)")
  return CubTables(dataset_dir, image_ids, paths, is_train, labels, bboxes, keypoints,
                   keypoint_visible, attributes, certainty, extra, warnings)


def _read_attribute_labels(path: Path, rows: Dict[int, int], image_ids: np.ndarray,
                           column_lut: np.ndarray) -> Tuple[np.ndarray, np.ndarray, int]:
  """Reads image_attribute_labels.txt (3.7M lines for the real file, a few seconds).

  The loop only splits and converts; ids are mapped and range-checked vectorized afterwards, with
  the line number kept so that a bad value is still reported by line.
  """
  require_file(path)
  size_hint = len(image_ids) * groupings.CUB_NUM_RAW_ATTRIBUTES
  values = np.zeros((size_hint, 4), np.int64)  # ~120 MB for the real file, freed on return.
  linenos = np.zeros(size_hint, np.int32)
  k = extra = 0
  with open(path, "r", encoding="utf-8", errors="replace") as f:
    for lineno, line in enumerate(f, 1):
      fields = line.split()
      nf = len(fields)
      if nf != 5:
        if nf == 6:
          extra += 1
        elif nf == 0:
          continue
        else:
          raise base.DataError(f"{path}:{lineno}: malformed line, expected 5 fields, got {nf}: "
                               f"{line.rstrip()!r}")
      if k == len(values):
        values = np.concatenate([values, np.zeros_like(values)])
        linenos = np.concatenate([linenos, np.zeros_like(linenos)])
      try:
        values[k] = (int(fields[0]), int(fields[1]), int(fields[2]), int(fields[3]))
      except ValueError:
        raise base.DataError(f"{path}:{lineno}: malformed line, expected integers: "
                             f"{line.rstrip()!r}") from None
      linenos[k] = lineno
      k += 1
  values, linenos = values[:k], linenos[:k]

  def fail(bad: np.ndarray, what: str):
    i = int(np.argmax(bad))
    raise base.DataError(f"{path}:{int(linenos[i])}: {what} "
                         f"(image {values[i, 0]}, attribute {values[i, 1]})")

  id_lut = np.full(int(image_ids.max()) + 1, -1, np.int64)
  id_lut[image_ids] = np.arange(len(image_ids))
  img = values[:, 0]
  bad = (img < 0) | (img >= len(id_lut))
  if bad.any():
    fail(bad, "image id is not in images.txt")
  row = id_lut[img]
  if (row < 0).any():
    fail(row < 0, "image id is not in images.txt")
  attr = values[:, 1]
  bad = (attr < 0) | (attr >= len(column_lut))
  if bad.any():
    fail(bad, "attribute id is not in attributes.txt")
  col = column_lut[attr]
  present, cert = values[:, 2], values[:, 3]
  if not np.isin(present, (0, 1)).all():
    fail(~np.isin(present, (0, 1)), "malformed line, is_present is not 0 or 1")
  if not ((cert >= 1) & (cert <= 4)).all():
    fail(~((cert >= 1) & (cert <= 4)), "malformed line, certainty is not in 1..4")
  keep = col >= 0
  n, a = len(image_ids), groupings.CUB_NUM_ATTRIBUTES
  attributes = np.zeros((n, a), np.uint8)
  certainty = np.zeros((n, a), np.uint8)
  attributes[row[keep], col[keep]] = present[keep]
  certainty[row[keep], col[keep]] = cert[keep]
  return attributes, certainty, extra


# ------------------------------------------------------------------------------------------------
# Source and check.


def dataset_info() -> base.DatasetInfo:
  return base.DatasetInfo(
      name="cub",
      attribute_names=groupings.CUB_ATTRIBUTES,
      part_names=groupings.CUB_PARTS,
      attribute_part=groupings.CUB_ATTRIBUTE_PART,
      keypoint_groups=groupings.CUB_KEYPOINT_GROUPS,
      keypoint_group_ids=groupings.CUB_KEYPOINT_GROUP_IDS)


class CubSource:
  """Random-access source over one split (`train` / `test`) of CUB-200-2011."""

  def __init__(self, tables: CubTables, split: str, ignore_not_visible: bool = False):
    check_split(split, SPLITS, "CUB")
    self.split = split
    self._dir = tables.dataset_dir / "images"
    rows = np.flatnonzero(tables.is_train == (split == "train"))
    self.image_ids = tables.image_ids[rows]
    self.paths = [tables.paths[r] for r in rows]
    self._labels = tables.labels[rows]
    self._keypoints = tables.keypoints[rows]
    self._keypoint_visible = tables.keypoint_visible[rows]
    self._attributes = tables.attributes[rows]
    valid = tables.certainty[rows] > 0
    if ignore_not_visible:
      valid &= tables.certainty[rows] != 1  # certainty 1 = "not visible" in CUB.
    self._valid = valid
    self._info = dataset_info()

  @property
  def info(self) -> base.DatasetInfo:
    return self._info

  def __len__(self) -> int:
    return len(self.paths)

  def image_path(self, i: int) -> Path:
    return self._dir / self.paths[i]

  def __getitem__(self, i) -> Dict[str, np.ndarray]:
    i = example_index(i, len(self), f"CUB {self.split}")
    return {
        "image": load_rgb(self.image_path(i)),
        "attributes": self._attributes[i].astype(np.float32),
        "attribute_valid": self._valid[i].copy(),
        "keypoints": self._keypoints[i].copy(),
        "keypoint_visible": self._keypoint_visible[i].copy(),
        "label": np.asarray(self._labels[i], np.int32),
        "index": np.asarray(i, np.int64),
    }


def make_source(root: PathLike, split: str, *, attributes_txt: Optional[PathLike] = None,
                ignore_not_visible: bool = False) -> CubSource:
  """CUB split `train` or `test` under `root` (CUB_200_2011/ or its parent).

  Args:
    attributes_txt: explicit path of attributes.txt (default: searched, see module doc).
    ignore_not_visible: mark labels with certainty 1 ("not visible") attribute_valid False.
  """
  return CubSource(load_tables(root, attributes_txt), split, ignore_not_visible)


def check(root: PathLike, *, attributes_txt: Optional[PathLike] = None,
          ignore_not_visible: bool = False, verify_images: int = 16,
          progress=None) -> base.CheckReport:
  """Parses every annotation file, checks every image exists and decodes the first
  `verify_images` of each split (all when negative). Raises DataError on the first annotation
  problem, or listing every bad image (`progress` as in files.verify_split_images)."""
  tables = load_tables(root, attributes_txt)
  sources = {s: CubSource(tables, s, ignore_not_visible) for s in SPLITS}
  info = dataset_info()
  report = base.CheckReport(
      dataset="cub",
      splits={s: len(src) for s, src in sources.items()},
      num_attributes=info.num_attributes,
      attribute_groups=info.attribute_groups(),
      keypoint_groups=list(info.keypoint_groups),
      warnings=list(tables.warnings))
  report.images_decoded = verify_split_images(
      {s: [src.image_path(i) for i in range(len(src))] for s, src in sources.items()},
      verify_images, progress)
  return report
