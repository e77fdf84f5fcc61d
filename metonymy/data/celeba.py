"""CelebA (aligned and cropped images) read from its official or torchvision layout.

Official layout (`root` holds Img/, Anno/, Eval/):
  Img/img_align_celeba/*.jpg
  Anno/list_attr_celeba.txt             count line, header (40 names), `000001.jpg  1 -1 ...`
  Anno/list_landmarks_align_celeba.txt  count line, header, `000001.jpg x y x y ...` (5 points)
  Anno/identity_CelebA.txt              `000001.jpg 2880` (no header)
  Anno/list_bbox_celeba.txt             count line, header, `000001.jpg x y w h`
  Eval/list_eval_partition.txt          `000001.jpg 0` (0/1/2 = train/val/test, no header)

Flat torchvision layout: one folder (`root`, or `root/celeba`) holding img_align_celeba/ and the
same six text files.

Rows may be separated by any run of whitespace (the attribute file pads `1` to ` 1`).

Required: the attribute, landmark and partition files and the image folder. Optional: the
identity file (without it examples carry no `label`; a warning says so) and the bounding-box file
(it describes the in-the-wild images, not the aligned ones, so it is only validated by `check`).

One example (`base` contract):
  image             uint8   [218, 178, 3] (the aligned images' size; whatever the file holds)
  attributes        float32 [32]     Table S8's attributes in `groupings.CELEBA_ATTRIBUTES` order
  attribute_valid   bool    [32]     all True (CelebA labels are never unknown)
  keypoints         float32 [4, 2]   left eye, right eye, nose, mouth = mean of the two corners
                                     (`groupings.CELEBA_KEYPOINTS`); both eyes take the label eye
                                     (`info.keypoint_group_ids`), only the mouth is averaged
  keypoint_visible  bool    [4]      False only where the point falls outside the image
  label             int32   []       identity - 1 (when identity_CelebA.txt exists)
  index             int64   []
"""

import dataclasses
import functools
import os
import warnings as py_warnings
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from metonymy.data import base
from metonymy.data import groupings
from metonymy.data.files import (check_split, example_index, load_rgb, parse_int, read_rows,
                                 require_file, verify_split_images)

SPLITS: Tuple[str, ...] = ("train", "val", "test")
PathLike = Union[str, os.PathLike]

_FILES = ("list_attr_celeba.txt", "list_landmarks_align_celeba.txt", "identity_CelebA.txt",
          "list_bbox_celeba.txt", "list_eval_partition.txt")


@dataclasses.dataclass(frozen=True)
class Layout:
  image_dir: Path
  attr: Path
  landmarks: Path
  identity: Path
  bbox: Path
  partition: Path


def find_layout(root: PathLike) -> Layout:
  """The official layout under `root`, else the flat layout in `root` or `root/celeba`."""
  root = Path(root)
  if (root / "Anno").is_dir() or (root / "Img").is_dir():
    return Layout(root / "Img" / "img_align_celeba", root / "Anno" / _FILES[0],
                  root / "Anno" / _FILES[1], root / "Anno" / _FILES[2], root / "Anno" / _FILES[3],
                  root / "Eval" / _FILES[4])
  for d in (root, root / "celeba"):
    if (d / _FILES[0]).is_file() or (d / "img_align_celeba").is_dir():
      return Layout(d / "img_align_celeba", *(d / f for f in _FILES))
  raise base.DataError(
      f"missing required file: {root / 'Anno' / _FILES[0]} (official layout) or "
      f"{root / _FILES[0]} (flat torchvision layout)")


# Names a header may give the file-name column (e.g. Kaggle's CSV-derived copies: `image_id`).
_FILE_COLUMN_NAMES = ("image_id", "image", "image_name", "filename", "file", "img")


def _read_counted(path: Path, nvalues: int, header: Optional[Sequence[str]] = None
                  ) -> Tuple[List[str], List[str], List[int], List[str]]:
  """Reads a `count line, header line, rows` file. Returns (names, values, linenos, header).

  Each row is a file name then `nvalues` values; `values[r]` holds row r's values joined by single
  spaces (one string per row keeps the 8M values of the real attribute file cheap). The count must
  match the rows (a mismatch means a truncated or concatenated file); `header`, when given, must
  be the file's header.
  """
  require_file(path)
  with open(path, "r", encoding="utf-8", errors="replace") as f:
    first = f.readline().split()
    second = f.readline().split()
  if len(first) != 1:
    raise base.DataError(f"{path}:1: malformed line, expected the number of rows")
  count = parse_int(first[0], path, 1)
  # Some copies name the file column in the header (`image_id x_1 ...`): drop it. Only a file
  # column's name: an extra value name must be reported, not silently shift every column.
  if len(second) == nvalues + 1 and (
      second[0].lower() in _FILE_COLUMN_NAMES
      or (header is not None and tuple(second[1:]) == tuple(header))):
    second = second[1:]
  if len(second) != nvalues:
    raise base.DataError(
        f"{path}:2: malformed header, it has {len(second)} names where {nvalues} are expected "
        f"(first {second[0] if second else None!r}, last {second[-1] if second else None!r})")
  if header is not None and tuple(second) != tuple(header):
    raise base.DataError(f"{path}:2: malformed header, expected {' '.join(header)!r}")
  names, values, linenos = [], [], []
  for lineno, fields in read_rows(path, min_fields=nvalues + 1, skip=2):
    names.append(fields[0])
    values.append(" ".join(fields[1:]))
    linenos.append(lineno)
  if len(names) != count:
    raise base.DataError(f"{path}:1: the count line says {count} rows, the file has {len(names)}")
  return names, values, linenos, list(second)


def _to_array(path: Path, values: List[str], linenos: List[int], nvalues: int) -> np.ndarray:
  """float32 [N, nvalues] from `_read_counted` rows; a bad number is reported by line."""
  with py_warnings.catch_warnings():
    # NumPy warns (and stops) at the first token it cannot read: make that an error.
    py_warnings.simplefilter("error", DeprecationWarning)
    try:
      arr = np.fromstring(" ".join(values), dtype=np.float64, sep=" ")
    except (ValueError, DeprecationWarning):
      arr = None
  if arr is None or arr.size != len(values) * nvalues:
    for lineno, v in zip(linenos, values):
      try:
        [float(t) for t in v.split()]
      except ValueError:
        raise base.DataError(f"{path}:{lineno}: malformed line, not a number in {v!r}") from None
    raise base.DataError(f"{path}: could not read the values")
  return arr.reshape(len(values), nvalues).astype(np.float32)


def _plus_minus_one(path: Path, values: List[str], linenos: List[int], nvalues: int) -> np.ndarray:
  """bool [N, nvalues] (True for 1) from rows of 1 / -1 values.

  Each row becomes a string of '0'/'1' characters read as bytes in one go: about ten times faster
  and lighter than a per-value parse of the real file's 8M values, and every other token (2, 1.0,
  +1, 11) changes a row's characters or length, so it is caught by line.
  """
  digits = [v.replace("-1", "0").replace(" ", "") for v in values]
  flat = np.frombuffer("".join(digits).encode("ascii", "replace"), np.uint8)
  ok = all(len(d) == nvalues for d in digits) and bool(((flat == 48) | (flat == 49)).all())
  if not ok:
    for lineno, v, d in zip(linenos, values, digits):
      if len(d) != nvalues or set(d) - {"0", "1"}:
        raise base.DataError(f"{path}:{lineno}: malformed line, values must be 1 or -1: {v!r}")
  return flat.reshape(len(values), nvalues) == 49


def _index(path: Path, names: List[str], linenos: List[int]) -> Dict[str, int]:
  index = {}
  for i, (name, lineno) in enumerate(zip(names, linenos)):
    if name in index:
      raise base.DataError(f"{path}:{lineno}: duplicate image {name!r}")
    index[name] = i
  return index


@dataclasses.dataclass
class CelebaTables:
  image_dir: Path
  files: List[str]  # partition-file order
  split: np.ndarray  # int8 [N] 0/1/2
  attributes: np.ndarray  # int8 [N, 32] 0/1, Table S8 order
  landmarks: np.ndarray  # float32 [N, 5, 2]
  identity: Optional[np.ndarray]  # int32 [N] 0-based, None without identity_CelebA.txt
  warnings: List[str]


def load_tables(root: PathLike) -> CelebaTables:
  layout = find_layout(root)
  for p in (layout.attr, layout.landmarks, layout.partition):
    require_file(p)
  if not layout.image_dir.is_dir():
    raise base.DataError(f"missing image folder: {layout.image_dir}")
  stamp = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size)
                for p in dataclasses.astuple(layout)[1:] if p.is_file())
  return _load_tables_cached(layout, stamp)


@functools.lru_cache(maxsize=2)
def _load_tables_cached(layout: Layout, stamp: Tuple) -> CelebaTables:
  del stamp  # Cache key only.
  warnings: List[str] = []

  # The partition file fixes which images exist and their order.
  files, split, part_lines = [], [], []
  for lineno, f in read_rows(layout.partition, min_fields=2):
    s = parse_int(f[1], layout.partition, lineno)
    if s not in (0, 1, 2):
      raise base.DataError(f"{layout.partition}:{lineno}: malformed line, partition {s} is not "
                           "0, 1 or 2")
    files.append(f[0])
    split.append(s)
    part_lines.append(lineno)
  if not files:
    raise base.DataError(f"{layout.partition}: no images listed")
  _index(layout.partition, files, part_lines)

  def aligned(path: Path, names: List[str], linenos: List[int], arr: np.ndarray) -> np.ndarray:
    """Rows of `arr` in partition order; every partition image must have one."""
    index = _index(path, names, linenos)
    missing = [f for f in files if f not in index]
    if missing:
      raise base.DataError(f"{path}: no line for {missing[0]!r} ({len(missing)} image(s) "
                           "without one)")
    return arr[[index[f] for f in files]]

  # Attributes: select Table S8's 32 columns by header name, map -1/1 to 0/1.
  names, values, linenos, header = _read_counted(
      layout.attr, len(groupings.CELEBA_RAW_ATTRIBUTES))
  unknown = [h for h in groupings.CELEBA_ATTRIBUTES if h not in header]
  if unknown:
    raise base.DataError(f"{layout.attr}:2: malformed header, attribute {unknown[0]!r} missing")
  positive = _plus_minus_one(layout.attr, values, linenos, len(header))
  cols = [header.index(a) for a in groupings.CELEBA_ATTRIBUTES]
  attributes = aligned(layout.attr, names, linenos, positive[:, cols].astype(np.int8))

  names, values, linenos, _ = _read_counted(
      layout.landmarks, 10, header=groupings.CELEBA_LANDMARK_COLUMNS)
  landmarks = _to_array(layout.landmarks, values, linenos, 10).reshape(-1, 5, 2)
  landmarks = aligned(layout.landmarks, names, linenos, landmarks)

  identity = None
  if layout.identity.is_file():
    names, ids, linenos = [], [], []
    for lineno, f in read_rows(layout.identity, min_fields=2):
      names.append(f[0])
      ids.append(parse_int(f[1], layout.identity, lineno) - 1)
      linenos.append(lineno)
    identity = aligned(layout.identity, names, linenos, np.asarray(ids, np.int32))
  else:
    warnings.append(f"{layout.identity} not found: examples carry no identity label")
  return CelebaTables(layout.image_dir, files, np.asarray(split, np.int8), attributes, landmarks,
                      identity, warnings)


def dataset_info() -> base.DatasetInfo:
  return base.DatasetInfo(
      name="celeba",
      attribute_names=groupings.CELEBA_ATTRIBUTES,
      part_names=groupings.CELEBA_PARTS,
      attribute_part=groupings.CELEBA_ATTRIBUTE_PART,
      keypoint_groups=groupings.CELEBA_KEYPOINT_GROUPS,
      keypoint_group_ids=groupings.CELEBA_KEYPOINT_GROUP_IDS)


def landmarks_to_keypoints(landmarks: np.ndarray) -> np.ndarray:
  """The 5 landmarks [..., 5, 2] -> an example's 4 keypoints [..., 4, 2] (float32): each the mean
  of its landmarks in `groupings.CELEBA_KEYPOINT_LANDMARKS`, so the eyes and the nose stay as they
  are and only the two mouth corners are averaged (Table S7)."""
  landmarks = np.asarray(landmarks, np.float64)
  members = [[groupings.CELEBA_LANDMARKS.index(l) for l in groupings.CELEBA_KEYPOINT_LANDMARKS[k]]
             for k in groupings.CELEBA_KEYPOINTS]
  return np.stack([landmarks[..., m, :].mean(-2) for m in members], -2).astype(np.float32)


class CelebaSource:
  """Random-access source over one split (`train` / `val` / `test`) of aligned CelebA."""

  def __init__(self, tables: CelebaTables, split: str):
    check_split(split, SPLITS, "CelebA")
    self.split = split
    self._dir = tables.image_dir
    rows = np.flatnonzero(tables.split == SPLITS.index(split))
    self.files = [tables.files[r] for r in rows]
    self._attributes = tables.attributes[rows]
    # Every landmark is annotated; visibility is decided against the decoded image's size in
    # __getitem__.
    self._keypoints = landmarks_to_keypoints(tables.landmarks[rows])  # [N, 4, 2]
    self._identity = None if tables.identity is None else tables.identity[rows]
    self._info = dataset_info()

  @property
  def info(self) -> base.DatasetInfo:
    return self._info

  def __len__(self) -> int:
    return len(self.files)

  def image_path(self, i: int) -> Path:
    return self._dir / self.files[i]

  def __getitem__(self, i) -> Dict[str, np.ndarray]:
    i = example_index(i, len(self), f"CelebA {self.split}")
    image = load_rgb(self.image_path(i))
    h, w = image.shape[:2]
    kp = self._keypoints[i].copy()
    visible = (kp[:, 0] >= 0) & (kp[:, 0] < w) & (kp[:, 1] >= 0) & (kp[:, 1] < h)
    example = {
        "image": image,
        "attributes": self._attributes[i].astype(np.float32),
        "attribute_valid": np.ones(len(groupings.CELEBA_ATTRIBUTES), bool),
        "keypoints": kp,
        "keypoint_visible": visible,
        "index": np.asarray(i, np.int64),
    }
    if self._identity is not None:
      example["label"] = np.asarray(self._identity[i], np.int32)
    return example


def make_source(root: PathLike, split: str) -> CelebaSource:
  """CelebA split `train`, `val` or `test` (official or flat torchvision layout under `root`)."""
  return CelebaSource(load_tables(root), split)


def check(root: PathLike, *, verify_images: int = 16, progress=None) -> base.CheckReport:
  """Parses the annotation files (the bounding-box file too, when present), checks every image
  exists and decodes the first `verify_images` of each split (all when negative; every bad image
  is listed, `progress` as in files.verify_split_images)."""
  tables = load_tables(root)
  layout = find_layout(root)
  warnings = list(tables.warnings)
  if layout.bbox.is_file():
    names, values, linenos, _ = _read_counted(layout.bbox, 4)
    _to_array(layout.bbox, values, linenos, 4)
  else:
    warnings.append(f"{layout.bbox} not found (unused: it boxes the in-the-wild images)")
  sources = {s: CelebaSource(tables, s) for s in SPLITS}
  info = dataset_info()
  report = base.CheckReport(
      dataset="celeba",
      splits={s: len(src) for s, src in sources.items()},
      num_attributes=info.num_attributes,
      attribute_groups=info.attribute_groups(),
      keypoint_groups=list(info.keypoint_groups),
      warnings=warnings)
  report.images_decoded = verify_split_images(
      {s: [src.image_path(i) for i in range(len(src))] for s, src in sources.items()},
      verify_images, progress)
  return report
