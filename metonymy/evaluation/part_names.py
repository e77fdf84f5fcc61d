"""How discovered parts are named and coloured wherever they are shown (training images and
report, probe report and figures).

A discovered part has no name of its own: channel k of the K + 1 maps (background last) is
"part k+1" (1-based) and channel K is "background". The dataset's part names belong to the ground
truth, which a discovered part matches only as well as part discovery worked, so they appear only
as a measured best match, "part 3 (≈ wing)": the ground-truth group that the part's row of the
spatial contingency (part_metrics.contingency, c[k, g] = share of group g's visible keypoints
inside part k) is largest on. Masks that come with names (a ground-truth source, a part-map file
with masks.part_names) keep them.

Colours: `part_colors(K)` gives every part its own colour and the background a fixed one
(black), the same for a given K in every figure; `group_colors(G)` colours ground-truth groups
from another palette, so a part and a group sharing a colour is never read as a match.
"""

import colorsys
from typing import List, Optional, Sequence

import numpy as np

BACKGROUND = "background"
BACKGROUND_COLOR = (0, 0, 0)

# matplotlib's tab10 (the first ten parts) then the light halves of tab20, as uint8 RGB.
_TAB10 = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
          (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207))
_TAB20_LIGHT = ((174, 199, 232), (255, 187, 120), (152, 223, 138), (255, 152, 150),
                (197, 176, 213), (196, 156, 148), (247, 182, 210), (199, 199, 199),
                (219, 219, 141), (158, 218, 229))
# matplotlib's Dark2 then Set1 (without its grey), for ground-truth groups.
_GROUPS = ((27, 158, 119), (217, 95, 2), (117, 112, 179), (231, 41, 138), (102, 166, 30),
           (230, 171, 2), (166, 118, 29), (102, 102, 102), (228, 26, 28), (55, 126, 184),
           (77, 175, 74), (152, 78, 163), (255, 127, 0), (255, 255, 51), (166, 86, 40),
           (247, 129, 191))


def part_name(k: int) -> str:
  """Channel k (0-based) of a discovered model: "part k+1"."""
  return f"part {int(k) + 1}"


def discovered_names(num_parts: int, background: bool = False) -> List[str]:
  """["part 1", ..., "part K"] (+ "background" last when `background`)."""
  return [part_name(k) for k in range(int(num_parts))] + ([BACKGROUND] if background else [])


def is_discovered(names: Sequence[str]) -> bool:
  """Whether `names` are the default names of discovered parts (not names a mask source gave)."""
  return list(names) == discovered_names(len(names))


def best_matches(contingency, group_names: Sequence[str], num_parts: Optional[int] = None,
                 rtol: float = 1e-9) -> List[List[str]]:
  """The best-matching ground-truth groups of each discovered part.

  Args:
    contingency: float [K + 1, G] (or [K, G]) from part_metrics.contingency; rows past
      `num_parts` (the background) are ignored; NaN (a group without visible keypoints) counts 0.
    group_names: the G column names.
    num_parts: K (default: the number of rows minus 1, the background).
    rtol: entries within this relative distance of the row's largest tie with it.

  Returns:
    K lists of group names: the groups with the row's largest entry, several on a tie (in column
    order), none when the part holds no keypoint of any group.
  """
  c = np.nan_to_num(np.asarray(contingency, np.float64), nan=0.0)
  names = list(group_names)
  if c.ndim != 2 or c.shape[1] != len(names):
    raise ValueError(f"contingency of shape {c.shape} for {len(names)} group names")
  k = c.shape[0] - 1 if num_parts is None else int(num_parts)
  if not 0 < k <= c.shape[0]:
    raise ValueError(f"num_parts {k} for a contingency with {c.shape[0]} rows")
  out = []
  for row in c[:k]:
    top = row.max(initial=0.0)
    out.append([] if top <= 0 else [names[g] for g in np.flatnonzero(row >= top * (1 - rtol))])
  return out


def matched_names(names: Sequence[str], contingency, group_names: Sequence[str]) -> List[str]:
  """names[k] + " (≈ <best-matching group>)" for each part with a match (ties joined by " / "),
  names[k] alone for a part that holds no ground-truth keypoint. `names`: the K part names."""
  matches = best_matches(contingency, group_names, num_parts=len(names))
  return [f"{n} (≈ {' / '.join(m)})" if m else n for n, m in zip(names, matches)]


def _palette(n: int, table) -> np.ndarray:
  if n <= len(table):
    return np.asarray(table[:n], np.uint8)
  # More than the table holds: evenly spaced hues (value alternating so neighbours differ).
  extra = [colorsys.hsv_to_rgb(i / (n - len(table)), 0.75, 0.95 if i % 2 else 0.7)
           for i in range(n - len(table))]
  return np.concatenate([np.asarray(table, np.uint8),
                         np.round(np.asarray(extra) * 255).astype(np.uint8)])


def part_colors(num_parts: int) -> np.ndarray:
  """uint8 [K + 1, 3]: a distinct colour for each of the K parts, BACKGROUND_COLOR last."""
  table = _TAB10 if num_parts <= 10 else _TAB10 + _TAB20_LIGHT
  return np.concatenate([_palette(int(num_parts), table),
                         np.asarray([BACKGROUND_COLOR], np.uint8)])


def group_colors(num_groups: int) -> np.ndarray:
  """uint8 [G, 3]: a distinct colour for each ground-truth group (not the parts' palette)."""
  return _palette(int(num_groups), _GROUPS)
