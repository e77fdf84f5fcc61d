"""Figures of the leakage benchmark, written as PNG files (matplotlib Figure objects, not
pyplot: no display, no global backend switch for the program that imports this).

  contingency_heatmap   Fig. S5a: discovered parts x ground-truth groups (+ background row)
  map_matrices          Fig. S5c-f: mAP^k_g, late and early side by side (colour: column-normalized)
  ps_scatter            Fig. S6: mAP of every part per group, matched parts in red
  part_overlays         Fig. S5b / Fig. 3: part maps (pixel and patch grid) over test images
  table_figure          a results table (Tables 1-2 layout) rendered as an image
"""

import textwrap
import warnings
from typing import Dict, List, Optional, Sequence

from matplotlib import patches
from matplotlib.figure import Figure
import numpy as np

from metonymy.evaluation import part_names as part_names_lib


def subplots(nrows: int = 1, ncols: int = 1, *, figsize, **kwargs):
  """(figure, axes) like pyplot.subplots, on a Figure that no pyplot state holds (savefig writes
  it with the Agg canvas; nothing needs closing)."""
  fig = Figure(figsize=figsize)
  return fig, fig.subplots(nrows, ncols, **kwargs)


def _array(x) -> np.ndarray:
  return np.asarray([[np.nan if v is None else v for v in row] for row in x], np.float64)


def _annotate(ax, values: np.ndarray, dark: Optional[np.ndarray] = None, fmt: str = "{:.2f}"):
  """Writes every value in its cell; white text where `dark` (bool [R, C]) marks dark cells."""
  for i in range(values.shape[0]):
    for j in range(values.shape[1]):
      v = values[i, j]
      colour = "white" if dark is not None and dark[i, j] else "black"
      ax.text(j, i, "n/a" if not np.isfinite(v) else fmt.format(v), ha="center", va="center",
              fontsize=7, color=colour)


def contingency_heatmap(path: str, contingency, part_names: Sequence[str],
                        group_names: Sequence[str], assignment=None, tau: Optional[float] = None):
  c = _array(contingency)
  rows = list(part_names) + [part_names_lib.BACKGROUND]
  # Room for the row names ("part 3 (≈ wing)": ~0.07 in a character at this size).
  width = 1.6 + 0.8 * len(group_names) + 0.07 * max(map(len, rows))
  fig, ax = subplots(figsize=(width, 1.4 + 0.45 * len(rows)))
  image = ax.imshow(np.nan_to_num(c), cmap="Blues", vmin=0, vmax=1)
  fig.colorbar(image, ax=ax, fraction=0.05, pad=0.03, label="co-occurrence c[k, g]")
  _annotate(ax, c, np.nan_to_num(c) > 0.6)
  if assignment is not None:
    a = np.asarray(assignment, bool)
    for i, j in zip(*np.nonzero(a)):
      ax.add_patch(patches.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", lw=1.5))
  ax.set_xticks(range(len(group_names)), group_names, rotation=45, ha="right")
  ax.set_yticks(range(len(rows)), rows)
  ax.set_xlabel("ground-truth keypoint group g")
  ax.set_ylabel("part k")
  title = "Spatial contingency c[k, g]"
  if tau is not None:
    title += f" (red: c > tau = {tau:g})"
  ax.set_title(textwrap.fill(title, max(24, int(11 * width))), fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def map_matrices(path: str, matrices: Dict[str, object], part_names: Sequence[str],
                 group_names: Sequence[str], assignment=None, title: str = ""):
  """matrices: masking -> [K, G] mAP; cells coloured by column-normalized mAP (as Fig. S5)."""
  names = list(matrices)
  labels = 0.07 * max(map(len, part_names)) * len(names)  # each panel names its rows
  fig, axes = subplots(1, len(names), figsize=(0.5 + 0.8 * len(group_names) * len(names) + 1.4
                                               + labels, 1.8 + 0.42 * len(part_names)),
                       squeeze=False)
  fig.set_layout_engine("constrained")  # room for the shared colorbar
  for ax, masking in zip(axes[0], names):
    m = _array(matrices[masking])
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
      warnings.simplefilter("ignore", RuntimeWarning)  # a group with no defined mAP: NaN column
      col_max = np.nanmax(np.where(np.isfinite(m), m, np.nan), axis=0, keepdims=True)
      col_min = np.nanmin(np.where(np.isfinite(m), m, np.nan), axis=0, keepdims=True)
      shade = (m - col_min) / np.where(col_max > col_min, col_max - col_min, 1.0)
    shade = np.nan_to_num(shade)
    image = ax.imshow(shade, cmap="RdBu_r", vmin=0, vmax=1)
    _annotate(ax, m, (shade > 0.85) | (shade < 0.15))
    if assignment is not None:
      for i, j in zip(*np.nonzero(np.asarray(assignment, bool))):
        ax.add_patch(patches.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", lw=1.5))
    ax.set_xticks(range(len(group_names)), group_names, rotation=45, ha="right")
    ax.set_yticks(range(len(part_names)), part_names)
    ax.set_xlabel("attribute group g (ground truth)")
    ax.set_ylabel("part feature k")
    ax.set_title(f"{masking} masking", fontsize=9)
  fig.colorbar(image, ax=list(axes[0]), fraction=0.03, pad=0.02,
               label="colour: mAP within its column\n(0 lowest, 1 highest part)")
  fig.suptitle(title or "Attribute mAP (numbers) per part (rows) and group (columns); "
               "boxes: the group's matched parts K_g^+", fontsize=9)
  fig.savefig(path, dpi=120)


def ps_scatter(path: str, matrices: Dict[str, object], assignment, group_names: Sequence[str],
               title: str = ""):
  """Fig. S6: for every group (x), the mAP of every part on it (y); red = matched (K_g^+)."""
  names = list(matrices)
  a = np.asarray(assignment, bool)
  fig, axes = subplots(1, len(names), figsize=(3.2 * len(names), 3.0), squeeze=False,
                           sharey=True)
  rng = np.random.default_rng(0)
  for ax, masking in zip(axes[0], names):
    m = _array(matrices[masking])
    for g in range(m.shape[1]):
      jitter = rng.uniform(-0.12, 0.12, m.shape[0])
      ax.scatter(g + jitter[~a[:, g]], m[~a[:, g], g], s=14, c="tab:gray", alpha=0.8,
                 label="other parts (K_g^-)" if g == 0 else None)
      ax.scatter(g + jitter[a[:, g]], m[a[:, g], g], s=18, c="tab:red",
                 label="matched parts (K_g^+)" if g == 0 else None)
    ax.set_xticks(range(len(group_names)), group_names, rotation=45, ha="right")
    ax.set_xlabel("attribute group g")
    ax.set_title(f"{masking} masking", fontsize=9)
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel("mAP of the group's attributes")
  axes[0][0].legend(fontsize=7, loc="best")
  fig.suptitle(title or "Per-part mAP per group: PS_g = mean(red) - mean(grey)", fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def part_overlays(path: str, visual: Dict[str, np.ndarray], num_parts: int, patch_size: int,
                  part_names: Sequence[str], title: str = ""):
  """Each example: the image, its pixel part map and the patch-grid ids the backbone sees, in
  `part_names.part_colors` (the training images' colours; background black); `part_names`: the
  K legend names (e.g. "part 3 (≈ wing)")."""
  images = visual.get("images")
  if images is None or not len(images):
    return False
  n = len(images)
  colours = part_names_lib.part_colors(num_parts) / 255.0
  fig, axes = subplots(3, n, figsize=(1.9 * n, 5.8), squeeze=False)
  for i in range(n):
    image = np.asarray(images[i])
    labels = np.asarray(visual["labels"][i])
    ids = np.asarray(visual["part_ids"][i])
    patch_labels = np.repeat(np.repeat(ids, patch_size, 0), patch_size, 1)
    # Part colours over a grey version of the image, so the object's own colours do not mix in.
    grey = np.repeat(image.mean(-1, keepdims=True) / 255.0, 3, -1)
    for row, lab in ((1, labels), (2, patch_labels)):
      fg = (lab < num_parts)[..., None]
      axes[row][i].imshow(np.where(fg, 0.25 * grey + 0.75 * colours[lab], 0.6 * grey))
    axes[0][i].imshow(image)
    if "keypoints" in visual and len(visual["keypoints"]) > i:
      kp, vis = np.asarray(visual["keypoints"][i]), np.asarray(visual["keypoint_visible"][i], bool)
      axes[0][i].scatter(kp[vis, 0], kp[vis, 1], s=10, c="white", edgecolors="black", lw=0.5)
    for row in range(3):
      axes[row][i].set_xticks([])
      axes[row][i].set_yticks([])
  axes[0][0].set_ylabel("image")
  axes[1][0].set_ylabel("part map")
  axes[2][0].set_ylabel("patch grid")
  handles = [patches.Rectangle((0, 0), 1, 1, color=colours[k]) for k in range(num_parts + 1)]
  names = list(part_names) + [part_names_lib.BACKGROUND]
  # As many legend columns as fit the figure's width (7 pt text: ~0.055 in a character).
  ncol = max(1, min(len(names), int(1.9 * n / (0.4 + 0.055 * max(map(len, names))))))
  legend_rows = -(-len(names) // ncol)
  fig.legend(handles, names, loc="lower center", ncol=ncol, fontsize=7)
  fig.suptitle(title or "Part maps", fontsize=9)
  fig.tight_layout(rect=(0, min(0.4, 0.02 + 0.032 * legend_rows), 1, 1))
  fig.savefig(path, dpi=110)
  return True


def table_figure(path: str, header: List[str], rows: List[List[str]], title: str = ""):
  """A table as a PNG (the paper's Tables 1-2 layout, for slides and the report)."""
  # Header cells wrapped to a few words a line, so the columns stay narrow and the text large.
  wrapped = [textwrap.fill(h, 14) for h in header]
  fig, ax = subplots(figsize=(min(1.5 + 1.3 * len(header), 20), 1.3 + 0.42 * (len(rows) + 1)))
  ax.axis("off")
  table = ax.table(cellText=rows, colLabels=wrapped, loc="center", cellLoc="center")
  table.auto_set_font_size(False)
  table.set_fontsize(10)
  table.scale(1, 2.2)
  if title:
    ax.set_title(title, fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
