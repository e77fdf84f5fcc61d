"""Attribute ranking metrics: average precision, mAP per attribute group, AUROC.

Everything works on many columns at once (one column = one (probe, attribute) pair) and takes
optional sample weights, so a bootstrap resample is just integer weights (multiplicities) on the
same sorted scores: `average_precision(s, y, weights=counts)` equals scikit-learn's
`average_precision_score` on the resampled data, exactly (duplicated samples are ties).

Conventions:
  scores   float [S, M]   higher = more confident the attribute is present
  labels   {0, 1} [S, M]
  weights  float [S, M] or [S] (broadcast over columns); 0 drops a sample (e.g. an invalid label)
A column with no positive (or, for AUROC, no negative) weight has no defined value: NaN, and
`nanmean`-style averages skip it.
"""

from typing import Optional, Sequence

import numpy as np


def _prepare(scores, labels, weights):
  scores = np.asarray(scores, np.float64)
  labels = np.asarray(labels)
  if scores.ndim == 1:
    scores, labels = scores[:, None], labels[:, None]
    if weights is not None and np.ndim(weights) == 1:
      weights = np.asarray(weights)[:, None]
  if scores.shape != labels.shape:
    raise ValueError(f"scores {scores.shape} and labels {labels.shape} must have the same shape")
  if not np.isfinite(scores).all():
    raise ValueError("scores contain NaN or infinite values")
  labels = labels.astype(np.float64)
  if np.any((labels != 0) & (labels != 1)):
    raise ValueError("labels must be 0 or 1")
  if weights is None:
    weights = np.ones_like(scores)
  else:
    weights = np.asarray(weights, np.float64)
    if weights.ndim == 1:
      if weights.shape[0] != scores.shape[0]:
        raise ValueError(f"weights [{weights.shape[0]}] do not match {scores.shape[0]} samples")
      weights = weights[:, None]
    weights = np.broadcast_to(weights, scores.shape)
    if np.any(weights < 0):
      raise ValueError("weights must be >= 0")
  return scores, labels, weights


def _sorted(scores, labels, weights, descending: bool):
  """Column-wise stable sort; returns sorted scores, positive and total weights."""
  order = np.argsort(-scores if descending else scores, axis=0, kind="stable")
  take = lambda a: np.take_along_axis(a, order, axis=0)
  return take(scores), take(labels * weights), take(weights)


def _tie_group_end(sorted_scores: np.ndarray) -> np.ndarray:
  """int [S, M]: index of the last row of each row's run of equal scores."""
  n = sorted_scores.shape[0]
  is_end = np.ones(sorted_scores.shape, bool)
  is_end[:-1] = sorted_scores[:-1] != sorted_scores[1:]
  end_index = np.where(is_end, np.arange(n)[:, None], n)
  return np.minimum.accumulate(end_index[::-1], axis=0)[::-1]


def _tie_group_start(sorted_scores: np.ndarray) -> np.ndarray:
  """int [S, M]: index of the first row of each row's run of equal scores."""
  is_start = np.ones(sorted_scores.shape, bool)
  is_start[1:] = sorted_scores[1:] != sorted_scores[:-1]
  start_index = np.where(is_start, np.arange(sorted_scores.shape[0])[:, None], -1)
  return np.maximum.accumulate(start_index, axis=0)


def average_precision(scores, labels, weights=None) -> np.ndarray:
  """AP per column, as scikit-learn's `average_precision_score` (no interpolation).

  AP = sum_n (R_n - R_{n-1}) P_n over the distinct score thresholds, high to low, where P_n and
  R_n are the (weighted) precision and recall of "score >= threshold n". Equivalently every
  positive contributes its weight times the precision at the end of its tie group, over the
  total positive weight.

  Args:
    scores: float [S, M] (or [S]).
    labels: {0, 1} [S, M].
    weights: optional float [S, M] or [S].

  Returns:
    float64 [M] (a scalar array for 1-D input); NaN where a column has no positive weight.
  """
  one_d = np.ndim(scores) == 1
  scores, labels, weights = _prepare(scores, labels, weights)
  s, pos, tot = _sorted(scores, labels, weights, descending=True)
  tp = np.cumsum(pos, axis=0)
  seen = np.cumsum(tot, axis=0)
  end = _tie_group_end(s)
  precision_at_end = np.take_along_axis(tp / np.maximum(seen, 1e-300), end, axis=0)
  total_pos = tp[-1]
  with np.errstate(invalid="ignore", divide="ignore"):
    ap = np.where(total_pos > 0, (pos * precision_at_end).sum(0) / total_pos, np.nan)
  return ap[0] if one_d else ap


def roc_auc(scores, labels, weights=None) -> np.ndarray:
  """Area under the ROC curve per column, as scikit-learn's `roc_auc_score`.

  AUROC = P(score_pos > score_neg) + 1/2 P(score_pos = score_neg), over positive-negative pairs
  weighted by the product of their weights.

  Returns:
    float64 [M]; NaN where a column lacks positive or negative weight.
  """
  one_d = np.ndim(scores) == 1
  scores, labels, weights = _prepare(scores, labels, weights)
  s, pos, tot = _sorted(scores, labels, weights, descending=False)
  neg = tot - pos
  cum_neg = np.cumsum(neg, axis=0)
  end, start = _tie_group_end(s), _tie_group_start(s)
  neg_through_group = np.take_along_axis(cum_neg, end, axis=0)
  neg_before_group = (np.take_along_axis(cum_neg, start, axis=0)
                      - np.take_along_axis(neg, start, axis=0))
  group_neg = neg_through_group - neg_before_group
  wins = (pos * (neg_before_group + 0.5 * group_neg)).sum(0)
  total_pos, total_neg = pos.sum(0), neg.sum(0)
  with np.errstate(invalid="ignore", divide="ignore"):
    auc = np.where((total_pos > 0) & (total_neg > 0), wins / (total_pos * total_neg), np.nan)
  return auc[0] if one_d else auc


def group_mean(values: np.ndarray, attribute_group: Sequence[int], num_groups: int) -> np.ndarray:
  """Mean of per-attribute values within each attribute group, skipping NaN.

  Args:
    values: float [..., A] (e.g. AP of K probes: [K, A]).
    attribute_group: int [A], group index of every attribute.
    num_groups: G.

  Returns:
    float [..., G]; NaN for a group with no defined value.
  """
  values = np.asarray(values, np.float64)
  groups = np.asarray(attribute_group, np.int64)
  if values.shape[-1] != groups.shape[0]:
    raise ValueError(f"values have {values.shape[-1]} attributes, attribute_group "
                     f"{groups.shape[0]}")
  if groups.size and (groups.min() < 0 or groups.max() >= num_groups):
    raise ValueError(f"attribute_group values must lie in [0, {num_groups})")
  onehot = (groups[:, None] == np.arange(num_groups)[None, :]).astype(np.float64)  # [A, G]
  defined = np.isfinite(values)
  total = np.where(defined, values, 0.0) @ onehot
  count = defined.astype(np.float64) @ onehot
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def map_matrix(logits: np.ndarray, labels: np.ndarray, valid: Optional[np.ndarray],
               attribute_group: Sequence[int], num_groups: int, weights=None) -> np.ndarray:
  """mAP^k_g of eq. 1: AP of probe k on every attribute, averaged within attribute group g.

  Args:
    logits: float [S, K, A], probe k's score for attribute a on sample s.
    labels: {0, 1} [S, A].
    valid: bool [S, A] or None (all valid).
    attribute_group: int [A].
    num_groups: G.
    weights: optional per-sample weights [S] (bootstrap multiplicities).

  Returns:
    float [K, G].
  """
  ap = per_attribute(average_precision, logits, labels, valid, weights)
  return group_mean(ap, attribute_group, num_groups)


def per_attribute(metric, logits: np.ndarray, labels: np.ndarray, valid: Optional[np.ndarray],
                  weights=None) -> np.ndarray:
  """`metric` (average_precision or roc_auc) of every (probe k, attribute a): float [K, A]."""
  logits = np.asarray(logits)
  if logits.ndim != 3:
    raise ValueError(f"logits must be [S, K, A], got shape {logits.shape}")
  num_samples, k, a = logits.shape
  labels = np.asarray(labels)
  if labels.shape != (num_samples, a):
    raise ValueError(f"labels must be [S, A] = {(num_samples, a)}, got {labels.shape}")
  w = np.ones((num_samples, a)) if valid is None else np.asarray(valid, np.float64)
  if weights is not None:
    w = w * np.asarray(weights, np.float64)[:, None]
  flat = logits.reshape(num_samples, k * a)
  tiled = lambda x: np.broadcast_to(x[:, None, :], (num_samples, k, a)).reshape(num_samples, k * a)
  return metric(flat, tiled(labels), tiled(w)).reshape(k, a)


class SortedColumns:
  """AP of fixed scores under many sample reweightings (bootstraps) without re-sorting.

  The column sort and tie groups depend only on the scores, so they are computed once; each
  call then costs a gather and a few cumulative sums over [S, M].
  """

  def __init__(self, scores, labels, valid=None):
    scores, labels, valid_w = _prepare(scores, labels, valid)
    self._order = np.argsort(-scores, axis=0, kind="stable")
    take = lambda a: np.take_along_axis(a, self._order, axis=0)
    sorted_scores = take(scores)
    self._labels = take(labels)
    self._valid = take(valid_w)
    self._end = _tie_group_end(sorted_scores)
    self._start = _tie_group_start(sorted_scores)

  def roc_auc(self, sample_weights: np.ndarray) -> np.ndarray:
    """AUROC per column with per-sample weights [S]: float [M] (see `roc_auc`).

    In descending order, a positive beats the negatives after its tie group and ties with the
    negatives inside it.
    """
    w = np.asarray(sample_weights, np.float64)[self._order] * self._valid
    pos = w * self._labels
    neg = w - pos
    cum_neg = np.cumsum(neg, axis=0)
    total_neg, total_pos = cum_neg[-1], pos.sum(0)
    through_group = np.take_along_axis(cum_neg, self._end, axis=0)
    before_group = (np.take_along_axis(cum_neg, self._start, axis=0)
                    - np.take_along_axis(neg, self._start, axis=0))
    wins = (pos * ((total_neg - through_group) + 0.5 * (through_group - before_group))).sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
      return np.where((total_pos > 0) & (total_neg > 0), wins / (total_pos * total_neg), np.nan)

  def average_precision(self, sample_weights: np.ndarray) -> np.ndarray:
    """AP per column with per-sample weights [S] (e.g. bootstrap counts): float [M]."""
    w = np.asarray(sample_weights, np.float64)[self._order] * self._valid
    pos = w * self._labels
    tp = np.cumsum(pos, axis=0)
    seen = np.cumsum(w, axis=0)
    precision_at_end = np.take_along_axis(tp / np.maximum(seen, 1e-300), self._end, axis=0)
    total_pos = tp[-1]
    with np.errstate(invalid="ignore", divide="ignore"):
      return np.where(total_pos > 0, (pos * precision_at_end).sum(0) / total_pos, np.nan)
