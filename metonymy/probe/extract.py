"""One pass of a frozen backbone over a split: part features (late / early) and the per-example
annotations the metrics need, cached in resumable chunks (`cache.ChunkStore`).

Streams, each its own ChunkStore folder:
  labels  attributes float32 [N, A], attribute_valid bool [N, A], index int64 [N],
          part_patches int32 [N, K] (patches of each part),
          keypoint_part int16 [N, M] (with keypoints, one column per keypoint, grouped by
          DatasetInfo.keypoint_group_ids), keypoint_part_fg int16 [N, M] (soft maps),
          keypoints float32 [N, M, 2] and keypoint_visible bool [N, M] (with keypoints: (x, y)
          pixels of the transformed image, for the position baseline),
          overlap bool [N, K, T] and has_masks bool [N] (with ground-truth masks)
  late    features float32 [N, K, D], present bool [N, K]
  early   features float32 [N, K, D], present bool [N, K]

Every image is read once per pass, and each masking costs one forward per image. Chunks missing
from any requested stream are recomputed for exactly those streams.
"""

from typing import Callable, Dict, List, Mapping, Sequence

import numpy as np
from tqdm.auto import tqdm

from metonymy.data import pipeline as pipeline_lib
from metonymy.probe import cache as cache_lib
from metonymy.evaluation import patch_grid
from metonymy.probe import masks as masks_lib


class IndexSubset:
  """The examples `indices` of `source`, re-indexed 0..len-1 (each keeps its own `index`)."""

  def __init__(self, source, indices: Sequence[int]):
    self.source = source
    self.indices = np.asarray(indices, np.int64)

  def __len__(self) -> int:
    return len(self.indices)

  def __getitem__(self, i):
    return self.source[int(self.indices[int(i)])]

  @property
  def info(self):
    return self.source.info


def annotate(batch: Mapping[str, np.ndarray], maps: masks_lib.PartMaps, part_ids: np.ndarray,
             num_parts: int) -> Dict[str, np.ndarray]:
  """The `labels` stream's arrays for one batch (see the module docstring)."""
  out = {
      "attributes": np.asarray(batch["attributes"], np.float32),
      "attribute_valid": np.asarray(batch["attribute_valid"], bool),
      "index": np.asarray(batch["index"], np.int64),
      "part_patches": (part_ids.reshape(part_ids.shape[0], -1)[..., None]
                       == np.arange(num_parts)).sum(1).astype(np.int32),
  }
  if "keypoints" in batch:
    out["keypoints"] = np.asarray(batch["keypoints"], np.float32)
    out["keypoint_visible"] = np.asarray(batch["keypoint_visible"], bool)
    out["keypoint_part"] = masks_lib.keypoint_parts(maps.labels, batch["keypoints"],
                                                    batch["keypoint_visible"])
    if maps.foreground is not None:
      out["keypoint_part_fg"] = masks_lib.keypoint_parts(maps.foreground, batch["keypoints"],
                                                         batch["keypoint_visible"])
  gt = masks_lib.ground_truth_masks(batch)
  if gt is not None:
    out["overlap"] = masks_lib.mask_overlap(maps.labels, gt[0], num_parts)
    out["has_masks"] = gt[1]
  return out


def extract(source, *, stores: Mapping[str, cache_lib.ChunkStore], mask_source, patch_size: int,
            patch_rule: str, extractors: Mapping[str, Callable], params, transforms,
            batch_size: int, read_threads: int = 1, description: str = "",
            progress: bool = True) -> Dict[str, Dict[str, np.ndarray]]:
  """Fills every store in `stores` ("labels", "late", "early") and returns their arrays.

  Args:
    source: random-access examples (the split, possibly an `IndexSubset`).
    stores: stream name -> ChunkStore over len(source) examples (same chunk size for all).
    mask_source: batch -> masks_lib.PartMaps.
    patch_size, patch_rule: the backbone's patch size and the partial-patch rule.
    extractors: masking -> jitted fn(params, images, part_ids, coverage) (features.py).
    params: backbone parameters.
    transforms: per-example transform (resize, crop, normalize).
    batch_size: images per forward; the last batch is padded (fixed shapes, one compilation).
    read_threads: Grain read threads (more for JPEG datasets).
    description: progress bar label.
    progress: show a tqdm progress bar.

  Returns:
    stream name -> arrays (all N examples).
  """
  names = list(stores)
  first = stores[names[0]]
  for name, store in stores.items():
    if (store.num_examples, store.chunk_size) != (first.num_examples, first.chunk_size):
      raise ValueError(f"stream {name!r} is chunked differently from {names[0]!r}")
    if store.num_examples != len(source):
      raise ValueError(f"stream {name!r} expects {store.num_examples} examples, source has "
                       f"{len(source)}")
  todo = sorted({i for store in stores.values() for i in store.missing()})
  done_examples = first.num_examples - sum(
      first.chunk_range(i)[1] - first.chunk_range(i)[0] for i in todo)
  bar = None
  if progress and todo:
    bar = tqdm(total=first.num_examples, initial=done_examples, desc=description or "features",
               unit="img", dynamic_ncols=True)
  try:
    for i in todo:
      start, stop = first.chunk_range(i)
      wanted = [n for n in names if not stores[n].has(i)]
      chunk = _run_chunk(IndexSubset(source, np.arange(start, stop)), wanted, mask_source,
                         patch_size, patch_rule, extractors, params, transforms, batch_size,
                         read_threads, bar)
      for name in wanted:
        stores[name].write(i, chunk[name])
  finally:
    if bar is not None:
      bar.close()
  return {name: store.load() for name, store in stores.items()}


def _run_chunk(subset, wanted: List[str], mask_source, patch_size, patch_rule, extractors, params,
               transforms, batch_size, read_threads, bar) -> Dict[str, Dict[str, np.ndarray]]:
  pieces: Dict[str, List[Dict[str, np.ndarray]]] = {name: [] for name in wanted}
  ds = pipeline_lib.make_pipeline(subset, batch_size=batch_size, train=False, transforms=transforms,
                                  shard_index=0, shard_count=1, read_threads=read_threads)
  for batch in ds:
    valid = np.asarray(batch["valid"], bool)
    n = int(valid.sum())
    if not valid[:n].all():  # Evaluation pipelines pad at the end; slicing relies on it.
      raise ValueError("padding rows must come after the real rows of a batch")
    maps = mask_source(batch)
    num_parts = mask_source.num_parts
    part_ids, coverage = patch_grid.patch_part_ids(maps.labels, num_parts, patch_size, patch_rule)
    if "labels" in wanted:
      pieces["labels"].append({k: v[:n] for k, v in annotate(batch, maps, part_ids,
                                                             num_parts).items()})
    for masking in wanted:
      if masking == "labels":
        continue
      feats, present = extractors[masking](params, np.asarray(batch["image"], np.float32),
                                           part_ids, coverage)
      pieces[masking].append({"features": np.asarray(feats, np.float32)[:n],
                              "present": np.asarray(present, bool)[:n]})
    if bar is not None:
      bar.update(n)
  return {name: {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
          for name, parts in pieces.items()}
