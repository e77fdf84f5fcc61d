"""Periodic evaluation during training: attribute mAP/AUROC, part NMI/ARI, part shares and the
collapse check, the part-map image (`part_overlay`: images, discovered parts, ground truth,
legend), and the workdir's report.md.

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
  parts/position_NMI, ..._ARI, the chance row: a position-only partition (k-means on the training
  parts/position_NMI_fg, ...  keypoints, evaluation/position_baseline.py) scored at the same
                              keypoints, when the trainer fits one
  parts/coverage/<g>          mask coverage (Fig. 4), datasets with a part segmentation only: the
  parts/area_ratio/<g>        truth on the maps' patch grid (plurality rule, patch_grid.py) against
  parts/best_part/<g>         the argmax over the K + 1 maps, pooled over the set. best_part: the
  parts/coverage,             discovered part k*(g) holding most of true part g's patches (never
  parts/area_ratio            the background); coverage: the share of g's patches labelled k*;
                              area_ratio: all patches labelled k* over g's (above 1: k* spills
                              beyond g). g = 0..G-1 is segmentation label g + 1; the unsuffixed
                              names are the means over the true parts present
  parts/background_share      the background channel's share of the patches (part_share/<K>)
  parts/background_share_true beside the truth's background share on the same grid, and
  parts/background_gap        their difference, warned of when above BACKGROUND_GAP (datasets
                              with a part segmentation only; `collapsed` keeps the rule above)
  parts/object_in_background  the share of the true object's patches (every true part's) that
  parts/in_background/<g>     the background channel takes, and of true part g's: a background
                              channel at the truth's share can still hold the wrong patches
  parts/background_in_parts   the share of the true background's patches the K parts take

Stage 1 collapses by giving every patch to one channel, usually the background, which makes NMI
and ARI exactly 0; the shares say so directly, and say it before NMI can (datasets without
keypoints have no NMI at all).
"""

import textwrap
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
import numpy as np

from metonymy import reporting
from metonymy.evaluation import metrics
from metonymy.evaluation import part_metrics
from metonymy.evaluation import part_names as part_names_lib
from metonymy.evaluation import patch_grid

# One channel above this share of the evaluation patches is a collapse (e.g. Stage 1 giving
# every patch to the background).
COLLAPSE_SHARE = 0.9
# The background channel off the truth's background share by more than this (a fraction of the
# patches) is warned of: Stage 1 on world v3 gave the background 92-95% of the patches against
# the truth's 80% (docs/experiments.md), around COLLAPSE_SHARE, and with the priors off almost
# none of them.
BACKGROUND_GAP = 0.15


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


def segmentation_confusion(segmentation: np.ndarray, maps: np.ndarray,
                           num_true_parts: int) -> np.ndarray:
  """Patch counts [G + 1, K + 1] (part_metrics.patch_confusion) of one batch: the true parts of
  `segmentation` (int [B, H, W], 0 = background, g + 1 = part g) on the patch grid of `maps`
  ([B, K + 1, h, w]; H = p h, W = p w) by the plurality rule, against the argmax over the maps."""
  seg = np.asarray(segmentation)
  batch, channels, height, width = np.shape(maps)
  patch = seg.shape[1] // height if seg.ndim == 3 else 0
  if (seg.ndim != 3 or seg.shape[0] != batch or patch < 1
      or seg.shape[1:] != (patch * height, patch * width)):
    raise ValueError(f"part_segmentation {seg.shape} does not tile the maps' {batch} x "
                     f"{height} x {width} patch grid")
  labels = patch_grid.segmentation_part_labels(seg, num_true_parts)
  true_ids, _ = patch_grid.patch_part_ids(labels, num_true_parts, patch)
  return part_metrics.patch_confusion(true_ids, np.argmax(maps, axis=1), num_true_parts,
                                      channels - 1)


def _share(count: float, total: float) -> float:
  """count / total; NaN when there is nothing to share (a set without that region)."""
  return float(count / total) if total > 0 else float("nan")


def coverage_scalars(confusion: np.ndarray) -> Dict[str, float]:
  """The parts/coverage*, parts/area_ratio*, parts/best_part/*, parts/background_*,
  parts/object_in_background and parts/in_background/* scalars (module docstring) of a patch
  confusion [G + 1, K + 1] summed over the evaluation set."""
  coverage = part_metrics.mask_coverage(confusion)
  confusion = np.asarray(confusion, np.float64)
  total = max(confusion.sum(), 1.0)
  background, background_true = confusion[:, -1].sum() / total, confusion[-1].sum() / total
  out = {"parts/background_share": float(background),
         "parts/background_share_true": float(background_true),
         "parts/background_gap": float(background - background_true),
         "parts/object_in_background": _share(confusion[:-1, -1].sum(), confusion[:-1].sum()),
         "parts/background_in_parts": _share(confusion[-1, :-1].sum(), confusion[-1].sum())}
  for g in range(len(confusion) - 1):
    out[f"parts/in_background/{g}"] = _share(confusion[g, -1], confusion[g].sum())
  for g, (best, share, ratio) in enumerate(zip(coverage["best_part"], coverage["coverage"],
                                               coverage["area_ratio"])):
    out.update({f"parts/coverage/{g}": float(share), f"parts/area_ratio/{g}": float(ratio),
                # A part with no patch has no match (NaN, like its coverage).
                f"parts/best_part/{g}": float(best) if np.isfinite(share) else float("nan")})
  present = np.isfinite(coverage["coverage"])
  mean = lambda x: float(np.mean(x[present])) if present.any() else float("nan")
  out.update({"parts/coverage": mean(coverage["coverage"]),
              "parts/area_ratio": mean(coverage["area_ratio"])})
  return out


def part_label(k: int, num_parts: int) -> str:
  """How report.md and the warnings name channel k of K + 1 (scalars `part_share/<k>`): "part
  k+1" for a discovered part (the part-map image's and the probe's name), "background" last."""
  return part_names_lib.BACKGROUND if k == num_parts else part_names_lib.part_name(k)


def collapse_warnings(scalars: Mapping[str, float],
                      collapse_share: float = COLLAPSE_SHARE) -> List[str]:
  """One sentence per sign of collapse in evaluation scalars (without the "eval/" prefix): a
  channel above `collapse_share` of the patches, the background channel off the truth's share by
  more than BACKGROUND_GAP (when the scalars have it), foreground parts that win no patch. Empty
  when the parts look healthy."""
  shares = {int(name.rsplit("/", 1)[1]): value for name, value in scalars.items()
            if name.startswith("part_share/") and name.rsplit("/", 1)[1].isdigit()}
  if not shares:
    return []
  num_parts = max(shares)  # K: channels 0..K, the background last
  warnings = []
  top = max(shares, key=lambda k: (shares[k], -k))
  if shares[top] > collapse_share:
    warnings.append(f"Part collapse: {part_label(top, num_parts)} takes "
                    f"{100 * shares[top]:.1f}% of the evaluation patches (more than "
                    f"{100 * collapse_share:g}%).")
  empty = [k for k in range(num_parts) if shares[k] == 0]  # the background is not a part
  gap = scalars.get("parts/background_gap")
  if gap is not None and np.isfinite(gap) and abs(gap) > BACKGROUND_GAP:
    warnings.append(f"Background off the truth: the background channel takes "
                    f"{100 * scalars['parts/background_share']:.1f}% of the patches, the true "
                    f"background {100 * scalars['parts/background_share_true']:.1f}% (more than "
                    f"{100 * BACKGROUND_GAP:g} points apart).")
  if empty:
    parts = "parts" if len(empty) > 1 else "part"
    names = ", ".join(part_label(k, num_parts) for k in empty)
    warnings.append(f"Empty {parts}: {names} of {num_parts} "
                    f"{'win' if len(empty) > 1 else 'wins'} no patch on the whole evaluation set.")
  return warnings


# The overlay: each image at least this many pixels a side (nearest-neighbour zoom), the legend
# text at this size (points at 100 dpi).
OVERLAY_MIN_SIZE = 192
# _CHAR: a generous mean character width of that font, for laying out the legend.
_GAP, _LEFT, _FONT, _LINE, _SWATCH, _CHAR = 4, 92, 9, 20, 14, 7.0


def _draw_keypoints(panel: np.ndarray, points: np.ndarray, colors: np.ndarray, radius: int):
  """Filled discs of `colors` [P, 3] at `points` [P, 2] ((x, y) panel pixels), black-rimmed."""
  height, width = panel.shape[:2]
  yy, xx = np.mgrid[-radius - 1:radius + 2, -radius - 1:radius + 2]
  dist = np.hypot(xx, yy)
  for (x, y), color in zip(points, colors):
    for within, value in ((dist <= radius + 1, (0, 0, 0)), (dist <= radius, color)):
      rows, cols = yy[within] + int(y), xx[within] + int(x)
      inside = (rows >= 0) & (rows < height) & (cols >= 0) & (cols < width)
      panel[rows[inside], cols[inside]] = value


def _legend_column(labels: Sequence[str]) -> int:
  """The width in pixels of one legend entry (swatch and its longest label)."""
  return _SWATCH + 6 + int(_CHAR * max(len(label) for label in labels)) + 14


def part_overlay(images: np.ndarray, maps: np.ndarray, mean, std, *,
                 part_names: Optional[Sequence[str]] = None,
                 keypoints: Optional[np.ndarray] = None,
                 keypoint_visible: Optional[np.ndarray] = None,
                 keypoint_group: Optional[Sequence[int]] = None,
                 group_names: Optional[Sequence[str]] = None,
                 segmentation: Optional[np.ndarray] = None,
                 min_size: int = OVERLAY_MIN_SIZE) -> np.ndarray:
  """The part-map image of the first evaluation images: uint8 [H, W, 3].

  One column per image; rows: the image; its discovered parts, the argmax over the K + 1 maps in
  `part_names.part_colors` (one colour per part, black for the background); the ground truth
  beside it, the `segmentation` (part_segmentation: 0 background, g + 1 group g) in
  `group_colors`, else the visible keypoints as discs of their group's colour over the greyed
  image (no row without either). Every panel is zoomed by an integer factor (nearest) to at least
  `min_size` pixels a side. Below, the legends: a swatch and name per part ("part 1".."part K",
  or `part_names`, e.g. "part 3 (≈ wing)") and "background", then one per ground-truth group.

  Args:
    images: [n, S, S, 3] normalized with mean / std.
    maps: [n, K + 1, h, w], background last.
    part_names: the K foreground names (default "part 1".."part K").
    keypoints: [n, M, 2] (x, y) pixels of the images; keypoint_visible: bool [n, M].
    keypoint_group: int [M], each keypoint's group (None: keypoint m is group m).
    group_names: the G ground-truth group names (default "group 1".."group G").
    segmentation: int [n, S, S], preferred over keypoints when given.
  """
  images = np.clip((np.asarray(images) * np.asarray(std) + np.asarray(mean)) * 255, 0, 255)
  n, size_h, size_w = images.shape[:3]
  num_parts = maps.shape[1] - 1
  zoom = max(1, -(-int(min_size) // max(size_h, size_w)))
  ph, pw = size_h * zoom, size_w * zoom
  colors = part_names_lib.part_colors(num_parts)
  fg_names = list(part_names) if part_names is not None else (
      part_names_lib.discovered_names(num_parts))
  if len(fg_names) != num_parts:
    raise ValueError(f"{len(fg_names)} part names for {num_parts} parts")
  shown = images.repeat(zoom, 1).repeat(zoom, 2)
  ids = patch_grid.resize_nearest(np.argmax(np.asarray(maps), axis=1), (ph, pw))
  rows = [("image", shown), ("discovered\nparts", colors[ids].astype(np.float64))]
  truth = None
  if segmentation is not None:
    seg = patch_grid.resize_nearest(np.asarray(segmentation, np.int64), (ph, pw))
    num_groups = len(group_names) if group_names else int(seg.max(initial=0))
    truth = "part mask"
  elif keypoints is not None and keypoint_visible is not None:
    points = np.asarray(keypoints, np.float64)
    visible = np.asarray(keypoint_visible, bool)
    group = (np.arange(points.shape[1]) if keypoint_group is None
             else np.asarray(keypoint_group, np.int64))
    num_groups = len(group_names) if group_names else int(group.max(initial=-1)) + 1
    truth = "keypoints"
  if truth is not None:
    names = list(group_names) if group_names else [f"group {g + 1}" for g in range(num_groups)]
    gt_colors = part_names_lib.group_colors(max(num_groups, 1))
    if truth == "part mask":
      table = np.concatenate([np.asarray([part_names_lib.BACKGROUND_COLOR], np.uint8), gt_colors])
      panel = table[np.clip(seg, 0, num_groups)].astype(np.float64)
    else:
      grey = shown.mean(-1, keepdims=True).repeat(3, -1)
      panel = 0.45 * grey + 0.55 * 200  # washed out, so the keypoint colours stand out
      radius = max(4, min(ph, pw) // 32)
      for i in range(n):
        centres = (np.floor(points[i, visible[i]]) + 0.5) * zoom
        _draw_keypoints(panel[i], centres, gt_colors[group[visible[i]] % len(gt_colors)], radius)
    rows.append((f"ground truth\n({truth})", panel))
  # The canvas: the panels, then the legends (swatches here, their text by matplotlib).
  legends = [("discovered parts: argmax of the K + 1 maps" + (
      " (≈: the keypoint group with the largest share of its keypoints in the part)" if any("≈" in x for x in fg_names) else ""),
      fg_names + [part_names_lib.BACKGROUND], colors)]
  if truth == "part mask":
    legends.append(("ground truth: part mask", [part_names_lib.BACKGROUND] + names, table))
  elif truth is not None:
    legends.append(("ground truth: visible keypoints by group", names, gt_colors[:len(names)]))
  grid_w = n * pw + (n - 1) * _GAP
  width = max(_LEFT + grid_w, max(_legend_column(labels) for _, labels, _ in legends)) + _GAP
  layouts = []  # (title lines, columns, column width) per legend
  for title, labels, _ in legends:
    column = _legend_column(labels)
    cols = max(1, min(len(labels), (width - _GAP) // column))
    layouts.append((textwrap.wrap(title, max(20, int((width - 2 * _GAP) / _CHAR))), cols, column))
  legend_h = sum(_LINE * (len(lines) + -(-len(labels) // cols)) + _GAP
                 for (_, labels, _), (lines, cols, _) in zip(legends, layouts))
  grid_h = len(rows) * ph + (len(rows) - 1) * _GAP
  height = _GAP + grid_h + _GAP + legend_h + _GAP
  canvas = np.full((height, width, 3), 255, np.uint8)
  texts = []  # (x, y of the text's vertical centre, text)
  for r, (label, panels) in enumerate(rows):
    top = _GAP + r * (ph + _GAP)
    texts.append((_GAP, top + ph / 2, label))
    for i in range(n):
      left = _LEFT + i * (pw + _GAP)
      canvas[top:top + ph, left:left + pw] = np.clip(panels[i], 0, 255).astype(np.uint8)
  y = _GAP + grid_h + _GAP
  for (_, labels, swatches), (lines, cols, column) in zip(legends, layouts):
    for line in lines:
      texts.append((_GAP, y + _LINE / 2, line))
      y += _LINE
    for j, label in enumerate(labels):
      x0, y0 = _GAP + (j % cols) * column, y + (j // cols) * _LINE
      sy = y0 + (_LINE - _SWATCH) // 2
      canvas[sy:sy + _SWATCH, x0:x0 + _SWATCH] = swatches[j]
      texts.append((x0 + _SWATCH + 6, y0 + _LINE / 2, label))
    y += _LINE * -(-len(labels) // cols) + _GAP
  # Only the text goes through matplotlib, dark on white over the canvas's white margins; the
  # darker of the two keeps the panels and swatches pixel-exact (and skips resampling them).
  fig = Figure(figsize=(width / 100, height / 100), dpi=100, facecolor="white")
  agg = FigureCanvasAgg(fig)
  for x, yc, text in texts:
    fig.text(x / width, 1 - yc / height, text, fontsize=_FONT, ha="left", va="center")
  agg.draw()
  drawn = np.asarray(agg.buffer_rgba())[:height, :width, :3]
  lettering = np.full_like(canvas, 255)
  lettering[:drawn.shape[0], :drawn.shape[1]] = drawn  # (the canvas may round a pixel off)
  return np.minimum(canvas, lettering)


def evaluate(predict: Callable[[Dict[str, np.ndarray]], Dict[str, Any]],
             batches: Iterable[Dict[str, np.ndarray]], *, image_mean, image_std,
             num_images: int = 8, keypoint_group: Optional[Sequence[int]] = None,
             keypoint_group_names: Optional[Sequence[str]] = None,
             position_baseline=None, num_true_parts: int = 0) -> Dict[str, Any]:
  """Runs `predict` over the evaluation batches and computes the metrics above.

  Args:
    predict: host batch -> {"maps": [B, K+1, h, w], "logits": {head: [B, A]}} plus the batch's
      own `valid`, `attributes`, `attribute_valid` and, when the dataset has them, `keypoints`,
      `keypoint_visible` and `part_segmentation`, for every example of the global batch (as
      NumPy arrays). A `part_segmentation` it does not return is read from the host batch,
      which must then be the whole batch (one process).
    batches: this process's evaluation batches (padded ones carry valid = False).
    num_images: how many of the first images the overlay shows (0: no overlay).
    keypoint_group: int [M], the group of each of the M keypoints
      (`DatasetInfo.keypoint_group_ids`); None: keypoint m is group m.
    keypoint_group_names: the G group names (`DatasetInfo.keypoint_groups`), for the overlay's
      ground-truth legend and its parts' best matches ("part 3 (≈ wing)"); None: "group g".
    position_baseline: an `evaluation.position_baseline.PositionBaseline` fit on the training
      split; when given, its NMI / ARI at the same keypoints (`parts/position_*`, the chance row).
    num_true_parts: G, the dataset's true parts (`len(DatasetInfo.part_names)`); with it, a
      `part_segmentation` in the batches gives the mask coverage (`parts/coverage*`); 0: none.

  Returns:
    {"scalars": {name: float}, "image": uint8 [H, W, 3] `part_overlay` of the first images (a
    `part_segmentation` in the batch is its ground truth, else the keypoints), or None}. Its part
    names carry their best match in the contingency of the whole evaluation set's keypoints.
  """
  logits: Dict[str, List[np.ndarray]] = {}
  labels, label_valid = [], []
  parts_all, parts_fg = [], []  # int [S, M]: the part under each keypoint, -1 if not visible
  position_parts = []  # int [S, M]: the position baseline's cluster of each visible keypoint
  num_parts = None
  won = mass = 0.0  # float [K+1]: argmax wins and soft mass per channel, summed over the set
  confusion = 0.0  # float [G+1, K+1]: true x discovered label per patch, summed over the set
  shown: Optional[Dict[str, Any]] = None  # the overlay's inputs, from the first batch
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
      if position_baseline is not None:
        position_parts.append(position_baseline.keypoint_part(
            np.asarray(out["keypoints"])[valid], visible, image_hw))
    segmentation = out.get("part_segmentation", host_batch.get("part_segmentation"))
    if num_true_parts and segmentation is not None:
      confusion = confusion + segmentation_confusion(np.asarray(segmentation)[valid], maps[valid],
                                                     num_true_parts)
    if shown is None and num_images:
      local = np.asarray(host_batch["image"])[:num_images]
      # The global batch's first rows are this process's first examples on process 0.
      shown = {"images": local, "maps": maps[:len(local)]}
      if "keypoints" in out:
        shown.update(keypoints=np.asarray(out["keypoints"])[:len(local)],
                     keypoint_visible=np.asarray(out["keypoint_visible"], bool)[:len(local)])
      segmentation = host_batch.get("part_segmentation", out.get("part_segmentation"))
      if segmentation is not None:
        shown["segmentation"] = np.asarray(segmentation)[:len(local)]
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
    if position_parts:
      scalars.update(position_baseline.score_parts(np.concatenate(position_parts),
                                                   keypoint_group=keypoint_group))
  if len(labels_np):
    scalars.update(part_share_scalars(won, mass))
  if np.ndim(confusion) == 2:
    scalars.update(coverage_scalars(confusion))
  scalars["num_examples"] = float(len(labels_np))
  overlay = None
  if shown is not None:
    names = part_names_lib.discovered_names(num_parts)
    groups = list(keypoint_group_names) if keypoint_group_names else None
    if parts_all:
      counts = part_metrics.contingency(kp_all, num_parts, keypoint_group=keypoint_group)
      names = part_names_lib.matched_names(
          names, counts, groups or [f"group {g + 1}" for g in range(counts.shape[1])])
    overlay = part_overlay(shown.pop("images"), shown.pop("maps"), image_mean, image_std,
                           part_names=names, keypoint_group=keypoint_group, group_names=groups,
                           **shown)
  return {"scalars": scalars, "image": overlay}


def report_markdown(scalars: Mapping[str, float], warnings: Sequence[str], *, title: str,
                    step: int, total_steps: int,
                    true_part_names: Optional[Sequence[str]] = None) -> str:
  """The train job's report.md: one evaluation's numbers (scalars without the "eval/" prefix),
  NMI / ARI with and without the background side by side, the mask coverage of the true parts
  (named by `true_part_names`, else "true part g+1"), the per-part share table and the collapse
  warnings."""
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
  lines += [f"| {h} | {reporting.fmt(scalars.get(f'{h}/mAP'), 3)} | "
            f"{reporting.fmt(scalars.get(f'{h}/AUROC'), 3)} "
            f"| {reporting.fmt(scalars.get(f'{h}/bce'), 4)} |" for h in heads]
  if "parts/NMI" in scalars:
    lines += ["", f"## Parts at keypoints (x100, {int(scalars.get('parts/num_keypoints', 0))} "
              f"visible keypoints)", "", "| Argmax over | NMI | ARI |", "|---|---|---|",
              f"| K + 1 maps (background included) | {reporting.fmt(scalars['parts/NMI'], 1)} | "
              f"{reporting.fmt(scalars['parts/ARI'], 1)} |",
              f"| K foreground maps (MPAE) | {reporting.fmt(scalars.get('parts/NMI_fg'), 1)} | "
              f"{reporting.fmt(scalars.get('parts/ARI_fg'), 1)} |"]
    if "parts/position_NMI" in scalars:
      lines += [f"| chance: keypoint position alone (k-means on the training keypoints) | "
                f"{reporting.fmt(scalars['parts/position_NMI'], 1)} | "
                f"{reporting.fmt(scalars['parts/position_ARI'], 1)} |"]
  num_true = sum(1 for name in scalars if name.startswith("parts/coverage/"))
  if num_true:
    num_parts = sum(1 for name in scalars
                    if name.startswith("part_share/") and name.rsplit("/", 1)[1].isdigit()) - 1
    names = (list(true_part_names) if true_part_names and len(true_part_names) == num_true
             else [f"true part {g + 1}" for g in range(num_true)])
    lines += ["", "## Mask coverage of the true parts (patch grid)", "",
              "For each true part, the discovered part holding most of its patches (argmax over "
              "the K + 1 maps; never the background), the share of the true part's patches it "
              "holds (coverage), and all the patches it holds over the true part's (area ratio: "
              "above 1, it spills beyond the part).", "",
              "| True part | Best-matching discovered part | Coverage | Area ratio |",
              "|---|---|---|---|"]
    for g, name in enumerate(names):
      best = scalars.get(f"parts/best_part/{g}")
      matched = (part_label(int(best), num_parts) if best is not None and np.isfinite(best)
                 and num_parts >= 1 else "n/a")
      lines.append(f"| {name} | {matched} | {reporting.fmt(scalars[f'parts/coverage/{g}'], 3)} | "
                   f"{reporting.fmt(scalars.get(f'parts/area_ratio/{g}'), 3)} |")
    lines.append(f"| mean over the true parts | | "
                 f"{reporting.fmt(scalars.get('parts/coverage'), 3)} | "
                 f"{reporting.fmt(scalars.get('parts/area_ratio'), 3)} |")
  num_channels = sum(1 for name in scalars
                     if name.startswith("part_share/") and name.rsplit("/", 1)[1].isdigit())
  if num_channels:
    lines += ["", "## Share of the evaluation patches per part", "",
              "Share: patches whose argmax over the K + 1 maps is the part; soft mass: the part's "
              "mean probability over the same patches (channel k of `part_share/<k>` is part "
              "k + 1).", "",
              "| Part | Share | Soft mass |", "|---|---|---|"]
    for k in range(num_channels):
      share = scalars[f"part_share/{k}"]
      # A rounded 0.0% would hide whether a part won a few patches or none at all.
      shown = "0 (empty)" if share == 0 else f"{100 * share:.1f}%"
      lines.append(f"| {part_label(k, num_channels - 1)} | {shown} | "
                   f"{scalars[f'part_mass/{k}']:.3f} |")
  return "\n".join(lines) + "\n"
