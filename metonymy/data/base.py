"""The data contract every source follows (synthetic world, CUB, CelebA, CheXpert).

A source is random-access (`__len__`, `__getitem__`), deterministic, and returns one example as
a dict of NumPy arrays. Keys (absent when a dataset has no such annotation):

  image              uint8   [H, W, 3]  decoded, not normalized (pipelines normalize with the
                                        backbone's image_mean / image_std)
  attributes         float32 [A]        1 present / 0 absent, the part-localized attributes
  attribute_valid    bool    [A]        False where a label is unknown (e.g. CheXpert's -1 under
                                        the "ignore" policy); all True otherwise
  keypoints          float32 [M, 2]     (x, y) in pixels of `image`: the dataset's M keypoints (CUB
                                        its 15 originals; CelebA both eyes, the nose, the mouth
                                        corners' mean); `DatasetInfo.keypoint_group_ids` says
                                        which keypoint group each one belongs to
  keypoint_visible   bool    [M]
  part_segmentation  uint8   [H, W]     0 = background, g + 1 = keypoint group g (synthetic only)
  part_evidence      bool    [H, W]     where a part shows its attributes (synthetic only, with
                                        evidence_fraction < 1; elsewhere its plain tone)
  masks              bool    [T, H, W]  per-task localization masks (CheXlocalize)
  has_masks          bool    []         whether `masks` holds ground truth for this image
  label              int32   []         class / species / patient-level label where one exists
  index              int64   []         position of the example in its split

`DatasetInfo` carries what does not vary per example: names, and the attribute -> part table.
"""

import dataclasses
from typing import Dict, List, Tuple

import numpy as np


class DataError(ValueError):
  """A dataset folder, file, line or image that cannot be used. The message names it."""


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  name: str
  attribute_names: Tuple[str, ...]
  # The semantic parts the attributes are grouped into (Tables S8/S9), lower-case.
  part_names: Tuple[str, ...]
  # attribute_part[a] = index into part_names of attribute a's part.
  attribute_part: Tuple[int, ...]
  # Keypoint groups, the ground-truth parts of NMI / ARI and the contingency (Table S7 for CUB;
  # eye/nose/mouth for CelebA); may be empty.
  keypoint_groups: Tuple[str, ...] = ()
  # keypoint_group_ids[m] = index into keypoint_groups of keypoint m's group, [M]. Groups merge
  # by relabelling, so several keypoints may share one (CUB's two wings). Empty: one keypoint per
  # group, in group order (M = G, the synthetic world); __post_init__ fills that in.
  keypoint_group_ids: Tuple[int, ...] = ()
  # Localization task names for `masks` (CheXlocalize); may be empty.
  mask_tasks: Tuple[str, ...] = ()

  def __post_init__(self):
    ids = tuple(int(g) for g in self.keypoint_group_ids) or tuple(range(len(self.keypoint_groups)))
    if sorted(set(ids)) != list(range(len(self.keypoint_groups))):
      raise ValueError(f"keypoint_group_ids {ids} must name every one of the "
                       f"{len(self.keypoint_groups)} keypoint groups, and only them")
    object.__setattr__(self, "keypoint_group_ids", ids)  # Frozen: set once, here.

  @property
  def num_attributes(self) -> int:
    return len(self.attribute_names)

  def attribute_groups(self) -> Dict[str, int]:
    """{part: number of attributes}, in part order."""
    counts = np.bincount(np.asarray(self.attribute_part, np.int64), minlength=len(self.part_names))
    return {name: int(c) for name, c in zip(self.part_names, counts)}

  def attribute_part_array(self) -> np.ndarray:
    return np.asarray(self.attribute_part, np.int32)

  def keypoint_group_array(self) -> np.ndarray:
    """int32 [M]: each keypoint's group (`keypoint_group_ids`)."""
    return np.asarray(self.keypoint_group_ids, np.int32)


@dataclasses.dataclass
class CheckReport:
  """What `python -m metonymy.data check` prints as its last line (as JSON)."""
  dataset: str
  splits: Dict[str, int]
  num_attributes: int
  attribute_groups: Dict[str, int]
  keypoint_groups: List[str]
  masks: int = 0
  warnings: List[str] = dataclasses.field(default_factory=list)
  images_decoded: int = 0  # How many images the check decoded (every listed one must exist).

  def to_dict(self):
    return dataclasses.asdict(self)
