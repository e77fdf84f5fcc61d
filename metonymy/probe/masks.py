"""Part masks for the leakage benchmark: where they come from, and how they meet the patch grid.

A mask source turns a batch of (transformed) examples into pixel-level part label maps at the
backbone's input resolution:

  labels      int32 [B, H, W]  discovered part id 0..K-1, background K (the ViT's part_ids
                               convention)
  foreground  int32 [B, H, W]  argmax over the K foreground maps alone (soft maps only; None
                               otherwise), for the foreground-only NMI / ARI variant

Sources (`make_source`):
  "ground_truth"  the example's `part_segmentation` (synthetic world: 0 = background, g + 1 =
                  keypoint group g), so discovered part k is ground-truth part k and K = G.
  "file"          part maps saved on disk, one per example of the split, indexed by the example's
                  `index` (its position in the split): `.npy`, or `.npz` holding one array per
                  split (key = split name) or a single array, and optionally an integer scalar
                  `num_parts` (K). Either int label maps [N, H, W] (background id given by
                  `background`: "last" = K, or "first" = 0 with parts 1..K) or float soft maps
                  [N, K + 1, H, W] with the background channel last (PDiscoFormer's order),
                  reduced by argmax. Maps describe the backbone input (after the evaluation resize
                  and centre crop) at any resolution; they are resized to it by nearest
                  neighbour. `path` may contain `{split}`.
                  K comes from the file (`FileMasks._parts_in_file`): the `num_parts` entry of an
                  .npz if it has one, else the channel count of soft maps minus 1, else the
                  largest label of the label maps: with either background convention the labels
                  are 0..K, so the largest is K (the background id itself under "last"; with a
                  split of images, every id occurs somewhere). masks.num_parts = 0 takes that K;
                  any other value must equal it, else the source refuses the file, naming both
                  numbers: a 7-part map (background 7) read as K = 8 would silently turn the
                  background into an eighth foreground part.
  "stage1"        a trained Stage-1 part-discovery model: `path` is its training workdir
                  (`Stage1Masks`).

Partial patches (`patch_part_ids`): the backbone sees one part id per patch. Rule "plurality"
(default): a patch belongs to the label (part or background) covering the most of its pixels;
ties go to the lowest id, so a foreground part wins a tie with the background (id K). Rule
"foreground": a patch with any foreground pixel belongs to the foreground part covering the most
of its pixels (ties to the lowest id); only all-background patches are background. Plurality
keeps each part's patches mostly its own pixels; "foreground" keeps thin parts (legs, tails)
from vanishing on coarse grids at the price of more mixed patches. Late and early masking use the
same patch ids, so the two differ only in where the masking happens.
"""

import os
from typing import Dict, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from metonymy import loading
from metonymy.evaluation import part_names as part_names_lib
from metonymy.evaluation import patch_grid
from metonymy.probe import cache as cache_lib

SOURCES = ("ground_truth", "file", "stage1")


class PartMaps(NamedTuple):
  labels: np.ndarray  # int32 [B, H, W] in [0, K]
  foreground: Optional[np.ndarray]  # int32 [B, H, W] in [0, K - 1], or None


def pixel_mask_of_patches(part_ids: np.ndarray, part: int, patch_size: int) -> np.ndarray:
  """bool [B, H, W]: the pixels of the patches assigned to `part` (what early masking lets part
  `part` see)."""
  m = np.asarray(part_ids) == part
  return np.repeat(np.repeat(m, patch_size, axis=1), patch_size, axis=2)


# ------------------------------------------------------------------------------------------------
# Pixel maps vs annotations.


def keypoint_parts(labels: np.ndarray, keypoints: np.ndarray, visible: np.ndarray) -> np.ndarray:
  """The label under every visible keypoint: int16 [B, M], -1 where invisible or off-image.

  Pixel (row i, column j) covers [j, j+1) x [i, i+1) (the data contract), so keypoint (x, y)
  reads pixel (floor(y), floor(x)): nearest sampling, as PDiscoFormer reads its upsampled maps.

  Args:
    labels: int [B, H, W] pixel part map.
    keypoints: float [B, M, 2] (x, y) pixels, any number M of keypoints (each is read on its
      own; the metrics group them by DatasetInfo.keypoint_group_ids).
    visible: bool [B, M].
  """
  labels = np.asarray(labels)
  b, h, w = labels.shape
  kp = np.asarray(keypoints, np.float64)
  col = np.floor(kp[..., 0]).astype(np.int64)
  row = np.floor(kp[..., 1]).astype(np.int64)
  inside = np.asarray(visible, bool) & (col >= 0) & (col < w) & (row >= 0) & (row < h)
  value = labels[np.arange(b)[:, None], np.clip(row, 0, h - 1), np.clip(col, 0, w - 1)]
  return np.where(inside, value, -1).astype(np.int16)


def mask_overlap(labels: np.ndarray, masks: np.ndarray, num_parts: int) -> np.ndarray:
  """bool [B, K, T]: whether discovered part k shares at least one pixel with mask t.

  Args:
    labels: int [B, H, W] in [0, K].
    masks: bool [B, T, H, W] ground-truth masks (MPPO's M_g).
  """
  labels = np.asarray(labels)
  masks = np.asarray(masks, bool)
  if masks.shape[0] != labels.shape[0] or masks.shape[2:] != labels.shape[1:]:
    raise ValueError(f"masks {masks.shape} do not match part maps {labels.shape}")
  onehot = (labels[:, None] == np.arange(num_parts)[None, :, None, None])  # [B, K, H, W]
  b = labels.shape[0]
  inter = np.einsum("bkn,btn->bkt", onehot.reshape(b, num_parts, -1).astype(np.float32),
                    masks.reshape(b, masks.shape[1], -1).astype(np.float32))
  return inter > 0


def ground_truth_masks(batch: Mapping[str, np.ndarray]) -> Optional[Tuple[np.ndarray, np.ndarray]]:
  """(bool masks [B, T, H, W], bool has_masks [B]) for MPPO, or None if the data has none.

  `masks` (CheXlocalize) is used as is; otherwise the synthetic `part_segmentation` gives one mask
  per keypoint group (T = G, mask g = pixels labelled g + 1).
  """
  if "masks" in batch:
    masks = np.asarray(batch["masks"], bool)
    has = np.asarray(batch.get("has_masks", np.ones(masks.shape[0], bool)), bool)
    return masks, has
  if "part_segmentation" in batch:
    seg = np.asarray(batch["part_segmentation"])
    # Only the synthetic world has a segmentation, and it has one keypoint per part (M = G).
    num_groups = int(batch["keypoints"].shape[1]) if "keypoints" in batch else int(seg.max())
    masks = seg[:, None] == (np.arange(num_groups) + 1)[None, :, None, None]
    return masks, np.ones(seg.shape[0], bool)
  return None


# ------------------------------------------------------------------------------------------------
# Sources.


class GroundTruthMasks:
  """Discovered parts = the synthetic world's ground-truth parts (K = G)."""

  def __init__(self, num_groups: int, group_names: Sequence[str]):
    self.num_parts = int(num_groups)
    self.part_names = tuple(group_names)

  def spec(self) -> Dict:
    return {"source": "ground_truth", "num_parts": self.num_parts}

  def __call__(self, batch: Mapping[str, np.ndarray]) -> PartMaps:
    if "part_segmentation" not in batch:
      raise ValueError("masks.source='ground_truth' needs `part_segmentation` in the examples "
                       "(only the synthetic world has it); use masks.source='file' with saved "
                       "part maps for real datasets")
    return PartMaps(patch_grid.segmentation_part_labels(batch["part_segmentation"],
                                                        self.num_parts), None)


class FileMasks:
  """Part maps saved on disk (see the module docstring for the accepted layouts and for where K
  comes from)."""

  METADATA_KEYS = ("num_parts",)  # .npz entries that are not maps.

  def __init__(self, path: str, split: str, num_examples: int, num_parts: int = 0,
               background: str = "last", part_names: Sequence[str] = ()):
    if background not in ("last", "first"):
      raise ValueError(f"masks.background must be 'last' or 'first', got {background!r}")
    self.path = path.replace("{split}", split)
    self.split = split
    self.background = background
    self.maps, metadata = self._load(self.path, split)
    if self.maps.shape[0] < num_examples:
      raise ValueError(f"{self.path}: {self.maps.shape[0]} part maps for the {num_examples} "
                       f"examples of split {split!r}")
    self.soft = np.issubdtype(self.maps.dtype, np.floating)
    if self.soft and self.maps.ndim != 4:
      raise ValueError(f"{self.path}: float part maps must be [N, K + 1, H, W], got "
                       f"{self.maps.shape}")
    if not self.soft and self.maps.ndim != 3:
      raise ValueError(f"{self.path}: integer part maps must be [N, H, W], got {self.maps.shape}")
    in_file, where = self._parts_in_file(metadata)
    if num_parts and num_parts != in_file:
      raise ValueError(
          f"{self.path}: {where} but masks.num_parts is {num_parts}: K = {in_file} foreground "
          f"parts in the file, {num_parts} in the config. Set masks.num_parts=0 to take K from "
          f"the file, or masks.num_parts={in_file}.")
    self.num_parts = int(in_file)
    if self.num_parts < 1:
      raise ValueError(f"{self.path}: no foreground part found ({where})")
    self.part_names = tuple(part_names) or tuple(part_names_lib.discovered_names(self.num_parts))
    if len(self.part_names) != self.num_parts:
      raise ValueError(f"masks.part_names has {len(self.part_names)} names for {self.num_parts} "
                       f"parts")

  def _parts_in_file(self, metadata: Mapping[str, np.ndarray]) -> Tuple[int, str]:
    """(K, a clause saying how it was found): the .npz's `num_parts` entry, else the soft maps'
    channel count minus 1, else the largest label of the label maps (labels are 0..K under
    either background convention). Label maps holding a label above a recorded K are refused."""
    largest = None if self.soft else int(self.maps.max(initial=0))
    if "num_parts" in metadata:
      recorded = int(np.asarray(metadata["num_parts"]))
      channels = self.maps.shape[1] - 1 if self.soft else None
      if channels is not None and channels != recorded:
        raise ValueError(f"{self.path}: num_parts entry {recorded} but soft maps with "
                         f"{channels + 1} channels (K + 1 expected, background last)")
      if largest is not None and largest > recorded:
        raise ValueError(f"{self.path}: num_parts entry {recorded} but a label {largest} in the "
                         f"maps (labels must lie in [0, {recorded}])")
      return recorded, f"its num_parts entry is {recorded}"
    if self.soft:
      return self.maps.shape[1] - 1, f"soft maps have {self.maps.shape[1]} channels"
    if self.background == "last":
      return largest, (f"the label maps' largest label is {largest} (the background id, "
                       f"masks.background='last')")
    return largest, (f"the label maps' largest label is {largest} (background 0, parts "
                     f"1..{largest}, masks.background='first')")

  @classmethod
  def _load(cls, path: str, split: str) -> Tuple[np.ndarray, Dict[str, np.ndarray]]:
    """(maps, metadata entries of an .npz)."""
    if not os.path.isfile(path):
      raise FileNotFoundError(f"part maps not found: {path} (masks.path)")
    if path.endswith(".npy"):
      return np.load(path, mmap_mode="r"), {}
    if path.endswith(".npz"):
      archive = np.load(path)
      metadata = {k: archive[k] for k in cls.METADATA_KEYS if k in archive.files}
      keys = [k for k in archive.files if k not in cls.METADATA_KEYS]
      if split in keys:
        return archive[split], metadata
      if len(keys) == 1:
        return archive[keys[0]], metadata
      raise ValueError(f"{path}: no array named {split!r} (arrays: {keys})")
    raise ValueError(f"part maps must be a .npy or .npz file, got {path}")

  def spec(self) -> Dict:
    stat = os.stat(self.path)
    return {"source": "file", "path": os.path.abspath(self.path), "size": stat.st_size,
            "mtime": int(stat.st_mtime), "num_parts": self.num_parts,
            "background": self.background}

  def __call__(self, batch: Mapping[str, np.ndarray]) -> PartMaps:
    index = np.asarray(batch["index"], np.int64)
    size = tuple(np.asarray(batch["image"]).shape[1:3])
    maps = np.asarray(self.maps[index])
    k = self.num_parts
    if self.soft:
      maps = patch_grid.resize_nearest(maps, size)
      labels = np.argmax(maps, axis=1).astype(np.int32)
      foreground = np.argmax(maps[:, :k], axis=1).astype(np.int32)
      return PartMaps(labels, foreground)
    labels = patch_grid.resize_nearest(maps, size).astype(np.int32)
    if self.background == "first":
      labels = np.where(labels == 0, k, labels - 1)
    if labels.min(initial=0) < 0 or labels.max(initial=0) > k:
      raise ValueError(f"{self.path}: labels outside [0, {k}] for examples {index.tolist()}")
    return PartMaps(labels.astype(np.int32), None)


class Stage1Masks:
  """Masks predicted by a trained Stage-1 part-discovery model , from its workdir.

  Uses `metonymy.loading.load_trained_part_model(path).pixel_labels(images, mean, std)`:
  the argmax over the K + 1 maps (background last) and over the K foreground maps, at the
  benchmark's image resolution, for images normalized with the benchmark backbone's statistics.
  Evaluation mode (no Gumbel noise), so masks are a deterministic function of the image.
  """

  def __init__(self, workdir: str, image_mean, image_std, part_names: Sequence[str] = ()):
    if not workdir:
      raise ValueError("masks.source='stage1' needs masks.path = a Stage-1 training workdir")
    self.path = workdir
    self.model = loading.load_trained_part_model(workdir)
    self.num_parts = int(self.model.num_parts)
    self.part_names = tuple(part_names) or tuple(part_names_lib.discovered_names(self.num_parts))
    self.image_mean, self.image_std = tuple(image_mean), tuple(image_std)
    self._params_fingerprint = None

  def spec(self) -> Dict:
    # What the masks are a function of: the trained parameters, not where the workdir is, so a
    # moved (or gs://-staged) workdir keeps its feature cache and meta.json names no location.
    return {"source": "stage1", "params": self._fingerprint(),
            "step": int(self.model.meta.get("step") or 0), "num_parts": self.num_parts}

  def _fingerprint(self) -> str:
    if self._params_fingerprint is None:  # Once: every split's cache asks.
      self._params_fingerprint = cache_lib.params_fingerprint(
          {"trained": self.model.params, "frozen": self.model.frozen})
    return self._params_fingerprint

  def __call__(self, batch: Mapping[str, np.ndarray]) -> PartMaps:
    labels, foreground = self.model.pixel_labels(np.asarray(batch["image"], np.float32),
                                                 self.image_mean, self.image_std)
    return PartMaps(np.asarray(labels, np.int32), np.asarray(foreground, np.int32))


def make_source(masks_config, split: str, num_examples: int, info, image_mean=(0.0, 0.0, 0.0),
                image_std=(1.0, 1.0, 1.0)) -> object:
  """The mask source of config block `masks` (config_lib.part_masks) for `split`; image_mean /
  image_std: the normalization of the images the source will see (the benchmark backbone's)."""
  source = masks_config.source
  if source == "ground_truth":
    if not info.keypoint_groups:
      raise ValueError(f"masks.source='ground_truth' needs keypoint groups; dataset "
                       f"{info.name!r} has none")
    return GroundTruthMasks(len(info.keypoint_groups), info.keypoint_groups)
  if source == "file":
    if not masks_config.path:
      raise ValueError("masks.source='file' needs masks.path (a .npy/.npz of part maps)")
    return FileMasks(masks_config.path, split, num_examples, masks_config.num_parts,
                     masks_config.background, _part_names(masks_config))
  if source == "stage1":
    return Stage1Masks(masks_config.path, image_mean, image_std, _part_names(masks_config))
  raise ValueError(f"masks.source must be one of {SOURCES}, got {source!r}")


def _part_names(masks_config) -> Tuple[str, ...]:
  """masks.part_names 'head,body,...' -> ('head', 'body', ...); empty -> ()."""
  return tuple(n.strip() for n in (masks_config.part_names or "").split(",") if n.strip())
