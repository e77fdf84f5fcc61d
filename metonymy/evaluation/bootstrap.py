"""Bootstrap confidence intervals over test samples, and averaging over seeds.

A statistic is a function of per-sample weights: `stat(weights [S]) -> float or array`, where the
point estimate is `stat(ones)` and a bootstrap replicate is `stat(counts)` with `counts` the
multiplicities of S draws with replacement (multinomial). Weighted statistics avoid copying and
re-sorting the data for every replicate (see `metrics.SortedColumns`).

The interval is the percentile interval: the alpha/2 and 1 - alpha/2 quantiles of the replicates
(NaN replicates, e.g. a resample without positives, are skipped).
"""

import math
import warnings
from typing import Callable, Dict, Mapping, Optional, Sequence, Union

import numpy as np

Stat = Callable[[np.ndarray], Union[float, np.ndarray]]


def resample_counts(num_samples: int, num_resamples: int, seed: int,
                    groups: Optional[np.ndarray] = None) -> np.ndarray:
  """int [R, S] bootstrap multiplicities.

  groups: optional int [S] cluster ids (e.g. patients): clusters are resampled whole, and every
    sample of a drawn cluster gets its cluster's count.
  """
  rng = np.random.default_rng(seed)
  if groups is None:
    return rng.multinomial(num_samples, np.full(num_samples, 1.0 / num_samples),
                           size=num_resamples)
  groups = np.asarray(groups)
  if groups.shape != (num_samples,):
    raise ValueError(f"groups must be [S] = [{num_samples}], got {groups.shape}")
  uniq, inverse = np.unique(groups, return_inverse=True)
  cluster_counts = rng.multinomial(len(uniq), np.full(len(uniq), 1.0 / len(uniq)),
                                   size=num_resamples)
  return cluster_counts[:, inverse]


def bootstrap(stat: Stat, num_samples: int, *, num_resamples: int = 200, seed: int = 0,
              alpha: float = 0.05, groups: Optional[np.ndarray] = None) -> Dict[str, np.ndarray]:
  """Point estimate and percentile bootstrap interval of `stat`.

  Args:
    stat: weights [S] -> float or float array (any fixed shape).
    num_samples: S.
    num_resamples: R replicates (0: point estimate only, low = high = NaN).
    seed: RNG seed of the resampling.
    alpha: 1 - coverage (0.05 = 95% interval).
    groups: optional cluster ids [S] for a cluster bootstrap.

  Returns:
    {"value", "low", "high", "std"} arrays of stat's shape (floats for scalar stats).
  """
  if not 0.0 < alpha < 1.0:
    raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
  value = np.asarray(stat(np.ones(num_samples)), np.float64)
  if num_resamples <= 0 or num_samples == 0:
    nan = np.full(value.shape, np.nan)
    return _squeeze({"value": value, "low": nan, "high": nan, "std": nan})
  counts = resample_counts(num_samples, num_resamples, seed, groups)
  reps = np.stack([np.asarray(stat(c.astype(np.float64)), np.float64) for c in counts])
  return _squeeze(interval(reps, value, alpha))


def interval(replicates: np.ndarray, value: np.ndarray,
             alpha: float = 0.05) -> Dict[str, np.ndarray]:
  """Percentile interval of replicates [R, ...] around a point estimate (NaN-skipping)."""
  reps = np.asarray(replicates, np.float64)
  reps = np.where(np.isfinite(reps), reps, np.nan)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices give NaN, by design
    low = np.nanquantile(reps, alpha / 2, axis=0)
    high = np.nanquantile(reps, 1 - alpha / 2, axis=0)
    std = (np.nanstd(reps, axis=0, ddof=1) if len(reps) > 1
           else np.full(np.shape(value), np.nan))
  return {"value": np.asarray(value, np.float64), "low": low, "high": high, "std": std}


def _squeeze(d: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
  return {k: (float(v) if np.ndim(v) == 0 else v) for k, v in d.items()}


# ------------------------------------------------------------------------------------------------
# Seeds.


def over_seeds(values: Sequence[Union[float, np.ndarray]]
               ) -> Dict[str, Union[float, np.ndarray, int]]:
  """Mean, sample std and standard error over seeds (NaN-skipping), with the seed count.

  values: one float (or same-shape array) per seed.
  """
  arr = np.asarray([np.asarray(v, np.float64) for v in values])
  if arr.shape[0] == 0:
    raise ValueError("over_seeds needs at least one value")
  finite = np.isfinite(arr)
  n = finite.sum(0)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)
    mean = np.nanmean(arr, 0)
    std = np.where(n > 1, np.nanstd(arr, 0, ddof=1) if arr.shape[0] > 1 else np.nan, np.nan)
  sem = np.where(n > 1, std / np.sqrt(np.maximum(n, 1)), np.nan)
  out = {"mean": mean, "std": std, "sem": sem, "n": n}
  return {k: (float(v) if np.ndim(v) == 0 and k != "n" else (int(v) if np.ndim(v) == 0 else v))
          for k, v in out.items()}


def aggregate_scalars(per_seed: Sequence[Mapping[str, float]]) -> Dict[str, Dict[str, float]]:
  """{name: value} per seed -> {name: over_seeds(values)} for the names every seed reports."""
  if not per_seed:
    return {}
  names = [n for n in per_seed[0] if all(n in d for d in per_seed)]
  return {n: over_seeds([d[n] for d in per_seed]) for n in names}


def format_ci(value: float, low: float, high: float, digits: int = 3) -> str:
  """'0.123 [0.100, 0.150]' (or just the value when the interval is missing)."""
  if value is None or not math.isfinite(value):
    return "n/a"
  if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
    return f"{value:.{digits}f}"
  return f"{value:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"
