"""Miniature CUB / CelebA / CheXpert (+ CheXlocalize) folders in the official on-disk layouts.

  python -m metonymy.data make-fixture --dataset cub --root /tmp/cub_fixture

Tiny random JPEGs, a few dozen rows, and the real files' quirks: CUB's extra sixth field and
attributes.txt beside CUB_200_2011/, CelebA's irregular spacing, CheXpert's blank and -1 labels,
CheXlocalize masks at a resolution other than the images'. They let a real dataset's config run
end to end in seconds before the dataset is downloaded (`--config.data.root=FIXTURE`), and the
tests check the readers on them. Each builder returns what it wrote (a `SimpleNamespace`) so
tests can compute expected values independently of the loaders. Nothing here comes from the real
datasets except their file formats and name vocabularies: the pixels are noise, so nothing
trained on a fixture means anything.
"""

import csv
import json
import types
from pathlib import Path

import numpy as np
from PIL import Image

from metonymy.data import chexpert
from metonymy.data import groupings

# CUB's attributes.txt: prefixes and values in the real file's order (ids 1..312).
_CUB_COLORS = ("blue", "brown", "iridescent", "purple", "rufous", "grey", "yellow", "olive",
               "green", "pink", "orange", "black", "white", "red", "buff")
_CUB_PATTERNS = ("solid", "spotted", "striped", "multi-colored")
CUB_FILE_ATTRIBUTES = (
    ("has_bill_shape", ("curved_(up_or_down)", "dagger", "hooked", "needle", "hooked_seabird",
                        "spatulate", "all-purpose", "cone", "specialized")),
    ("has_wing_color", _CUB_COLORS),
    ("has_upperparts_color", _CUB_COLORS),
    ("has_underparts_color", _CUB_COLORS),
    ("has_breast_pattern", _CUB_PATTERNS),
    ("has_back_color", _CUB_COLORS),
    ("has_tail_shape", ("forked_tail", "rounded_tail", "notched_tail", "fan-shaped_tail",
                        "pointed_tail", "squared_tail")),
    ("has_upper_tail_color", _CUB_COLORS),
    ("has_head_pattern", ("spotted", "malar", "crested", "masked", "unique_pattern", "eyebrow",
                          "eyering", "plain", "eyeline", "striped", "capped")),
    ("has_breast_color", _CUB_COLORS),
    ("has_throat_color", _CUB_COLORS),
    ("has_eye_color", tuple(c for c in _CUB_COLORS if c != "iridescent")),
    ("has_bill_length", ("about_the_same_as_head", "longer_than_head", "shorter_than_head")),
    ("has_forehead_color", _CUB_COLORS),
    ("has_under_tail_color", _CUB_COLORS),
    ("has_nape_color", _CUB_COLORS),
    ("has_belly_color", _CUB_COLORS),
    ("has_wing_shape", ("rounded-wings", "pointed-wings", "broad-wings", "tapered-wings",
                        "long-wings")),
    ("has_size", ("large_(16_-_32_in)", "small_(5_-_9_in)", "very_large_(32_-_72_in)",
                  "medium_(9_-_16_in)", "very_small_(3_-_5_in)")),
    ("has_shape", ("upright-perching_water-like", "chicken-like-marsh", "long-legged-like",
                   "duck-like", "owl-like", "gull-like", "hummingbird-like", "pigeon-like",
                   "tree-clinging-like", "hawk-like", "sandpiper-like", "upland-ground-like",
                   "swallow-like", "perching-like")),
    ("has_back_pattern", _CUB_PATTERNS),
    ("has_tail_pattern", _CUB_PATTERNS),
    ("has_belly_pattern", _CUB_PATTERNS),
    ("has_primary_color", _CUB_COLORS),
    ("has_leg_color", _CUB_COLORS),
    ("has_bill_color", _CUB_COLORS),
    ("has_crown_color", _CUB_COLORS),
    ("has_wing_pattern", _CUB_PATTERNS),
)
CUB_FILE_ATTRIBUTE_NAMES = tuple(f"{p}::{v}" for p, vals in CUB_FILE_ATTRIBUTES for v in vals)


def write_jpeg(path: Path, size, rng: np.random.Generator, gray: bool = False) -> None:
  """A random JPEG of `size` (w, h)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  w, h = size
  shape = (h, w) if gray else (h, w, 3)
  Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)).save(path, quality=80)


def corrupt_file(path: Path) -> None:
  """Truncates a JPEG to a header fragment: PIL opens it, decoding fails."""
  data = Path(path).read_bytes()
  Path(path).write_bytes(data[:max(20, len(data) // 4)])


# ------------------------------------------------------------------------------------------------


def make_cub(tmp: Path, *, n_images: int = 24, n_classes: int = 4, attributes_beside: bool = True,
             extra_field_lines: int = 3, image_size=(32, 24), seed: int = 0):
  """tmp/CUB_200_2011/... plus tmp/attributes.txt (or inside CUB_200_2011/ if not beside)."""
  rng = np.random.default_rng(seed)
  d = Path(tmp) / "CUB_200_2011"
  (d / "parts").mkdir(parents=True, exist_ok=True)
  (d / "attributes").mkdir(parents=True, exist_ok=True)
  ids = np.arange(1, n_images + 1)
  classes = (ids - 1) % n_classes + 1
  is_train = rng.permutation(np.arange(n_images) % 2 == 0)
  paths = []
  for i, c in zip(ids, classes):
    rel = f"{c:03d}.Bird_{c}/Bird_{c}_{i:04d}_{100 + i}.jpg"
    write_jpeg(d / "images" / rel, image_size, rng, gray=(i == 3))  # CUB has a few grayscale.
    paths.append(rel)
  (d / "images.txt").write_text("".join(f"{i} {p}\n" for i, p in zip(ids, paths)))
  (d / "image_class_labels.txt").write_text("".join(f"{i} {c}\n" for i, c in zip(ids, classes)))
  (d / "train_test_split.txt").write_text(
      "".join(f"{i} {int(t)}\n" for i, t in zip(ids, is_train)))
  w, h = image_size
  (d / "bounding_boxes.txt").write_text(
      "".join(f"{i} 1.0 2.0 {w - 3}.0 {h - 4}.0\n" for i in ids))
  (d / "parts" / "parts.txt").write_text(
      "".join(f"{k + 1} {name}\n" for k, name in enumerate(groupings.CUB_KEYPOINTS)))
  visible = rng.random((n_images, 15)) < 0.6
  visible[0] = False  # An image with no visible part at all.
  visible[1] = True
  xy = np.stack([rng.integers(0, w, (n_images, 15)), rng.integers(0, h, (n_images, 15))], -1)
  xy = np.where(visible[..., None], xy + 0.5, 0.0)
  (d / "parts" / "part_locs.txt").write_text("".join(
      f"{i} {k + 1} {xy[n, k, 0]:.1f} {xy[n, k, 1]:.1f} {int(visible[n, k])}\n"
      for n, i in enumerate(ids) for k in range(15)))
  names_path = (Path(tmp) if attributes_beside else d) / "attributes.txt"
  names_path.write_text(
      "".join(f"{a + 1} {name}\n" for a, name in enumerate(CUB_FILE_ATTRIBUTE_NAMES)))
  present = (rng.random((n_images, 312)) < 0.3).astype(np.int64)
  certainty = rng.integers(1, 5, (n_images, 312))
  lines = []
  for n, i in enumerate(ids):
    for a in range(312):
      lines.append(f"{i} {a + 1} {present[n, a]} {certainty[n, a]} {rng.integers(0, 30)}.{a % 10}")
  # The real file's quirk: a few lines carry a sixth field.
  extra_at = rng.choice(len(lines), extra_field_lines, replace=False)
  for k in extra_at:
    lines[k] += " 0"
  (d / "attributes" / "image_attribute_labels.txt").write_text("\n".join(lines) + "\n")
  return types.SimpleNamespace(
      root=Path(tmp), dataset_dir=d, attributes_txt=names_path, ids=ids, classes=classes,
      is_train=is_train, paths=paths, keypoints=xy.astype(np.float32), visible=visible,
      present=present, certainty=certainty, extra_field_lines=extra_field_lines,
      image_size=image_size)


# ------------------------------------------------------------------------------------------------


def _aligned(rows, widths=None):
  """Rows padded like CelebA's files: values right-aligned, separated by runs of spaces."""
  out = []
  for name, values in rows:
    out.append(name + " " + " ".join(f"{v:>2}" if widths is None else f"{v:>{widths}}"
                                     for v in values))
  return out


def make_celeba(tmp: Path, *, layout: str = "official", n_images: int = 30,
                image_size=(18, 22), identity: bool = True, seed: int = 0):
  """CelebA in the official (Img/ Anno/ Eval/) or flat torchvision layout under tmp."""
  rng = np.random.default_rng(seed)
  tmp = Path(tmp)
  if layout == "official":
    img_dir, anno, evl = tmp / "Img" / "img_align_celeba", tmp / "Anno", tmp / "Eval"
  elif layout == "flat":
    img_dir, anno, evl = tmp / "img_align_celeba", tmp, tmp
  else:
    raise ValueError(layout)
  anno.mkdir(parents=True, exist_ok=True)
  evl.mkdir(parents=True, exist_ok=True)
  files = [f"{i:06d}.jpg" for i in range(1, n_images + 1)]
  for f in files:
    write_jpeg(img_dir / f, image_size, rng)
  # 0/1/2 in blocks, like the real file (train first, then val, then test).
  split = np.repeat([0, 1, 2], [n_images - 2 * (n_images // 5), n_images // 5, n_images // 5])
  (evl / "list_eval_partition.txt").write_text("".join(f"{f} {s}\n" for f, s in zip(files, split)))
  attrs = np.where(rng.random((n_images, 40)) < 0.4, 1, -1)
  header = " ".join(groupings.CELEBA_RAW_ATTRIBUTES)
  (anno / "list_attr_celeba.txt").write_text(
      f"{n_images}\n{header} \n"
      + "\n".join(_aligned([(f, list(a)) for f, a in zip(files, attrs)])) + "\n")
  w, h = image_size
  lm = np.stack([rng.integers(1, w - 1, (n_images, 5)), rng.integers(1, h - 1, (n_images, 5))], -1)
  lm[-1, 2] = (w + 7, h + 3)  # One nose outside the image: that keypoint is invisible.
  (anno / "list_landmarks_align_celeba.txt").write_text(
      f"{n_images}\n" + " ".join(groupings.CELEBA_LANDMARK_COLUMNS) + "\n"
      + "\n".join(_aligned([(f, list(v.reshape(-1))) for f, v in zip(files, lm)], 4)) + "\n")
  ident = rng.integers(1, 6, n_images)
  if identity:
    (anno / "identity_CelebA.txt").write_text("".join(f"{f} {i}\n" for f, i in zip(files, ident)))
  (anno / "list_bbox_celeba.txt").write_text(
      f"{n_images}\nimage_id x_1 y_1 width height\n"
      + "\n".join(_aligned([(f, [10, 20, 100, 120]) for f in files], 4)) + "\n")
  return types.SimpleNamespace(
      root=tmp, image_dir=img_dir, anno_dir=anno, eval_dir=evl, files=files, split=split,
      attrs=attrs, landmarks=lm.astype(np.float32), identity=ident, image_size=image_size)


# ------------------------------------------------------------------------------------------------


_CHEX_COLUMNS = ["Path", "Sex", "Age", "Frontal/Lateral", "AP/PA"] + list(
    groupings.CHEXPERT_OBSERVATIONS)
_LABEL_TEXT = {1: "1.0", 0: "0.0", -1: "-1.0", None: ""}


def _chex_rows(rng, dataset_name: str, split: str, n_patients: int, *, uncertain: bool,
               prefix: bool = True):
  rows = []
  for p in range(n_patients):
    patient = f"patient{64541 + p if split != 'train' else p + 1:05d}"
    for view, frontal in (("view1_frontal", True), ("view2_lateral", False)):
      if not frontal and p % 2:
        continue  # Not every study has a lateral view.
      rel = f"{split}/{patient}/study1/{view}.jpg"
      path = f"{dataset_name}/{rel}" if prefix else rel
      choices = [1, 0, -1, None] if uncertain else [1, 0]
      labels = {o: choices[rng.integers(len(choices))] for o in groupings.CHEXPERT_OBSERVATIONS}
      rows.append(dict(path=path, rel=rel, frontal=frontal, labels=labels))
  return rows


def make_chexpert(tmp: Path, *, small: bool = True, with_test: bool = True,
                  chexlocalize: bool = True, image_size=(20, 24), mask_scale: int = 3,
                  seed: int = 0, test_layout: str = "chexpert"):
  """tmp/CheXpert-v1.0[-small]/{train,valid,test}.csv + images, tmp/CheXlocalize/*.json.

  The CheXlocalize masks are drawn at `mask_scale` times the image size (the "original
  resolution" of the small images), encoded with `chexpert.rle_encode`. The test split:
  `test_layout="chexpert"` puts it in the dataset folder (test.csv, test/); "chexlocalize" where
  CheXlocalize's download ships it, tmp/CheXpert/{test_labels.csv, test/}.
  """
  if test_layout not in ("chexpert", "chexlocalize"):
    raise ValueError(f"test_layout must be 'chexpert' or 'chexlocalize', not {test_layout!r}")
  rng = np.random.default_rng(seed)
  tmp = Path(tmp)
  name = "CheXpert-v1.0-small" if small else "CheXpert-v1.0"
  d = tmp / name
  d.mkdir(parents=True, exist_ok=True)
  splits = {"train": _chex_rows(rng, name, "train", 6, uncertain=True),
            "valid": _chex_rows(rng, name, "valid", 4, uncertain=False)}
  if with_test:
    # CheXlocalize's test labels: Path without the dataset prefix, no Frontal/Lateral column.
    splits["test"] = _chex_rows(rng, name, "test", 3, uncertain=False, prefix=False)
  w, h = image_size
  test_dir = tmp / "CheXpert" if test_layout == "chexlocalize" else d
  for split, rows in splits.items():
    split_dir = test_dir if split == "test" else d
    for r in rows:
      write_jpeg(split_dir / r["rel"], image_size, rng, gray=True)
    columns = ([c for c in _CHEX_COLUMNS if c not in ("Sex", "Age", "Frontal/Lateral", "AP/PA")]
               if split == "test" else _CHEX_COLUMNS)
    csv_name = "test_labels.csv" if split == "test" and test_layout == "chexlocalize" else (
        f"{split}.csv")
    split_dir.mkdir(parents=True, exist_ok=True)
    with open(split_dir / csv_name, "w", newline="") as f:
      writer = csv.writer(f)
      writer.writerow(columns)
      for r in rows:
        extra = {"Path": r["path"], "Sex": "Female", "Age": "60",
                 "Frontal/Lateral": "Frontal" if r["frontal"] else "Lateral",
                 "AP/PA": "AP" if r["frontal"] else ""}
        writer.writerow([extra[c] if c in extra else _LABEL_TEXT[r["labels"][c]]
                         for c in columns])
  masks = {}
  if chexlocalize:
    loc = tmp / "CheXlocalize"
    loc.mkdir(exist_ok=True)
    H, W = h * mask_scale, w * mask_scale + 1  # Not an exact multiple: resizing must cope.
    for split, fname in (("valid", "gt_segmentations_val.json"),
                         ("test", "gt_segmentations_test.json")):
      if split not in splits:
        continue
      data = {}
      for k, r in enumerate(splits[split]):
        if not r["frontal"] or k == 0:
          continue  # Like the real JSON: only some images (here: frontal ones, not the first).
        image_id = "_".join(r["rel"][:-4].split("/")[-3:])
        entry = {}
        for t, task in enumerate(groupings.CHEXLOCALIZE_TASKS):
          if t == 2 and k % 2:
            continue  # A task missing from an entry: must read as all zero.
          m = np.zeros((H, W), bool)
          if (t + k) % 3 == 0:
            y0, x0 = rng.integers(0, H // 2), rng.integers(0, W // 2)
            m[y0:y0 + H // 3, x0:x0 + W // 4] = True
          entry[task] = chexpert.rle_encode(m)
          masks[(split, image_id, groupings.CHEXPERT_TASKS[t])] = m
        data[image_id] = entry
      (loc / fname).write_text(json.dumps(data))
  return types.SimpleNamespace(root=tmp, dataset_dir=d, test_dir=test_dir, splits=splits,
                               masks=masks, image_size=image_size)


# make-fixture's datasets -> the builder, called with the root and the number of images.
BUILDERS = {"cub": lambda root, n: make_cub(root, n_images=n),
            "celeba": lambda root, n: make_celeba(root, n_images=n),
            "chexpert": lambda root, n: make_chexpert(root)}
