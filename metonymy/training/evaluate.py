"""Periodic evaluation during training: attribute mAP/AUROC, part NMI/ARI, part shares and the
collapse check, part-map PNGs, and the workdir's report.md.

The metrics are the leakage benchmark's (metonymy/evaluation/), so training and benchmark
numbers follow one protocol:
  <head>/mAP, <head>/AUROC   mean over attributes of average precision / ROC AUC, over the valid
                              labels of real (non-padding) examples; an attribute without a
                              positive (mAP) or without both classes (AUROC) is skipped. Heads
                              are the model's logits entries, plus "ensemble" (their sum) when
                              there are several (Table S6).
  <head>/bce                  the attribute BCE
  parts/NMI, parts/ARI        PDiscoFormer's protocol against the merged keypoint groups: the maps
                              upsampled bilinearly to the image, read at the pixel of each visible
                              keypoint, argmax over all K+1 channels (background is a cluster);
                              ground truth = the keypoint's group (`keypoint_group`: several
                              keypoints may share one, Tables S7/S8); pooled over the split; x100
  parts/NMI_fg, parts/ARI_fg  the same with the argmax over the K foreground channels (MPAE)
  part_share/<k>              share of the evaluation patches (every patch of every real example)
                              whose argmax over the K+1 maps is channel k; k = 0..K, K = background
  part_share/max              the largest of them; part_share/max_part its channel k
  part_share/num_empty        foreground parts that win no patch on the whole evaluation set
  part_mass/<k>               mean soft probability of channel k over the same patches
  collapsed                   1.0 when one channel (background included) holds more than
                              COLLAPSE_SHARE of the patches or a foreground part is empty, else 0.0
                              (`collapse_warnings` words the same test for the console / report.md)

Stage 1 collapses by giving every patch to one channel, usually the background, which makes NMI
and ARI exactly 0; the shares say so directly, and say it before NMI can (datasets without
keypoints have no NMI at all).
"""

from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from metonymy.evaluation import metrics
from metonymy.evaluation import part_metrics

# One channel above this share of the evaluation patches is a collapse (e.g. Stage 1 giving
# every patch to the background).
COLLAPSE_SHARE = 0.9


def sample_at_keypoints(maps: np.ndarray, keypoints: np.ndarray, image_hw: Sequence[int]) -> np.ndarray:
  """Maps [B, C, h, w] read at keypoints [B, G, 2] ((x, y) pixels of an H x W image) -> [B, G, C].

  Equals upsampling the maps bilinearly to H x W (half-pixel centres, edges clamped) and reading
  the pixel that holds each keypoint.
  """
  batch, channels, height, width = maps.shape
  image_h, image_w = image_hw
  col = (np.floor(keypoints[..., 0]) + 0.5) * width / image_w - 0.5
  row = (np.floor(keypoints[..., 1]) + 0.5) * height / image_h - 0.5
  col = np.clip(col, 0, width - 1)
  row = np.clip(row, 0, height - 1)
  c0, r0 = np.floor(col).astype(np.int64), np.floor(row).astype(np.int64)
  c1, r1 = np.minimum(c0 + 1, width - 1), np.minimum(r0 + 1, height - 1)
  fc, fr = (col - c0)[..., None], (row - r0)[..., None]
  b = np.arange(batch)[:, None]
  # Advanced indices split by a slice put their broadcast dims first: [B, G, C].
  read = lambda r, c: maps[b, :, r, c]
  top = read(r0, c0) * (1 - fc) + read(r0, c1) * fc
  bottom = read(r1, c0) * (1 - fc) + read(r1, c1) * fc
  return top * (1 - fr) + bottom * fr


def attribute_metrics(logits: np.ndarray, labels: np.ndarray, valid: np.ndarray) -> Dict[str, float]:
  """mAP and AUROC (in [0, 1]) over attributes, and the mean BCE, of logits [N, A]."""
  weights = valid.astype(np.float64)
  ap = metrics.average_precision(logits, labels, weights)
  auc = metrics.roc_auc(logits, labels, weights)
  p = np.clip(1 / (1 + np.exp(-logits.astype(np.float64))), 1e-12, 1 - 1e-12)
  bce = -(labels * np.log(p) + (1 - labels) * np.log(1 - p))
  nanmean = lambda x: float(np.nanmean(x)) if np.isfinite(x).any() else float("nan")
  return {"mAP": nanmean(ap), "AUROC": nanmean(auc),
          "bce": float(np.sum(bce * valid) / max(valid.sum(), 1))}


def part_occupancy(maps: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
  """Per channel of maps [B, K+1, h, w]: (patches it wins by argmax, its summed soft probability),
  float64 [K+1] each; both sum to B h w (the maps sum to 1 over channels). Ties go to the lower
  channel, as in the argmax that NMI / ARI and the part ids use."""
  maps = np.asarray(maps)
  groups = maps.shape[1]
  won = np.bincount(np.argmax(maps, axis=1).ravel(), minlength=groups).astype(np.float64)
  mass = maps.astype(np.float64).sum(axis=(0, 2, 3))
  return won, mass


def part_share_scalars(won: np.ndarray, mass: np.ndarray,
                       collapse_share: float = COLLAPSE_SHARE) -> Dict[str, float]:
  """The part_share/*, part_mass/* and collapsed scalars (module docstring) of the counts that
  `part_occupancy` returns, summed over the evaluation set."""
  won, mass = np.asarray(won, np.float64), np.asarray(mass, np.float64)
  total = won.sum()
  if total <= 0:
    raise ValueError("part shares of an empty evaluation set")
  share, soft = won / total, mass / total
  out = {f"part_share/{k}": float(v) for k, v in enumerate(share)}
  out.update({f"part_mass/{k}": float(v) for k, v in enumerate(soft)})
  num_empty = int(np.sum(won[:-1] == 0))
  out.update({"part_share/max": float(share.max()), "part_share/max_part": float(np.argmax(share)),
              "part_share/num_empty": float(num_empty),
              "collapsed": float(share.max() > collapse_share or num_empty > 0)})
  return out


def part_label(k: int, num_parts: int) -> str:
  """How report.md and the warnings name channel k of K + 1 (the last is the background)."""
  return f"{k} (background)" if k == num_parts else str(k)


def collapse_warnings(scalars: Mapping[str, float],
                      collapse_share: float = COLLAPSE_SHARE) -> List[str]:
  """One sentence per sign of collapse in evaluation scalars (without the "eval/" prefix): a
  channel above `collapse_share` of the patches, foreground parts that win no patch. Empty when
  the parts look healthy."""
  shares = {int(name.rsplit("/", 1)[1]): value for name, value in scalars.items()
            if name.startswith("part_share/") and name.rsplit("/", 1)[1].isdigit()}
  if not shares:
    return []
  num_parts = max(shares)  # K: channels 0..K, the background last
  warnings = []
  top = max(shares, key=lambda k: (shares[k], -k))
  if shares[top] > collapse_share:
    warnings.append(f"Part collapse: part {part_label(top, num_parts)} takes "
                    f"{100 * shares[top]:.1f}% of the evaluation patches (more than "
                    f"{100 * collapse_share:g}%).")
  empty = [k for k in range(num_parts) if shares[k] == 0]  # the background is not a part
  if empty:
    parts = "parts" if len(empty) > 1 else "part"
    warnings.append(f"Empty {parts}: {parts} {', '.join(map(str, empty))} of {num_parts} "
                    f"{'win' if len(empty) > 1 else 'wins'} no patch on the whole evaluation set.")
  return warnings


def part_overlay(images: np.ndarray, maps: np.ndarray, mean, std) -> np.ndarray:
  """uint8 [2 S z, n S z, 3]: the images (top row) and their argmax part maps over them (bottom;
  background left uncoloured), zoomed by an integer z so small images are at least 128 px.
  images [n, S, S, 3] normalized; maps [n, K+1, h, w]."""
  from matplotlib import colormaps
  images = np.clip((images * np.asarray(std) + np.asarray(mean)) * 255, 0, 255)
  n, size_h, size_w = images.shape[:3]
  groups = maps.shape[1]
  ids = np.argmax(maps, axis=1)
  ids = ids.repeat(size_h // ids.shape[1], 1).repeat(size_w // ids.shape[2], 2)
  palette = np.asarray(colormaps["tab10" if groups <= 11 else "tab20"].colors)[:, :3] * 255
  colors = palette[ids % len(palette)]
  foreground = (ids < groups - 1)[..., None]
  overlay = np.where(foreground, 0.45 * images + 0.55 * colors, 0.6 * images)
  top = np.concatenate(list(images), axis=1)
  bottom = np.concatenate(list(overlay), axis=1)
  grid = np.concatenate([top, bottom], axis=0).astype(np.uint8)
  zoom = max(1, 128 // max(size_h, size_w))  # Smoke-run images are tiny: make them viewable.
  return grid.repeat(zoom, 0).repeat(zoom, 1)


def evaluate(predict: Callable[[Dict[str, np.ndarray]], Dict[str, Any]],
             batches: Iterable[Dict[str, np.ndarray]], *, image_mean, image_std,
             num_images: int = 8, keypoint_group: Optional[Sequence[int]] = None) -> Dict[str, Any]:
  """Runs `predict` over the evaluation batches and computes the metrics above.

  Args:
    predict: host batch -> {"maps": [B, K+1, h, w], "logits": {head: [B, A]}} plus the batch's
      own `valid`, `attributes`, `attribute_valid` and, when the dataset has them, `keypoints`
      and `keypoint_visible`, for every example of the global batch (as NumPy arrays).
    batches: this process's evaluation batches (padded ones carry valid = False).
    num_images: how many of the first images the overlay shows (0: no overlay).
    keypoint_group: int [M], the group of each of the M keypoints
      (`DatasetInfo.keypoint_group_ids`); None: keypoint m is group m.

  Returns:
    {"scalars": {name: float}, "image": uint8 overlay of the first images or None}.
  """
  logits: Dict[str, List[np.ndarray]] = {}
  labels, label_valid = [], []
  parts_all, parts_fg = [], []  # int [S, M]: the part under each keypoint, -1 if not visible
  num_parts = None
  won = mass = 0.0  # float [K+1]: argmax wins and soft mass per channel, summed over the set
  overlay: Optional[np.ndarray] = None
  for host_batch in batches:
    out = predict(host_batch)
    valid = np.asarray(out["valid"], bool)
    for head, value in out["logits"].items():
      logits.setdefault(head, []).append(np.asarray(value, np.float64)[valid])
    labels.append(np.asarray(out["attributes"])[valid])
    label_valid.append(np.asarray(out["attribute_valid"], bool)[valid])
    maps = np.asarray(out["maps"], np.float32)
    num_parts = maps.shape[1] - 1
    batch_won, batch_mass = part_occupancy(maps[valid])
    won, mass = won + batch_won, mass + batch_mass
    if "keypoints" in out:
      image_hw = np.shape(host_batch["image"])[1:3]
      read = sample_at_keypoints(maps[valid], np.asarray(out["keypoints"])[valid], image_hw)
      visible = np.asarray(out["keypoint_visible"], bool)[valid]
      parts_all.append(np.where(visible, np.argmax(read, -1), part_metrics.INVISIBLE))
      parts_fg.append(np.where(visible, np.argmax(read[..., :-1], -1), part_metrics.INVISIBLE))
    if overlay is None and num_images:
      local = np.asarray(host_batch["image"])[:num_images]
      # The global batch's first rows are this process's first examples on process 0.
      overlay = part_overlay(local, maps[:len(local)], image_mean, image_std)
  if not labels:
    raise ValueError("evaluation got no batches")
  labels_np, valid_np = np.concatenate(labels), np.concatenate(label_valid)
  heads = {head: np.concatenate(chunks) for head, chunks in logits.items()}
  if len(heads) > 1:
    heads["ensemble"] = sum(heads.values())
  scalars = {}
  for head, head_logits in heads.items():
    for name, value in attribute_metrics(head_logits, labels_np, valid_np).items():
      scalars[f"{head}/{name}"] = value
  if parts_all:
    kp_all, kp_fg = np.concatenate(parts_all), np.concatenate(parts_fg)
    with_bg = part_metrics.keypoint_nmi_ari(kp_all, num_parts, include_background=True,
                                            keypoint_group=keypoint_group)
    fg_only = part_metrics.keypoint_nmi_ari(kp_all, num_parts, include_background=False,
                                            keypoint_part_foreground=kp_fg,
                                            keypoint_group=keypoint_group)
    scalars.update({"parts/NMI": with_bg["nmi"], "parts/ARI": with_bg["ari"],
                    "parts/NMI_fg": fg_only["nmi"], "parts/ARI_fg": fg_only["ari"],
                    "parts/num_keypoints": with_bg["num_points"]})
  if len(labels_np):
    scalars.update(part_share_scalars(won, mass))
  scalars["num_examples"] = float(len(labels_np))
  return {"scalars": scalars, "image": overlay}


def _number(value: Optional[float], digits: int) -> str:
  return "n/a" if value is None or not np.isfinite(value) else f"{value:.{digits}f}"


def report_markdown(scalars: Mapping[str, float], warnings: Sequence[str], *, title: str,
                    step: int, total_steps: int) -> str:
  """The train job's report.md: one evaluation's numbers (scalars without the "eval/" prefix),
  NMI / ARI with and without the background side by side, the per-part share table and the
  collapse warnings."""
  lines = [f"# {title}", "",
           f"Evaluation at step {step} of {total_steps} on {int(scalars.get('num_examples', 0))} "
           f"examples; every number is in this run's metrics.jsonl under `eval/` (`eval/collapsed` "
           f"= 1.0 flags the warnings below).", "", "## Warnings", ""]
  if warnings:
    lines += [f"- **{w}**" for w in warnings]
  else:
    lines += [f"None: no part holds more than {100 * COLLAPSE_SHARE:g}% of the evaluation patches "
              f"and every foreground part wins some."]
  heads = [name[:-len("/mAP")] for name in scalars if name.endswith("/mAP")]
  lines += ["", "## Attributes", "", "| Head | mAP | AUROC | BCE |", "|---|---|---|---|"]
  lines += [f"| {h} | {_number(scalars.get(f'{h}/mAP'), 3)} | {_number(scalars.get(f'{h}/AUROC'), 3)} "
            f"| {_number(scalars.get(f'{h}/bce'), 4)} |" for h in heads]
  if "parts/NMI" in scalars:
    lines += ["", f"## Parts at keypoints (x100, {int(scalars.get('parts/num_keypoints', 0))} "
              f"visible keypoints)", "", "| Argmax over | NMI | ARI |", "|---|---|---|",
              f"| K + 1 maps (background included) | {_number(scalars['parts/NMI'], 1)} | "
              f"{_number(scalars['parts/ARI'], 1)} |",
              f"| K foreground maps (MPAE) | {_number(scalars.get('parts/NMI_fg'), 1)} | "
              f"{_number(scalars.get('parts/ARI_fg'), 1)} |"]
  num_channels = sum(1 for name in scalars
                     if name.startswith("part_share/") and name.rsplit("/", 1)[1].isdigit())
  if num_channels:
    lines += ["", "## Share of the evaluation patches per part", "",
              "Share: patches whose argmax over the K + 1 maps is the part; soft mass: the part's "
              "mean probability over the same patches.", "",
              "| Part | Share | Soft mass |", "|---|---|---|"]
    for k in range(num_channels):
      share = scalars[f"part_share/{k}"]
      # A rounded 0.0% would hide whether a part won a few patches or none at all.
      shown = "0 (empty)" if share == 0 else f"{100 * share:.1f}%"
      lines.append(f"| {part_label(k, num_channels - 1)} | {shown} | "
                   f"{scalars[f'part_mass/{k}']:.3f} |")
  return "\n".join(lines) + "\n"
