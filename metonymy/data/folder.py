"""A user's own part-attribute dataset, read from one documented folder format (`dataset: "folder"`).

  ROOT/
    images/            the images, any format PIL reads (sub-folders allowed)
    annotations.csv    one row per image (or annotations.jsonl: one JSON object per line, same keys)
    attributes.csv     `attribute,part`: every attribute column and the part group it describes
    keypoints.csv      optional, `keypoint,part`: every keypoint and its part group
    masks/             optional, PNG part label maps named by the `mask` column

annotations.csv (header line first; columns in any order):
  image                 path under images/                                              required
  split                 split name, e.g. train / val / test                             required
  <attribute>           1 (present), 0 (absent) or blank (unknown: attribute_valid False), one
                        column per row of attributes.csv
  <keypoint>_x, _y      pixel coordinates (x right, y down; pixel (row i, column j) covers
                        [j, j+1) x [i, i+1)), one pair per row of keypoints.csv; blank = not
                        annotated
  <keypoint>_visible    optional 1 / 0; without it a keypoint is visible when it is annotated and
                        inside the image
  label                 optional integer class (e.g. species)
  mask                  optional path under masks/ of a PNG label map of the image's size, pixel
                        value 0 = background and g = the g-th part group (1-based); blank = none.
                        Within a split every row has a mask or none does.
annotations.jsonl: `{"image": "a.jpg", "split": "train", "has_red_head": 1, "head_x": 10.5, ...}`,
the same keys; 0 / 1 / null (or a missing key) for attributes, numbers or null for coordinates.
Any other column is an error (a typo must not silently drop an attribute).

Part groups: the `part` values of attributes.csv, in order of first appearance; they are the
groups the benchmark probes (DatasetInfo.part_names) and the labels of the masks. keypoints.csv
may only name these groups. Keypoint groups (NMI / ARI, the contingency) are the part groups
that have keypoints, in part order; with masks every part group must have at least one keypoint
(or keypoints.csv is left out), so that mask label g and keypoint group g - 1 are the same part.

One example (`base` contract; keys absent when the folder has no such annotation):
  image              uint8   [H, W, 3]
  attributes         float32 [A]    attributes.csv order; 0 where unknown
  attribute_valid    bool    [A]    False where the label is blank
  keypoints          float32 [M, 2] keypoints.csv order (0, 0 where not annotated)
  keypoint_visible   bool    [M]
  part_segmentation  uint8   [H, W] the mask (0 = background, g = part group g - 1)
  label              int32   []
  index              int64   []     position in the split (file order)

Every failure is a `base.DataError` naming the file and line: a missing image or mask, an unknown
part group, a label outside {0, 1, blank}, a mask of the wrong size or with a label beyond the
part groups. `export_synthetic` writes the synthetic world in this format
(`python -m metonymy.data export-synthetic --root DIR --examples N`).
"""

import csv
import dataclasses
import functools
import json
import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
from PIL import Image

from metonymy.data import base
from metonymy.data import synthetic
from metonymy.data.files import example_index, load_rgb, require_file, verify_split_images

PathLike = Union[str, os.PathLike]
ANNOTATIONS = ("annotations.csv", "annotations.jsonl")
_FIXED = ("image", "split", "label", "mask")


# ------------------------------------------------------------------------------------------------
# Tables.


def _read_csv(path: Path) -> Tuple[List[str], List[Tuple[int, Dict[str, str]]]]:
  """(header, [(line, {column: stripped value})]) of a CSV with a header line; blank rows skipped."""
  require_file(path)
  with open(path, "r", encoding="utf-8-sig", newline="") as f:
    reader = csv.reader(f)
    header = next(reader, None)
    if not header:
      raise base.DataError(f"{path}:1: empty file, expected a header line")
    header = [h.strip() for h in header]
    seen = set()
    for h in header:
      if not h or h in seen:
        raise base.DataError(f"{path}:1: {'empty' if not h else 'duplicate'} column name {h!r}")
      seen.add(h)
    rows = []
    for fields in reader:
      if not any(v.strip() for v in fields):
        continue
      if len(fields) != len(header):
        raise base.DataError(f"{path}:{reader.line_num}: malformed line, {len(fields)} fields "
                             f"where the header has {len(header)}")
      rows.append((reader.line_num, {h: v.strip() for h, v in zip(header, fields)}))
  return header, rows


def _read_jsonl(path: Path) -> Tuple[List[str], List[Tuple[int, Dict[str, str]]]]:
  """Like _read_csv: values as strings ("" for null), the header = every key used."""
  rows, header = [], {}
  with open(path, "r", encoding="utf-8") as f:
    for lineno, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        obj = json.loads(line)
      except json.JSONDecodeError as e:
        raise base.DataError(f"{path}:{lineno}: malformed line, not JSON ({e.msg})") from None
      if not isinstance(obj, dict):
        raise base.DataError(f"{path}:{lineno}: malformed line, expected a JSON object")
      row = {}
      for key, value in obj.items():
        if isinstance(value, (dict, list)):
          raise base.DataError(f"{path}:{lineno}: {key!r} holds {type(value).__name__}, "
                               "expected a number, a string or null")
        if value is None:
          value = ""
        elif isinstance(value, bool) or (isinstance(value, float) and value.is_integer()):
          value = int(value)  # true / 1.0 -> "1", 10.0 -> "10"
        row[key] = str(value).strip()
        header.setdefault(key, None)
      rows.append((lineno, row))
  return list(header), rows


def _group_table(path: Path, key: str) -> List[Tuple[int, str, str]]:
  """[(line, name, part)] of attributes.csv / keypoints.csv (columns `key`, part)."""
  header, rows = _read_csv(path)
  if header != [key, "part"]:
    raise base.DataError(f"{path}:1: malformed header {','.join(header)!r}, expected "
                         f"'{key},part'")
  out, seen = [], set()
  for lineno, row in rows:
    name, part = row[key], row["part"]
    if not name or not part:
      raise base.DataError(f"{path}:{lineno}: malformed line, empty {key} or part")
    if name in seen:
      raise base.DataError(f"{path}:{lineno}: duplicate {key} {name!r}")
    seen.add(name)
    out.append((lineno, name, part))
  if not out:
    raise base.DataError(f"{path}: no {key}s listed")
  return out


@dataclasses.dataclass
class FolderTables:
  root: Path
  annotations: Path
  info: base.DatasetInfo
  images: List[str]  # relative to images/
  lines: List[int]  # line of each row in `annotations`
  split: List[str]
  attributes: np.ndarray  # float32 [N, A]
  attribute_valid: np.ndarray  # bool [N, A]
  keypoints: Optional[np.ndarray]  # float32 [N, M, 2]
  keypoint_annotated: Optional[np.ndarray]  # bool [N, M]
  keypoint_visible: Optional[np.ndarray]  # int8 [N, M]: 1 / 0, -1 = decide from the image
  label: Optional[np.ndarray]  # int32 [N]
  masks: List[str]  # relative to masks/, "" = none
  warnings: List[str]

  @property
  def split_names(self) -> Tuple[str, ...]:
    return tuple(dict.fromkeys(self.split))


def find_annotations(root: PathLike) -> Path:
  root = Path(root)
  found = [root / n for n in ANNOTATIONS if (root / n).is_file()]
  if not found:
    raise base.DataError(f"missing required file: {root / ANNOTATIONS[0]} (or "
                         f"{root / ANNOTATIONS[1]})")
  if len(found) > 1:
    raise base.DataError(f"{root}: both {ANNOTATIONS[0]} and {ANNOTATIONS[1]}; keep one")
  return found[0]


def load_tables(root: PathLike) -> FolderTables:
  root = Path(root)
  if not root.is_dir():
    raise base.DataError(f"missing dataset folder: {root}")
  paths = [find_annotations(root), root / "attributes.csv", root / "keypoints.csv"]
  stamp = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in paths if p.is_file())
  return _load_tables_cached(root, stamp)


def _binary(value: str, path: Path, lineno: int, column: str) -> float:
  if value in ("1", "0"):
    return float(value)
  raise base.DataError(f"{path}:{lineno}: column {column!r}: label {value!r} is not 0, 1 or blank")


def _number(value: str, path: Path, lineno: int, column: str) -> float:
  try:
    x = float(value)
  except ValueError:
    x = float("nan")
  if not np.isfinite(x):
    raise base.DataError(f"{path}:{lineno}: column {column!r}: {value!r} is not a number")
  return x


@functools.lru_cache(maxsize=4)
def _load_tables_cached(root: Path, stamp: Tuple) -> FolderTables:
  del stamp  # Cache key only.
  warnings: List[str] = []
  attr_path = root / "attributes.csv"
  attr_rows = _group_table(attr_path, "attribute")
  attribute_names = tuple(name for _, name, _ in attr_rows)
  parts = tuple(dict.fromkeys(part for _, _, part in attr_rows))
  attribute_part = tuple(parts.index(part) for _, _, part in attr_rows)

  kp_path = root / "keypoints.csv"
  kp_names: Tuple[str, ...] = ()
  kp_parts: Tuple[int, ...] = ()
  if kp_path.is_file():
    kp_rows = _group_table(kp_path, "keypoint")
    for lineno, name, part in kp_rows:
      if part not in parts:
        raise base.DataError(f"{kp_path}:{lineno}: unknown part group {part!r}; "
                             f"{attr_path.name} names {', '.join(parts)}")
      if name in attribute_names:
        raise base.DataError(f"{kp_path}:{lineno}: keypoint {name!r} is also an attribute")
    kp_names = tuple(name for _, name, _ in kp_rows)
    kp_parts = tuple(parts.index(part) for _, _, part in kp_rows)

  path = find_annotations(root)
  header, rows = (_read_csv if path.suffix == ".csv" else _read_jsonl)(path)
  coordinate_columns = {f"{k}_{c}": (m, c) for m, k in enumerate(kp_names)
                        for c in ("x", "y", "visible")}
  for column in header:
    if column not in _FIXED and column not in attribute_names and column not in coordinate_columns:
      where = f"{path}:1" if path.suffix == ".csv" else (
          f"{path}:{next(lineno for lineno, row in rows if column in row)}")
      raise base.DataError(
          f"{where}: unknown column {column!r}: not image, split, label, mask, an attribute of "
          f"{attr_path.name} or a keypoint coordinate ({kp_path.name}'s <keypoint>_x / _y / "
          "_visible)")
  csv_file = path.suffix == ".csv"
  for column in ("image", "split") + (attribute_names if csv_file else ()):
    if column not in header:
      raise base.DataError(f"{path}:1: missing column {column!r}")
  if csv_file:
    for k in kp_names:
      for c in ("x", "y"):
        if f"{k}_{c}" not in header:
          raise base.DataError(f"{path}:1: missing column {k}_{c!s} (keypoint {k!r} of "
                               f"{kp_path.name})")
  if not rows:
    raise base.DataError(f"{path}: no images listed")

  n, a, m = len(rows), len(attribute_names), len(kp_names)
  attributes = np.zeros((n, a), np.float32)
  valid = np.zeros((n, a), bool)
  keypoints = np.zeros((n, m, 2), np.float32)
  annotated = np.zeros((n, m), bool)
  visible = np.full((n, m), -1, np.int8)
  label = np.zeros(n, np.int32) if "label" in header else None
  images, lines, split, masks, seen = [], [], [], [], {}
  for r, (lineno, row) in enumerate(rows):
    image = row.get("image", "")
    if not image:
      raise base.DataError(f"{path}:{lineno}: empty image")
    if image in seen:
      raise base.DataError(f"{path}:{lineno}: image {image!r} is already listed on line "
                           f"{seen[image]}")
    seen[image] = lineno
    if not row.get("split", ""):
      raise base.DataError(f"{path}:{lineno}: empty split")
    images.append(image)
    lines.append(lineno)
    split.append(row["split"])
    masks.append(row.get("mask", ""))
    for j, name in enumerate(attribute_names):
      value = row.get(name, "")
      if value:
        attributes[r, j] = _binary(value, path, lineno, name)
        valid[r, j] = True
    for j, name in enumerate(kp_names):
      x, y = row.get(f"{name}_x", ""), row.get(f"{name}_y", "")
      if bool(x) != bool(y):
        raise base.DataError(f"{path}:{lineno}: keypoint {name!r} has one coordinate only")
      if x:
        keypoints[r, j] = (_number(x, path, lineno, f"{name}_x"),
                           _number(y, path, lineno, f"{name}_y"))
        annotated[r, j] = True
      flag = row.get(f"{name}_visible", "")
      if flag:
        visible[r, j] = int(_binary(flag, path, lineno, f"{name}_visible"))
        if visible[r, j] and not x:
          raise base.DataError(f"{path}:{lineno}: keypoint {name!r} is visible but has no "
                               "coordinates")
    if label is not None:
      value = row.get("label", "")
      try:
        label[r] = int(value)
      except ValueError:
        raise base.DataError(f"{path}:{lineno}: label {value!r} is not an integer") from None

  for s in dict.fromkeys(split):
    rows_s = [r for r in range(n) if split[r] == s]
    with_mask = [bool(masks[r]) for r in rows_s]
    if any(with_mask) and not all(with_mask):
      r = rows_s[with_mask.index(False)]
      raise base.DataError(f"{path}:{lines[r]}: no mask, but other images of split {s!r} have "
                           "one (a split's images all have a mask or none does)")
  has_masks = any(masks)

  # Keypoint groups: the part groups that have keypoints (see the module docstring).
  if m:
    groups = sorted(set(kp_parts))
    if has_masks and len(groups) != len(parts):
      lacking = [p for g, p in enumerate(parts) if g not in groups]
      raise base.DataError(f"{kp_path}: part group {lacking[0]!r} has no keypoint; with masks "
                           "every part group needs one (mask label g is keypoint group g - 1)")
    keypoint_groups = tuple(parts[g] for g in groups)
    keypoint_group_ids = tuple(groups.index(g) for g in kp_parts)
  elif has_masks:
    keypoint_groups, keypoint_group_ids = parts, ()
  else:
    keypoint_groups, keypoint_group_ids = (), ()
  if not m:
    warnings.append(f"{kp_path} not found: no keypoints (part discovery reports no NMI / ARI)")
  info = base.DatasetInfo(name="folder", attribute_names=attribute_names, part_names=parts,
                          attribute_part=attribute_part, keypoint_groups=keypoint_groups,
                          keypoint_group_ids=keypoint_group_ids)
  return FolderTables(
      root=root, annotations=path, info=info, images=images, lines=lines, split=split,
      attributes=attributes, attribute_valid=valid, keypoints=keypoints if m else None,
      keypoint_annotated=annotated if m else None, keypoint_visible=visible if m else None,
      label=label, masks=masks, warnings=warnings)


# ------------------------------------------------------------------------------------------------
# Source.


def load_mask(path: Path, image_hw: Tuple[int, int], num_parts: int, where: str) -> np.ndarray:
  """uint8 [H, W] label map; DataError naming the mask and `where` (the annotation line)."""
  try:
    with Image.open(path) as im:
      if im.mode not in ("L", "P", "I", "I;16"):
        raise base.DataError(f"mask {path} ({where}): mode {im.mode}, expected a one-channel "
                             "label map (8-bit grey or palette PNG)")
      mask = np.asarray(im)
  except FileNotFoundError:
    raise base.DataError(f"missing mask: {path} ({where})") from None
  except base.DataError:
    raise
  except Exception as e:  # PIL raises OSError, SyntaxError, ... for broken files.
    raise base.DataError(f"corrupt mask: {path} ({where}; {type(e).__name__}: {e})") from None
  if mask.shape != tuple(image_hw):
    raise base.DataError(f"mask {path} ({where}): size {mask.shape[1]}x{mask.shape[0]}, the image "
                         f"is {image_hw[1]}x{image_hw[0]} (width x height)")
  if mask.size and int(mask.max()) > num_parts:
    raise base.DataError(f"mask {path} ({where}): label {int(mask.max())} but there are "
                         f"{num_parts} part groups (labels 0..{num_parts})")
  return mask.astype(np.uint8)


class FolderSource:
  """Random-access source over one split of a folder dataset (see the module docstring)."""

  def __init__(self, tables: FolderTables, split: str):
    if split not in tables.split_names:
      raise ValueError(f"{tables.annotations} has splits {tables.split_names}, not {split!r}")
    self.split = split
    self._tables = tables
    self._rows = np.asarray([r for r, s in enumerate(tables.split) if s == split], np.int64)
    self._has_masks = bool(tables.masks[self._rows[0]])

  @property
  def info(self) -> base.DatasetInfo:
    return self._tables.info

  def __len__(self) -> int:
    return len(self._rows)

  def _row(self, i: int) -> int:
    return int(self._rows[example_index(i, len(self), f"folder {self.split}")])

  def where(self, i: int) -> str:
    """`annotations.csv:LINE` of example i."""
    return f"{self._tables.annotations}:{self._tables.lines[self._row(i)]}"

  def image_path(self, i: int) -> Path:
    return self._tables.root / "images" / self._tables.images[self._row(i)]

  def mask_path(self, i: int) -> Optional[Path]:
    mask = self._tables.masks[self._row(i)]
    return self._tables.root / "masks" / mask if mask else None

  def __getitem__(self, i) -> Dict[str, np.ndarray]:
    t = self._tables
    i = example_index(i, len(self), f"folder {self.split}")
    r = self._row(i)
    try:
      image = load_rgb(self.image_path(i))
    except base.DataError as e:
      raise base.DataError(f"{e} ({self.where(i)})") from None
    h, w = image.shape[:2]
    example = {
        "image": image,
        "attributes": t.attributes[r].copy(),
        "attribute_valid": t.attribute_valid[r].copy(),
    }
    if t.keypoints is not None:
      kp = t.keypoints[r].copy()
      inside = (kp[:, 0] >= 0) & (kp[:, 0] < w) & (kp[:, 1] >= 0) & (kp[:, 1] < h)
      flag = t.keypoint_visible[r]
      example["keypoints"] = kp
      example["keypoint_visible"] = np.where(flag >= 0, flag == 1, t.keypoint_annotated[r] & inside)
    if self._has_masks:
      example["part_segmentation"] = load_mask(self.mask_path(i), (h, w),
                                               len(t.info.part_names), self.where(i))
    if t.label is not None:
      example["label"] = np.asarray(t.label[r], np.int32)
    example["index"] = np.asarray(i, np.int64)
    return example


def make_source(root: PathLike, split: str) -> FolderSource:
  """Split `split` (a value of the annotations' split column) of the folder dataset at `root`."""
  if root is None:
    raise base.DataError("dataset 'folder' needs a root folder (--root / config.data.root)")
  return FolderSource(load_tables(root), split)


def check(root: PathLike, *, verify_images: int = 16, progress=None) -> base.CheckReport:
  """Parses the tables, checks that every image and mask exists, decodes the first
  `verify_images` images (and masks) of each split (all when negative)."""
  if root is None:
    raise base.DataError("dataset 'folder' needs --root")
  tables = load_tables(root)
  sources = {s: FolderSource(tables, s) for s in tables.split_names}
  missing = [f"missing image: {src.image_path(i)} ({src.where(i)})"
             for src in sources.values() for i in range(len(src))
             if not src.image_path(i).is_file()]
  missing += [f"missing mask: {src.mask_path(i)} ({src.where(i)})"
              for src in sources.values() for i in range(len(src))
              if src.mask_path(i) is not None and not src.mask_path(i).is_file()]
  if missing:
    raise base.DataError(f"{len(missing)} missing file(s):\n  " + "\n  ".join(missing))
  decoded = verify_split_images(
      {s: [src.image_path(i) for i in range(len(src))] for s, src in sources.items()},
      verify_images, progress)
  for src in sources.values():
    for i in range(len(src) if verify_images < 0 else min(verify_images, len(src))):
      if src.mask_path(i) is not None:
        src[i]  # Decodes the mask and checks its size and labels against the image.
  info = tables.info
  return base.CheckReport(
      dataset="folder", splits={s: len(src) for s, src in sources.items()},
      num_attributes=info.num_attributes, attribute_groups=info.attribute_groups(),
      keypoint_groups=list(info.keypoint_groups), masks=sum(bool(m) for m in tables.masks),
      warnings=list(tables.warnings), images_decoded=decoded)


# ------------------------------------------------------------------------------------------------
# Writing: the synthetic world in this format.


def _float(x) -> str:
  """The shortest text that reads back as the same float32."""
  return repr(float(np.float32(x)))


def export_synthetic(root: PathLike, examples: int, *, splits: Sequence[str] = ("train", "val",
                                                                                 "test"),
                     **options) -> Path:
  """Writes the first `examples` examples of each split of the synthetic world (`options`:
  SyntheticConfig fields) to `root` in this format: PNG images and masks, so reading the folder
  back gives the built-in source's examples bit for bit. Returns `root`."""
  if examples < 1:
    raise ValueError(f"examples must be >= 1, got {examples}")
  options = dict(options)
  options["splits"] = tuple((s, int(examples)) for s in splits)
  config = synthetic.SyntheticConfig.from_options(**options)
  info = synthetic.dataset_info(config)
  root = Path(root)
  if (root / ANNOTATIONS[0]).exists() or (root / ANNOTATIONS[1]).exists():
    raise FileExistsError(f"{root} already holds a folder dataset; choose an empty folder")
  (root / "images").mkdir(parents=True, exist_ok=True)
  (root / "masks").mkdir(parents=True, exist_ok=True)
  with open(root / "attributes.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["attribute", "part"])
    w.writerows([n, info.part_names[g]] for n, g in zip(info.attribute_names, info.attribute_part))
  kp_names = list(info.keypoint_groups)  # One keypoint per part, named after it.
  with open(root / "keypoints.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["keypoint", "part"])
    w.writerows([k, info.keypoint_groups[g]] for k, g in zip(kp_names, info.keypoint_group_ids))
  header = (["image", "split", "label", "mask"] + list(info.attribute_names)
            + [f"{k}_{c}" for k in kp_names for c in ("x", "y", "visible")])
  with open(root / "annotations.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(header)
    for split in splits:
      source = synthetic.SyntheticParts(config, split)
      for i in range(len(source)):
        ex = source[i]
        name = f"{split}/{i:06d}.png"
        for folder, array in (("images", ex["image"]), ("masks", ex["part_segmentation"])):
          (root / folder / split).mkdir(exist_ok=True)
          Image.fromarray(array).save(root / folder / name)
        row = [name, split, int(ex["label"]), name]
        row += ["" if not v else str(int(x)) for x, v in zip(ex["attributes"],
                                                            ex["attribute_valid"])]
        for (x, y), vis in zip(ex["keypoints"], ex["keypoint_visible"]):
          row += [_float(x), _float(y), int(vis)]
        w.writerow(row)
  return root
