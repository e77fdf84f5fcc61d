"""The leakage benchmark of one backbone on one dataset, for one seed (paper Sec. 3, 5.2).

  results, visuals = benchmark.evaluate("dinov2", model, params, vit_config, config, seed=0,
                                        cache_root="/tmp/cache")

Steps:
  1. Part features of the train / val / test splits, late and early masked (extract.py, cached
     per backbone, dataset, split and masking).
  2. K linear probes per masking, weight decay chosen on val (linear.py).
  3. On test: the mAP and AUROC matrices [K, G], the contingency matrix and part assignment, PS
     (eq. 1), MPPO (eq. 2) where ground-truth masks exist, NMI / ARI where keypoints exist
     beside their chance row (the position baseline: k-means with K clusters on the train
     split's keypoints, evaluation/position_baseline.py), with percentile bootstrap intervals
     over test images (the assignment and the baseline's clusters are held fixed).
  4. The causal leakage score on the first `evaluation.leakage_images` test images (leakage.py).

`config` is a probe job config (configs/probe_*.py); only its data, masks, features, probe and
evaluation blocks are read here. The seed picks the val carve-out (when the dataset has no val
split) and the bootstrap draws; a random-init backbone's seed is the caller's business.
"""

import math
import os
import time
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from absl import logging

from metonymy import data as data_lib
from metonymy.data import pipeline as pipeline_lib
from metonymy.data import transforms as transforms_lib
from metonymy.evaluation import bootstrap as bootstrap_lib
from metonymy.evaluation import metrics
from metonymy.evaluation import part_metrics
from metonymy.evaluation import position_baseline as position_baseline_lib
from metonymy.probe import cache as cache_lib
from metonymy.probe import extract as extract_lib
from metonymy.probe import features as features_lib
from metonymy.probe import leakage as leakage_lib
from metonymy.probe import linear
from metonymy.evaluation import patch_grid
from metonymy.probe import masks as masks_lib

ROLES = ("train", "val", "test")


# ------------------------------------------------------------------------------------------------
# Data.


def open_split(data_cfg, split: str, max_examples: int):
  """(source, info, subset indices or None): the split, cut to a fixed random subset of
  `max_examples` (seed 0, independent of the run's seeds so caches are shared) when smaller."""
  source = data_lib.make_source_from_config(data_cfg, split)
  info = source.info
  if max_examples and max_examples < len(source):
    rng = np.random.default_rng(0)
    indices = np.sort(rng.choice(len(source), max_examples, replace=False))
    return extract_lib.IndexSubset(source, indices), info, indices
  return source, info, None


def input_size(vit_config, data_cfg) -> int:
  """The side of the square images the backbone sees (`eval_transforms`' crop)."""
  return int(data_cfg.image_size or vit_config.image_size)


def eval_transforms(vit_config, data_cfg):
  """Resize the shorter side, centre crop to the backbone's input, normalize with its stats."""
  size = input_size(vit_config, data_cfg)
  if size % vit_config.patch_size:
    raise ValueError(f"data.image_size {size} is not a multiple of the patch size "
                     f"{vit_config.patch_size}")
  return transforms_lib.standard(size, train=False, mean=vit_config.image_mean,
                                 std=vit_config.image_std, resize=int(data_cfg.resize) or None)


def denormalize(images: np.ndarray, vit_config) -> np.ndarray:
  """Normalized float images -> uint8 (for overlays)."""
  mean, std = np.asarray(vit_config.image_mean), np.asarray(vit_config.image_std)
  return np.clip((images * std + mean) * 255.0, 0, 255).astype(np.uint8)


def parse_manual_assignment(spec: str, group_names: Sequence[str],
                            num_parts: int) -> Tuple[np.ndarray, List[str]]:
  """evaluation.manual_assignment 'hair:2,5;hat:1' -> (bool [K, G] K_g^+, the groups it names).

  Only the string is parsed here; part_metrics.assign_manually checks the group names and part
  ids. A group named with no parts ('hair:') gets none, so the names are returned too.
  """
  mapping = {}
  for item in filter(None, (s.strip() for s in (spec or "").split(";"))):
    name, sep, parts = item.partition(":")
    if not sep:
      raise ValueError(f"evaluation.manual_assignment item {item!r} is not 'group:part,part'")
    try:
      mapping[name.strip()] = [int(p) for p in parts.split(",") if p.strip()]
    except ValueError:
      raise ValueError(f"evaluation.manual_assignment {item!r}: part ids must be "
                       "integers") from None
  try:
    assignment = part_metrics.assign_manually(mapping, group_names, num_parts)
  except ValueError as e:
    # Name the config key too: assign_manually names the group or part, not where it came from.
    raise ValueError(f"evaluation.manual_assignment {spec!r}: {e}") from None
  return assignment, list(mapping)


def attribute_mask_index(info, num_masks: int) -> Optional[np.ndarray]:
  """g(a) of eq. 2 as an index into the ground-truth masks: CheXlocalize masks are named like the
  attributes; the synthetic world's masks are its keypoint groups, matched to attribute parts by
  name. None when the masks cannot be matched."""
  if info.mask_tasks:
    missing = [n for n in info.attribute_names if n not in info.mask_tasks]
    if missing:
      return None
    return np.asarray([info.mask_tasks.index(n) for n in info.attribute_names], np.int64)
  groups = list(info.keypoint_groups)
  if len(groups) != num_masks or any(p not in groups for p in info.part_names):
    return None
  return np.asarray([groups.index(info.part_names[g]) for g in info.attribute_part], np.int64)


# ------------------------------------------------------------------------------------------------
# Extraction.


# The labels stream's folder. "-v2": it holds the keypoints' positions too (the position
# baseline); a cache written before recomputes its labels alone (one pass over the images and the
# part masks, no backbone forward) and keeps its features.
LABELS_FOLDER = "labels-v2"


def _stream_names(features_cfg) -> Dict[str, str]:
  """masking -> folder name (the feature options that change the arrays are in the name)."""
  return {"late": f"late-{features_cfg.late_weights}", "early": f"early-{features_cfg.prefix}"}


def extract_splits(name: str, model, params, vit_config, config, cache_root: str,
                   progress: bool = True) -> Tuple[Dict[str, Dict], object, object, Dict]:
  """Features and annotations of every split role: (role -> stream -> arrays, info,
  test mask source, masking -> jitted extractor)."""
  data_cfg, masks_cfg, features_cfg = config.data, config.masks, config.features
  maskings = list(features_cfg.maskings)
  unknown = [m for m in maskings if m not in features_lib.MASKINGS]
  if unknown or not maskings:
    raise ValueError(f"features.maskings must be a non-empty subset of {features_lib.MASKINGS}, "
                     f"got {maskings}")
  if "early" in maskings and not getattr(vit_config, "early_masking", vit_config.num_prefix > 0):
    raise ValueError(
        f"backbone {name!r} ({vit_config.family}) has no aggregation token (no CLS, no "
        "registers), and early masking pools each part through its own copy of one (paper Sec. "
        "5.2): only late masking is defined for it. Set --config.features.maskings=\"('late',)\" "
        "(in a suite, the backbone's own `maskings=('late',)`), or for SAM opt into pooling each "
        "part's own tokens of a block-masked forward with --config.backbone.part_pooling=True.")
  transforms = eval_transforms(vit_config, data_cfg)
  params_hash = cache_lib.params_fingerprint(params)
  backbone_dir = f"{_slug(name)}-{cache_lib.fingerprint([vit_config.to_dict(), params_hash])}"
  out, info, test_masks = {}, None, None
  num_parts, extractors = None, None
  for role in ROLES:
    split = data_cfg[role]
    if not split:
      continue
    source, info, subset = open_split(data_cfg, split, int(data_cfg[f"max_{role}"]))
    # Part-map files are indexed by the example's position in the whole split, subset or not.
    split_size = len(source.source) if subset is not None else len(source)
    mask_source = masks_lib.make_source(masks_cfg, split, split_size, info,
                                        vit_config.image_mean, vit_config.image_std)
    if num_parts is not None and mask_source.num_parts != num_parts:
      raise ValueError(f"split {split!r} has {mask_source.num_parts} parts, earlier splits "
                       f"{num_parts}")
    num_parts = mask_source.num_parts
    if role == "test":
      test_masks = mask_source
    identity = {
        "dataset": data_cfg.dataset,
        "root": os.path.abspath(data_cfg.root) if data_cfg.root else "",
        "options": data_lib.source_options(data_cfg), "split": split,
        "subset": None if subset is None else cache_lib.fingerprint(subset.tolist()),
        "num_examples": len(source), "transforms": repr(transforms),
        "masks": mask_source.spec(), "patch_rule": masks_cfg.patch_rule,
        "patch_size": vit_config.patch_size,
        # The labels stream holds one column per keypoint: a new keypoint layout is a new cache.
        "keypoint_group_ids": list(info.keypoint_group_ids),
    }
    split_dir = os.path.join(cache_root, backbone_dir,
                             f"{_slug(data_cfg.dataset)}-{cache_lib.fingerprint(identity)}", split)
    stream_dirs = {"labels": LABELS_FOLDER,
                   **{m: _stream_names(features_cfg)[m] for m in maskings}}
    stores = {
        stream: cache_lib.ChunkStore(os.path.join(split_dir, folder),
                                     {"backbone": name, "backbone_fingerprint": backbone_dir,
                                      "data": identity, "stream": folder},
                                     len(source), int(features_cfg.chunk_size))
        for stream, folder in stream_dirs.items()}
    if extractors is None:  # Once per backbone: every split reuses the compiled forwards.
      extractors = features_lib.make_extractors(model, num_parts, features_cfg.prefix,
                                                features_cfg.late_weights)
      extractors = {m: extractors[m] for m in maskings}
    logging.info("features of %s on %s/%s (%d examples) in %s", name, data_cfg.dataset, split,
                 len(source), split_dir)
    out[role] = extract_lib.extract(
        source, stores=stores, mask_source=mask_source, patch_size=vit_config.patch_size,
        patch_rule=masks_cfg.patch_rule, extractors=extractors, params=params,
        transforms=transforms, batch_size=int(features_cfg.batch_size),
        read_threads=int(data_cfg.read_threads), description=f"{name} {split}",
        progress=progress)
  if "train" not in out or "test" not in out:
    raise ValueError("data.train and data.test must name splits")
  return out, info, test_masks, extractors


def _slug(text: str) -> str:
  return "".join(c if c.isalnum() or c in "-_." else "_" for c in text) or "x"


def carve_validation(arrays: Mapping[str, Mapping[str, np.ndarray]], fraction: float, seed: int):
  """Split the train role into (train, val) by a seeded random permutation."""
  n = len(arrays["labels"]["index"])
  num_val = int(round(fraction * n))
  if not 0 < num_val < n:
    raise ValueError(f"data.val_fraction {fraction} leaves no train or no val examples of {n}")
  order = np.random.default_rng([seed, 1]).permutation(n)
  pick = lambda idx: {stream: {k: v[idx] for k, v in d.items()} for stream, d in arrays.items()}
  return pick(np.sort(order[num_val:])), pick(np.sort(order[:num_val]))


# ------------------------------------------------------------------------------------------------
# Evaluation.


def evaluate(name: str, model, params, vit_config, config, *, seed: int, cache_root: str,
             progress: bool = True) -> Tuple[Dict, Dict]:
  """Runs the benchmark; returns (results: JSON-ready dict, visuals: arrays for the plots)."""
  eval_cfg = config.evaluation
  splits, info, test_masks, extractors = extract_splits(name, model, params, vit_config, config,
                                                        cache_root, progress)
  maskings = list(extractors)
  train, test = splits["train"], splits["test"]
  val = splits.get("val")
  if val is None:
    train, val = carve_validation(train, float(config.data.val_fraction), seed)
  num_parts = test_masks.num_parts
  part_names = list(test_masks.part_names)
  groups = list(info.part_names)
  num_groups = len(groups)
  attr_group = info.attribute_part_array()

  # Probes.
  probe_cfg = linear.ProbeConfig.from_config(config.probe)
  logits, probes_info = {}, {}
  for masking in maskings:
    probes = linear.train_probes(
        train[masking]["features"], train["labels"]["attributes"],
        train["labels"]["attribute_valid"], val[masking]["features"], val["labels"]["attributes"],
        val["labels"]["attribute_valid"], probe_cfg,
        log=lambda line, m=masking: logging.info("%s %s: %s", name, m, line))
    logits[masking] = probes.logits(test[masking]["features"])
    probes_info[masking] = {"weight_decay": probes.weight_decay.tolist(),
                            "weight_decay_path": probes.path.tolist(),
                            "val_map": probes.val_map.tolist(),
                            "iterations": probes.iterations.tolist(), "seconds": probes.seconds}
    logging.info("%s %s probes: %.1f s, weight decay per part %s", name, masking, probes.seconds,
                 probes.weight_decay.tolist())

  labels = test["labels"]
  y, valid = labels["attributes"], labels["attribute_valid"]
  num_test = y.shape[0]

  # Assignment K_g^+: contingency over keypoints where the group has keypoints, manual elsewhere.
  contingency = None
  assignment = np.zeros((num_parts, num_groups), bool)
  assignment_source = ["none"] * num_groups
  keypoint_group = info.keypoint_group_array()  # [M]: several keypoints may share a group.
  if "keypoint_part" in labels:
    contingency = part_metrics.contingency(labels["keypoint_part"], num_parts,
                                           keypoint_group=keypoint_group)
    by_threshold = part_metrics.assign_by_threshold(contingency, float(eval_cfg.tau))
    for g, group in enumerate(groups):
      if group in info.keypoint_groups:
        assignment[:, g] = by_threshold[:, list(info.keypoint_groups).index(group)]
        assignment_source[g] = "contingency"
  manual, manual_groups = parse_manual_assignment(eval_cfg.manual_assignment, groups, num_parts)
  for group in manual_groups:
    g = groups.index(group)
    assignment[:, g] = manual[:, g]
    assignment_source[g] = "manual"

  # The chance row of NMI / ARI: where a keypoint lies, without the image. K clusters fit on
  # the probes' training split (positions as the transforms leave them), predicting test's.
  baseline, position_parts = position_baseline_parts(train["labels"], labels,
                                                     input_size(vit_config, config.data),
                                                     num_parts, seed)

  # MPPO inputs.
  mask_index = None
  if "overlap" in labels:
    mask_index = attribute_mask_index(info, labels["overlap"].shape[2])
  present_for_mppo = None
  if mask_index is not None:
    present_for_mppo = (y > 0.5) & valid & labels["has_masks"][:, None]

  # One bootstrap over test images for everything computed on them (paired across maskings).
  tile = lambda a: np.repeat(a[:, None, :], num_parts, axis=1).reshape(num_test, -1)
  sorted_cols = {m: metrics.SortedColumns(logits[m].reshape(num_test, -1), tile(y), tile(valid))
                 for m in maskings}

  def stat(w):
    out = {}
    for m in maskings:
      ap = sorted_cols[m].average_precision(w).reshape(num_parts, -1)
      auc = sorted_cols[m].roc_auc(w).reshape(num_parts, -1)
      mm = metrics.group_mean(ap, attr_group, num_groups)
      ps_g, ps = part_metrics.part_specificity(mm, assignment)
      out[f"map_matrix_{m}"] = mm
      out[f"auroc_matrix_{m}"] = metrics.group_mean(auc, attr_group, num_groups)
      out[f"map_per_part_{m}"] = _nanmean(ap, 1)
      out[f"auroc_per_part_{m}"] = _nanmean(auc, 1)
      out[f"ps_{m}"] = ps
      out[f"ps_per_group_{m}"] = ps_g
      matched, other = part_metrics.specificity_terms(mm, assignment)
      out[f"map_matched_{m}"] = _nanmean(matched[np.isfinite(ps_g)], 0)
      out[f"map_other_{m}"] = _nanmean(other[np.isfinite(ps_g)], 0)
      if present_for_mppo is not None:
        per_a, value = part_metrics.mppo(logits[m], labels["overlap"], present_for_mppo,
                                         mask_index, w)
        out[f"mppo_{m}"] = value
        out[f"mppo_per_attribute_{m}"] = per_a
    if "late" in maskings and "early" in maskings:
      out["ps_gap"] = out["ps_early"] - out["ps_late"]
    if "keypoint_part" in labels:
      for bg, suffix in ((True, "with_background"), (False, "foreground")):
        r = part_metrics.keypoint_nmi_ari(labels["keypoint_part"], num_parts,
                                          include_background=bg,
                                          keypoint_part_foreground=labels.get("keypoint_part_fg"),
                                          keypoint_group=keypoint_group, weights=w)
        out[f"nmi_{suffix}"], out[f"ari_{suffix}"] = r["nmi"], r["ari"]
    if position_parts is not None:
      # No background cluster: the foreground-only variant is the same number.
      r = baseline.score_parts(position_parts, keypoint_group=keypoint_group, weights=w)
      out["nmi_position"], out["ari_position"] = r["parts/position_NMI"], r["parts/position_ARI"]
    return out

  started = time.perf_counter()
  boot = _bootstrap_dict(stat, num_test, int(eval_cfg.bootstrap), seed, float(eval_cfg.alpha))
  logging.info("%s: metrics with %d bootstrap resamples of %d test images in %.1f s", name,
               int(eval_cfg.bootstrap), num_test, time.perf_counter() - started)

  # Causal leakage on the first test images.
  leak, leak_visual = causal_leakage(extractors, params, vit_config, config, test_masks, seed)

  results = {"backbone": name, "seed": seed, "dataset": config.data.dataset,
             "num_parts": num_parts, "part_names": part_names, "groups": groups,
             "num_examples": {role: int(len(splits[role]["labels"]["index"]))
                              for role in splits},
             "num_train": int(len(train["labels"]["index"])),
             "num_val": int(len(val["labels"]["index"])), "num_test": num_test,
             "maskings": maskings, "probes": probes_info,
             "assignment": assignment.astype(int).tolist(), "assignment_source": assignment_source,
             "tau": float(eval_cfg.tau),
             "contingency": None if contingency is None else _json(contingency),
             "keypoint_groups": list(info.keypoint_groups),
             "position_baseline": None if baseline is None else {
                 "num_clusters": baseline.num_clusters, "num_points": baseline.num_points},
             "attribute_part": attr_group.tolist(),
             "part_presence": _json((test["labels"]["part_patches"] > 0).mean(0)),
             "patches_per_part": _json(test["labels"]["part_patches"].mean(0)),
             "bootstrap": {"resamples": int(eval_cfg.bootstrap), "alpha": float(eval_cfg.alpha)}}
  for key, d in boot.items():
    results[key] = _json(d["value"])
    results[f"{key}_ci"] = [_json(d["low"]), _json(d["high"])]
  for key, d in leak.items():
    results[key] = _json(d["value"])
    results[f"{key}_ci"] = [_json(d["low"]), _json(d["high"])]
  if mask_index is not None:
    results["mppo_attributes"] = list(info.attribute_names)
  visuals = {"leakage_examples": leak_visual}
  return results, visuals


def position_baseline_parts(train_labels: Mapping[str, np.ndarray],
                            test_labels: Mapping[str, np.ndarray], image_size: int,
                            num_parts: int, seed: int):
  """(baseline, int [N_test, M] its cluster under each test keypoint, -1 where invisible): the
  position baseline with `num_parts` clusters fit on the train role's keypoints (the labels
  stream's, in pixels of the image_size x image_size input); (None, None) without keypoints."""
  if "keypoints" not in train_labels or "keypoint_part" not in test_labels:
    return None, None
  image_hw = (image_size, image_size)
  baseline = position_baseline_lib.fit(train_labels["keypoints"],
                                       train_labels["keypoint_visible"], image_hw, num_parts,
                                       seed=seed)
  if baseline is None:
    return None, None
  return baseline, baseline.keypoint_part(test_labels["keypoints"],
                                          test_labels["keypoint_visible"], image_hw)


def _nanmean(x, axis):
  x = np.where(np.isfinite(x), x, np.nan)
  with np.errstate(invalid="ignore"):
    count = np.isfinite(x).sum(axis)
    return np.where(count > 0, np.nansum(x, axis) / np.maximum(count, 1), np.nan)


def _bootstrap_dict(stat, n: int, resamples: int, seed: int, alpha: float) -> Dict[str, Dict]:
  """bootstrap_lib.bootstrap for a stat returning a dict of floats / arrays."""
  point = stat(np.ones(n))
  keys = list(point)
  reps = {k: [] for k in keys}
  if resamples > 0:
    for counts in bootstrap_lib.resample_counts(n, resamples, seed):
      value = stat(counts.astype(np.float64))
      for k in keys:
        reps[k].append(np.asarray(value[k], np.float64))
  out = {}
  for k in keys:
    if resamples > 0:
      out[k] = bootstrap_lib.interval(np.stack(reps[k]), np.asarray(point[k], np.float64), alpha)
    else:
      nan = np.full(np.shape(point[k]), np.nan)
      out[k] = {"value": np.asarray(point[k], np.float64), "low": nan, "high": nan, "std": nan}
  return out


def _json(x):
  """NumPy -> JSON-ready (lists, floats; NaN -> None)."""
  a = np.asarray(x)
  if a.dtype == bool:
    return a.tolist()
  if np.issubdtype(a.dtype, np.integer):
    return a.tolist()
  a = a.astype(np.float64)
  if a.ndim == 0:
    v = float(a)
    return v if math.isfinite(v) else None
  return [_json(v) for v in a]


def causal_leakage(extractors, params, vit_config, config, mask_source, seed: int):
  """Causal leakage scores (leakage.py) on the first `evaluation.leakage_images` test images,
  with bootstrap intervals over images; and a few examples for the overlay figure."""
  eval_cfg, data_cfg, features_cfg = config.evaluation, config.data, config.features
  count = int(eval_cfg.leakage_images)
  overlay_count = int(eval_cfg.overlay_images)
  source, _, _ = open_split(data_cfg, data_cfg.test, int(data_cfg.max_test))
  count = min(max(count, overlay_count), len(source))
  maskings = list(extractors)
  transforms = eval_transforms(vit_config, data_cfg)
  subset = extract_lib.IndexSubset(source, np.arange(count))
  ds = pipeline_lib.make_pipeline(subset, batch_size=int(features_cfg.batch_size), train=False,
                                  transforms=transforms, shard_index=0, shard_count=1,
                                  read_threads=int(data_cfg.read_threads))
  k = mask_source.num_parts
  per_image = {m: [] for m in maskings}
  max_abs = {m: 0.0 for m in maskings}
  visual = {"images": [], "labels": [], "part_ids": [], "keypoints": [], "keypoint_visible": []}
  for batch in ds:
    n = int(np.asarray(batch["valid"]).sum())
    maps = mask_source(batch)
    part_ids, coverage = patch_grid.patch_part_ids(maps.labels, k, vit_config.patch_size,
                                                  config.masks.patch_rule)
    images = np.asarray(batch["image"], np.float32)
    if len(visual["images"]) < overlay_count:
      take = min(n, overlay_count - len(visual["images"]))
      visual["images"].extend(denormalize(images[:take], vit_config))
      visual["labels"].extend(maps.labels[:take])
      visual["part_ids"].extend(part_ids[:take])
      if "keypoints" in batch:
        visual["keypoints"].extend(np.asarray(batch["keypoints"])[:take])
        visual["keypoint_visible"].extend(np.asarray(batch["keypoint_visible"])[:take])
    if n < 2 or not eval_cfg.leakage_images:
      continue
    result = leakage_lib.batch_leakage(extractors, params, images, part_ids, coverage, k,
                                       vit_config.patch_size, num_valid=n)
    for m in maskings:
      present = result[m]["present"][:n]
      change = result[m]["change"][:n]
      per_image[m].append(np.stack([np.where(present, change, 0.0).sum(1), present.sum(1)], 1))
      max_abs[m] = max(max_abs[m], float(np.where(present, result[m]["max_abs"][:n], 0).max()))
  out = {}
  for m in maskings:
    if not per_image[m]:
      continue
    sums = np.concatenate(per_image[m])  # [N, 2]: summed change, parts present

    def stat(w, sums=sums):
      total = (w * sums[:, 1]).sum()
      return (w * sums[:, 0]).sum() / total if total > 0 else np.nan

    d = bootstrap_lib.bootstrap(stat, len(sums), num_resamples=int(eval_cfg.bootstrap),
                                seed=seed, alpha=float(eval_cfg.alpha))
    out[f"causal_leakage_{m}"] = d
    out[f"causal_leakage_max_abs_change_{m}"] = {"value": max_abs[m], "low": np.nan,
                                                 "high": np.nan}
  visual = {key: np.asarray(v) for key, v in visual.items() if len(v)}
  return out, visual
