"""CelebA from a prepared TFDS `celeb_a` data directory (`config.data.source = "tfds"`).

  source = data.make_source("celeba", "~/tensorflow_datasets", "val", source="tfds")
  python -m metonymy.main --config=configs/celeba_single.py --config.data.source=tfds \
      --config.data.root=~/tensorflow_datasets

`root` is the TFDS data_dir holding `celeb_a/<version>/` prepared in the ArrayRecord file format
(`tfds build celeb_a --file_format=array_record`, or `download_and_prepare` with
`file_format="array_record"`). Records are read with `tfds.data_source`, random access, no
TensorFlow: reading needs the `tensorflow-datasets` package only (the `tfds` extra:
`pip install metonymy[tfds]`). The JPEG bytes are decoded here with PIL, as the official-layout
reader decodes the same files, so both give the same pixels.

Examples are celeba.py's: the same 32 attributes of Table S8, the same 4 keypoints (the two eyes
and the nose as they are, the mouth corners averaged, `celeba.landmarks_to_keypoints`), the same
visibility rule, `label` = TFDS's `identity/Identity_No` - 1 (absent in celeb_a < 2.1.0). Splits:
train, val (TFDS's `validation`), test. TFDS stores no file names and shuffles a split's records
when it prepares them, so example i is record i of TFDS's order, not the i-th line of
list_eval_partition.txt: the same examples as the official layout, in another order.
"""

import io
import os
from typing import Dict, Union

import numpy as np
from PIL import Image

from metonymy.data import base
from metonymy.data import celeba
from metonymy.data import groupings
from metonymy.data.files import check_split, example_index

PathLike = Union[str, os.PathLike]
SPLITS = celeba.SPLITS
TFDS_SPLITS = {"train": "train", "val": "validation", "test": "test"}
INSTALL = "pip install tensorflow-datasets importlib_resources (or metonymy[tfds])"


def _tfds():
  try:
    import tensorflow_datasets as tfds
  except ImportError as e:
    raise ImportError(f"config.data.source='tfds' needs tensorflow-datasets ({e}): {INSTALL}; "
                      "TensorFlow itself is not needed to read a prepared dataset") from None
  return tfds


def open_split(data_dir: PathLike, split: str, name: str = "celeb_a"):
  """tfds.data_source over one prepared split, image bytes left encoded."""
  tfds = _tfds()
  check_split(split, SPLITS, "CelebA")
  data_dir = os.path.expanduser(os.fspath(data_dir))
  try:
    return tfds.data_source(name, split=TFDS_SPLITS[split], data_dir=data_dir, download=False,
                            decoders={"image": tfds.decode.SkipDecoding()})
  except Exception as e:  # TFDS raises AssertionError, ValueError, FileNotFoundError, ...
    raise base.DataError(
        f"no prepared {name} (array_record files) under {data_dir}: {type(e).__name__}: {e}. "
        f"Prepare it with `tfds build {name} --data_dir={data_dir} --file_format=array_record` "
        "(preparing needs TensorFlow; reading does not)") from None


def decode_rgb(data: bytes, what: str) -> np.ndarray:
  """Encoded image bytes -> uint8 [H, W, 3] RGB, as files.load_rgb decodes a file."""
  try:
    with Image.open(io.BytesIO(data)) as im:
      return np.array(im.convert("RGB"), dtype=np.uint8)
  except Exception as e:  # PIL raises OSError, SyntaxError, ValueError, ... for broken bytes.
    raise base.DataError(f"corrupt image: {what} ({type(e).__name__}: {e})") from None


class CelebaTfdsSource:
  """Random-access source over one split of a prepared TFDS celeb_a; picklable (the TFDS source
  is reopened in each process)."""

  def __init__(self, data_dir: PathLike, split: str, name: str = "celeb_a"):
    check_split(split, SPLITS, "CelebA")
    self.data_dir, self.split, self.name = data_dir, split, name
    self._records = open_split(data_dir, split, name)
    self._len = len(self._records)
    self._info = celeba.dataset_info()

  def __getstate__(self):
    state = dict(self.__dict__)
    state["_records"] = None
    return state

  @property
  def info(self) -> base.DatasetInfo:
    return self._info

  def __len__(self) -> int:
    return self._len

  def __getitem__(self, i) -> Dict[str, np.ndarray]:
    i = example_index(i, len(self), f"CelebA (TFDS) {self.split}")
    if self._records is None:
      self._records = open_split(self.data_dir, self.split, self.name)
    record = self._records[i]
    image = decode_rgb(record["image"], f"{self.name} {TFDS_SPLITS[self.split]} record {i}")
    h, w = image.shape[:2]
    attributes = record["attributes"]
    landmarks = record["landmarks"]
    points = np.asarray([landmarks[c] for c in groupings.CELEBA_LANDMARK_COLUMNS],
                        np.float32).reshape(5, 2)
    kp = celeba.landmarks_to_keypoints(points)
    visible = (kp[:, 0] >= 0) & (kp[:, 0] < w) & (kp[:, 1] >= 0) & (kp[:, 1] < h)
    example = {
        "image": image,
        "attributes": np.asarray([bool(attributes[a]) for a in groupings.CELEBA_ATTRIBUTES],
                                 np.float32),
        "attribute_valid": np.ones(len(groupings.CELEBA_ATTRIBUTES), bool),
        "keypoints": kp,
        "keypoint_visible": visible,
        "index": np.asarray(i, np.int64),
    }
    if "identity" in record:
      example["label"] = np.asarray(int(record["identity"]["Identity_No"]) - 1, np.int32)
    return example


def make_source(root: PathLike, split: str, name: str = "celeb_a") -> CelebaTfdsSource:
  """CelebA split `train`, `val` or `test` from the TFDS data_dir `root`."""
  if root is None:
    raise base.DataError("source 'tfds' needs the TFDS data_dir as root (config.data.root)")
  return CelebaTfdsSource(root, split, name)


def check(root: PathLike, *, verify_images: int = 16, progress=None,
          name: str = "celeb_a") -> base.CheckReport:
  """Opens every split and reads the first `verify_images` records of each (all if negative)."""
  sources = {s: make_source(root, s, name) for s in SPLITS}
  decoded = 0
  for split, src in sources.items():
    n = len(src) if verify_images < 0 else min(verify_images, len(src))
    for i in range(n):
      src[i]
      decoded += 1
      if progress is not None:
        progress(split, i + 1, n)
  info = celeba.dataset_info()
  warnings = []
  if sources["train"]._len and "label" not in sources["train"][0]:
    warnings.append(f"{name} has no identity feature (< 2.1.0): examples carry no label")
  return base.CheckReport(
      dataset="celeba", splits={s: len(src) for s, src in sources.items()},
      num_attributes=info.num_attributes, attribute_groups=info.attribute_groups(),
      keypoint_groups=list(info.keypoint_groups), warnings=warnings, images_decoded=decoded)
