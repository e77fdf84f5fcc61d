"""Part-level metrics: contingency, part assignment, PS (eq. 1), MPPO (eq. 2), NMI / ARI, and the
mask coverage of the true parts on the patch grid (Fig. 4).

Names: K discovered parts (ids 0..K-1, background id K), G ground-truth parts (keypoint groups
or attribute groups), A attributes, S samples, M keypoints per sample.

Keypoint hits: `keypoint_part` int [S, M] is the discovered part id (0..K, K = background) under
keypoint m of sample s, or -1 where the keypoint is not visible; `keypoint_group` int [M] is the
ground-truth group of keypoint m (`DatasetInfo.keypoint_group_ids`). Tables S7/S8 merge keypoints
by relabelling, so a group may hold several keypoints (CUB's two wings are two points labelled
wing); without `keypoint_group` keypoint m is group m. The contingency, the assignment and
NMI / ARI all derive from these.
"""

from typing import Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

INVISIBLE = -1


# ------------------------------------------------------------------------------------------------
# Contingency and assignment (Sec. 3.0.1, Fig. S5a).


def _keypoint_group(keypoint_group, num_keypoints: int) -> np.ndarray:
  """int64 [M]: `keypoint_group` checked against the M columns of keypoint_part (identity if
  None)."""
  if keypoint_group is None:
    return np.arange(num_keypoints)
  group = np.asarray(keypoint_group, np.int64)
  if group.shape != (num_keypoints,):
    raise ValueError(f"keypoint_group gives the group of {group.size} keypoints but keypoint_part "
                     f"has {num_keypoints} per sample (features cached with another keypoint "
                     "layout? delete the cache)")
  if group.size and sorted(set(group.tolist())) != list(range(int(group.max()) + 1)):
    raise ValueError(f"keypoint_group must use every group id 0..G-1, got {group.tolist()}")
  return group


def keypoint_counts(keypoint_part: np.ndarray, num_parts: int, weights=None, *,
                    keypoint_group=None) -> np.ndarray:
  """Co-occurrence counts n[k, g] = #{visible keypoints of group g under discovered part k}.

  Args:
    keypoint_part: int [S, M] in {-1 (invisible), 0..K (K = background)}.
    num_parts: K.
    weights: optional per-sample weights [S] (bootstrap multiplicities).
    keypoint_group: int [M] in 0..G-1, the group of each keypoint (every group present); None:
      keypoint m is group m (G = M).

  Returns:
    float [K + 1, G]; row K counts keypoints that fall on the background.
  """
  kp = np.asarray(keypoint_part, np.int64)
  if kp.ndim != 2:
    raise ValueError(f"keypoint_part must be [S, M], got shape {kp.shape}")
  if kp.size and (kp.min() < INVISIBLE or kp.max() > num_parts):
    raise ValueError(f"keypoint_part values must lie in [-1, {num_parts}], got "
                     f"[{kp.min()}, {kp.max()}]")
  group = _keypoint_group(keypoint_group, kp.shape[1])
  w = np.ones(kp.shape[0]) if weights is None else np.asarray(weights, np.float64)
  counts = np.zeros((num_parts + 1, int(group.max(initial=-1)) + 1))
  visible = kp >= 0
  rows = np.where(visible, kp, 0)
  cols = np.broadcast_to(group, kp.shape)  # Each keypoint counts for its group.
  np.add.at(counts, (rows[visible], cols[visible]),
            np.broadcast_to(w[:, None], kp.shape)[visible])
  return counts


def contingency(keypoint_part: np.ndarray, num_parts: int, weights=None, *,
                keypoint_group=None) -> np.ndarray:
  """The spatial contingency matrix c[k, g] of Sec. 3.0.1 / Fig. S5a.

  c_g^k = n[k, g] / sum_k' n[k', g]: the fraction of group g's visible keypoints that fall
  inside discovered part k (each column sums to 1 over the K parts and the background row). All
  of a group's keypoints count (both wings for the wing column). Arguments as `keypoint_counts`.

  Returns:
    float [K + 1, G]; a column with no visible keypoint is NaN.
  """
  counts = keypoint_counts(keypoint_part, num_parts, weights, keypoint_group=keypoint_group)
  total = counts.sum(0, keepdims=True)
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(total > 0, counts / np.maximum(total, 1e-300), np.nan)


def assign_by_threshold(contingency_matrix: np.ndarray, tau: float) -> np.ndarray:
  """K_g^+ = {k : c_g^k > tau} (Sec. 3.0.1); the background row never joins a group.

  Args:
    contingency_matrix: float [K + 1, G] (from `contingency`).
    tau: threshold in [0, 1).

  Returns:
    bool [K, G], True where discovered part k matches ground-truth part g.
  """
  if not 0.0 <= tau < 1.0:
    raise ValueError(f"tau must lie in [0, 1), got {tau}")
  c = np.asarray(contingency_matrix, np.float64)[:-1]
  return np.nan_to_num(c, nan=0.0) > tau


def assign_manually(mapping: Mapping[str, Sequence[int]], group_names: Sequence[str],
                    num_parts: int) -> np.ndarray:
  """K_g^+ chosen by inspection: {group name: [discovered part ids]} -> bool [K, G].

  Groups missing from `mapping` get no parts (their PS is undefined).
  """
  names = list(group_names)
  unknown = sorted(set(mapping) - set(names))
  if unknown:
    raise ValueError(f"manual assignment names unknown groups {unknown}; groups are {names}")
  out = np.zeros((num_parts, len(names)), bool)
  for name, parts in mapping.items():
    for k in parts:
      if not 0 <= int(k) < num_parts:
        raise ValueError(f"manual assignment of {name!r}: part {k} is not in [0, {num_parts})")
      out[int(k), names.index(name)] = True
  return out


# ------------------------------------------------------------------------------------------------
# Part specificity (eq. 1).


def part_specificity(map_matrix: np.ndarray, assignment: np.ndarray) -> Tuple[np.ndarray, float]:
  """PS_g and PS of eq. 1.

  PS_g = mean_{k in K_g^+} mAP^k_g - mean_{k in K_g^-} mAP^k_g,  K_g^- = K \\ K_g^+,
  PS = mean_g PS_g over the groups where PS_g is defined.

  PS_g is undefined (NaN) when K_g^+ or K_g^- is empty, or when group g has no defined mAP.

  Args:
    map_matrix: float [K, G], mAP of probe k on the attributes of group g.
    assignment: bool [K, G], K_g^+ as a mask.

  Returns:
    (float [G] PS_g, float PS); PS is NaN if no group is defined.
  """
  mean_plus, mean_minus = specificity_terms(map_matrix, assignment)
  ps_g = mean_plus - mean_minus
  ps = float(np.nanmean(ps_g)) if np.isfinite(ps_g).any() else float("nan")
  return ps_g, ps


def specificity_terms(map_matrix: np.ndarray,
                      assignment: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
  """The two terms of eq. 1 per group: (mean mAP over K_g^+, mean mAP over K_g^-), float [G]
  each, NaN where the set is empty (or has no defined mAP). Low PS with a high second term is
  leakage (or real cross-part correlation); low PS with a low first term is a weak probe."""
  m = np.asarray(map_matrix, np.float64)
  a = np.asarray(assignment, bool)
  if m.shape != a.shape:
    raise ValueError(f"map_matrix {m.shape} and assignment {a.shape} must both be [K, G]")
  defined = np.isfinite(m)
  plus, minus = a & defined, ~a & defined
  with np.errstate(invalid="ignore", divide="ignore"):
    mean_plus = np.where(plus.sum(0) > 0, np.where(plus, m, 0).sum(0) / plus.sum(0), np.nan)
    mean_minus = np.where(minus.sum(0) > 0, np.where(minus, m, 0).sum(0) / minus.sum(0), np.nan)
  return mean_plus, mean_minus


# ------------------------------------------------------------------------------------------------
# Most predictive part overlap (eq. 2).


def mppo(logits: np.ndarray, overlap: np.ndarray, present: np.ndarray,
         attribute_mask: Sequence[int], weights=None) -> Tuple[np.ndarray, float]:
  """MPPO_a and MPPO of eq. 2.

  k*_a(s) = argmax_k l^k(v^k_s)_a, the most predictive part by logit on sample s, and
  MPPO_a = |{s in S_a : M_{k*_a}(s) ∩ M_{g(a)}(s) != ∅}| / |S_a|, S_a = samples with attribute a
  present (and a ground-truth mask); MPPO = mean_a MPPO_a over attributes with S_a non-empty.

  Args:
    logits: float [S, K, A].
    overlap: bool [S, K, T], whether discovered part k intersects ground-truth mask t.
    present: bool [S, A], the samples S_a (attribute present, label valid, masks available).
    attribute_mask: int [A], g(a) as an index into the T masks.
    weights: optional per-sample weights [S] (bootstrap multiplicities).

  Returns:
    (float [A] MPPO_a, NaN where S_a is empty; float MPPO).
  """
  logits = np.asarray(logits)
  overlap = np.asarray(overlap, bool)
  present = np.asarray(present, bool)
  g_of_a = np.asarray(attribute_mask, np.int64)
  s, k, a = logits.shape
  if overlap.shape[:2] != (s, k) or present.shape != (s, a) or g_of_a.shape != (a,):
    raise ValueError(f"shapes disagree: logits {logits.shape}, overlap {overlap.shape}, present "
                     f"{present.shape}, attribute_mask {g_of_a.shape}")
  if g_of_a.size and (g_of_a.min() < 0 or g_of_a.max() >= overlap.shape[2]):
    raise ValueError(f"attribute_mask values must index the {overlap.shape[2]} masks")
  best = np.argmax(logits, axis=1)  # [S, A]
  hit = overlap[np.arange(s)[:, None], best, g_of_a[None, :]]  # [S, A]
  w = np.ones(s) if weights is None else np.asarray(weights, np.float64)
  denom = (present * w[:, None]).sum(0)
  with np.errstate(invalid="ignore", divide="ignore"):
    per_attribute = np.where(denom > 0, (present & hit).astype(np.float64).T @ w / denom, np.nan)
  value = float(np.nanmean(per_attribute)) if np.isfinite(per_attribute).any() else float("nan")
  return per_attribute, value


# ------------------------------------------------------------------------------------------------
# NMI / ARI at keypoints (PDiscoFormer / MPAE protocol).


def nmi_ari_from_counts(counts: np.ndarray) -> Tuple[float, float]:
  """NMI (arithmetic normalization) and ARI of a contingency table, as scikit-learn computes
  `normalized_mutual_info_score` / `adjusted_rand_score` from the labels behind it.

  With n_ij the table, a_i / b_j its row / column sums and N its total:
    MI  = sum_ij n_ij/N log(N n_ij / (a_i b_j)),  H(a) = -sum_i a_i/N log(a_i/N),
    NMI = MI / ((H(a) + H(b)) / 2)  (1 if both labelings are a single cluster, 0 if MI = 0);
    ARI = (I - E) / ((A + B) / 2 - E), I = sum_ij C(n_ij, 2), A = sum_i C(a_i, 2),
          B = sum_j C(b_j, 2), E = A B / C(N, 2)  (1 if the pair counts fully agree).

  Rows are one labeling (ground truth), columns the other; empty rows / columns are ignored.
  Weighted (bootstrap) counts are allowed.
  """
  n = np.asarray(counts, np.float64)
  n = n[n.sum(1) > 0][:, n.sum(0) > 0] if n.size else n
  total = n.sum()
  if total == 0:
    return 1.0, 1.0
  rows, cols = n.sum(1), n.sum(0)
  # NMI.
  if len(rows) == len(cols) == 1:
    nmi = 1.0
  elif len(rows) == 1 or len(cols) == 1:
    nmi = 0.0
  else:
    nz = n > 0
    mi = float((n[nz] / total * (np.log(n[nz]) + np.log(total)
                                 - np.log(np.outer(rows, cols)[nz]))).sum())
    entropy = lambda p: float(-(p / total * np.log(p / total)).sum())
    if abs(mi) < 1e-15:
      nmi = 0.0
    else:
      nmi = mi / ((entropy(rows) + entropy(cols)) / 2)
  # ARI via the pair confusion matrix, as scikit-learn does.
  sum_sq = float((n ** 2).sum())
  tp = sum_sq - total
  fp = float((n @ cols).sum()) - sum_sq
  fn = float((n.T @ rows).sum()) - sum_sq
  tn = total ** 2 - fp - fn - sum_sq
  if fn == 0 and fp == 0:
    ari = 1.0
  else:
    ari = 2.0 * (tp * tn - fn * fp) / ((tp + fn) * (fn + tn) + (tp + fp) * (fp + tn))
  return nmi, ari


def keypoint_nmi_ari(keypoint_part: np.ndarray, num_parts: int, *, include_background: bool = True,
                     keypoint_part_foreground: Optional[np.ndarray] = None,
                     keypoint_group=None, weights=None) -> Dict[str, float]:
  """NMI and ARI (x100) between keypoint group ids and the discovered part under each keypoint.

  Protocol (PDiscoFormer / MPAE, with Tables S7/S8's relabelling): every visible keypoint of
  every test image is one point; its ground-truth label is its group g (both wings of a bird are
  two points labelled wing), its predicted label the discovered part at its pixel, pooled over
  the set.
    with background: the prediction ranges over the K parts and the background (argmax over all
      K + 1 maps).
    without background (MPAE's foreground-only variant): the argmax over the K foreground maps,
      `keypoint_part_foreground`, when soft maps provide it; for hard maps, whose foreground
      argmax is unknown where the background wins, keypoints on the background are dropped.

  Args:
    keypoint_part: int [S, M] in {-1, 0..K}.
    num_parts: K.
    include_background: which variant.
    keypoint_part_foreground: optional int [S, M] in {-1, 0..K-1}.
    keypoint_group: int [M], the group of each keypoint (None: keypoint m is group m).
    weights: optional per-sample weights [S].

  Returns:
    {"nmi": float, "ari": float, "num_points": float}.
  """
  kp = np.asarray(keypoint_part, np.int64)
  if not include_background:
    if keypoint_part_foreground is not None:
      kp = np.asarray(keypoint_part_foreground, np.int64)
      if kp.size and kp.max() >= num_parts:
        raise ValueError("keypoint_part_foreground must not contain the background id")
    else:
      kp = np.where(kp == num_parts, INVISIBLE, kp)
  counts = keypoint_counts(kp, num_parts, weights, keypoint_group=keypoint_group)  # [K + 1, G]
  nmi, ari = nmi_ari_from_counts(counts.T)
  return {"nmi": 100.0 * nmi, "ari": 100.0 * ari, "num_points": float(counts.sum())}


# ------------------------------------------------------------------------------------------------
# Mask coverage on the patch grid (Fig. 4): how much of each true part its best-matching
# discovered part covers, and how far that part spills beyond it.


def patch_confusion(true_part_ids: np.ndarray, discovered_part_ids: np.ndarray,
                    num_true_parts: int, num_parts: int) -> np.ndarray:
  """Co-occurrence counts n[g, k] = #{patches of true label g whose discovered label is k}.

  Args:
    true_part_ids: int [..., h, w] in 0..G (G = background): the ground truth on the patch grid
      (e.g. `evaluation.patch_grid.patch_part_ids` of a part segmentation, plurality rule).
    discovered_part_ids: int [..., h, w] in 0..K (K = background): the argmax over the K + 1 maps.
    num_true_parts: G.
    num_parts: K.

  Returns:
    float64 [G + 1, K + 1]; row G and column K count the backgrounds' patches.
  """
  truth = np.asarray(true_part_ids, np.int64)
  found = np.asarray(discovered_part_ids, np.int64)
  if truth.shape != found.shape:
    raise ValueError(f"true part ids {truth.shape} and discovered part ids {found.shape} must "
                     f"lie on the same patch grid")
  for name, ids, top in (("true", truth, num_true_parts), ("discovered", found, num_parts)):
    if ids.size and (ids.min() < 0 or ids.max() > top):
      raise ValueError(f"{name} part ids must lie in [0, {top}], got [{ids.min()}, {ids.max()}]")
  flat = truth.ravel() * (num_parts + 1) + found.ravel()
  counts = np.bincount(flat, minlength=(num_true_parts + 1) * (num_parts + 1))
  return counts.reshape(num_true_parts + 1, num_parts + 1).astype(np.float64)


def mask_coverage(counts: np.ndarray) -> Dict[str, np.ndarray]:
  """Per true part g of a patch confusion n [G + 1, K + 1] (`patch_confusion`, summed over a set):

    best_part   k*(g) = argmax over the K foreground parts of n[g, k] (the background column
                never matches a part; ties go to the lower k)
    coverage    n[g, k*] / sum_k n[g, k]: the share of part g's patches labelled k*; a mask
                that holds only part of the region scores below 1
    area_ratio  sum_g' n[g', k*] / sum_k n[g, k]: every patch labelled k* (other parts' and the
                background's included) over part g's patches; above 1 when k* spills out

  Args:
    counts: float [G + 1, K + 1], background row and column last.

  Returns:
    {"best_part": int64 [G], "coverage": float64 [G], "area_ratio": float64 [G]}; coverage and
    area_ratio are NaN for a part with no patch (best_part then 0).
  """
  n = np.asarray(counts, np.float64)
  if n.ndim != 2 or min(n.shape) < 2:
    raise ValueError(f"counts must be [G + 1, K + 1] with G, K >= 1, got shape {n.shape}")
  parts = n[:-1]  # [G, K + 1]: the true parts' rows
  best = np.argmax(parts[:, :-1], axis=1)
  size = parts.sum(1)
  covered = parts[np.arange(len(parts)), best]
  labelled = n[:, best].sum(0)  # [G]: the patches labelled k*(g), anywhere
  with np.errstate(invalid="ignore", divide="ignore"):
    coverage = np.where(size > 0, covered / size, np.nan)
    area_ratio = np.where(size > 0, labelled / size, np.nan)
  return {"best_part": best.astype(np.int64), "coverage": coverage, "area_ratio": area_ratio}
