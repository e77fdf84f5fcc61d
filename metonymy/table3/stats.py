"""Summaries of Table-3 rows: per variant mean and sd over run seeds, and each two-stage variant
minus single-stage paired by run seed, with a 95% Student-t interval of the mean difference."""

import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from scipy import stats as scipy_stats

METRICS = ("NMI", "ARI", "NMI_fg", "ARI_fg", "PS", "MPPO", "mAP_stage1", "mAP_stage2",
           "mAP_ensemble", "max_part_share", "background_share")
# The position baseline of each run (the chance row of NMI / ARI): summarised, never paired (it
# does not depend on the variant).
POSITION_METRICS = ("position_NMI", "position_ARI", "position_NMI_fg", "position_ARI_fg")


def coverage_metrics(num_true_parts: int) -> Tuple[str, ...]:
  """The rows' mask-coverage keys (variants.coverage): the means over the true parts, then per
  part."""
  return ("coverage", "area_ratio") + tuple(
      f"{name}/{g}" for name in ("coverage", "area_ratio") for g in range(num_true_parts))


def _finite(values) -> List[float]:
  return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def mean_sd(values: Sequence[Optional[float]]) -> Dict:
  """{"mean", "sd" (n - 1 in the denominator; None for n < 2), "n"} of the finite values."""
  xs = _finite(values)
  if not xs:
    return {"mean": None, "sd": None, "n": 0}
  return {"mean": float(np.mean(xs)), "sd": float(np.std(xs, ddof=1)) if len(xs) > 1 else None,
          "n": len(xs)}


def t_interval(differences: Sequence[float], level: float = 0.95) -> Dict:
  """{"mean", "ci": [lo, hi], "n", "differences"}: the mean of paired differences and its
  Student-t interval (None for n < 2)."""
  xs = _finite(differences)
  out = {"mean": float(np.mean(xs)) if xs else None, "ci": None, "n": len(xs),
         "differences": xs}
  if len(xs) >= 2:
    half = (scipy_stats.t.ppf(0.5 + level / 2, len(xs) - 1) * np.std(xs, ddof=1)
            / math.sqrt(len(xs)))
    out["ci"] = [out["mean"] - half, out["mean"] + half]
  return out


def summary(rows: List[Dict], metrics=METRICS) -> Dict[str, Dict[str, Dict]]:
  """{variant: {metric: mean_sd}} in the order the variants first appear."""
  variants = list(dict.fromkeys(r["variant"] for r in rows))
  return {v: {m: mean_sd([r.get(m) for r in rows if r["variant"] == v]) for m in metrics}
          for v in variants}


def paired(rows: List[Dict], baseline: str = "single", metrics=METRICS) -> Dict[str, Dict]:
  """{variant: {metric: t_interval(variant - baseline)}} over the run seeds both have."""
  by = {(r["variant"], r["seed"]): r for r in rows}
  out = {}
  for variant in dict.fromkeys(r["variant"] for r in rows):
    if variant == baseline:
      continue
    seeds = sorted(s for v, s in by if v == variant and (baseline, s) in by)
    out[variant] = {"seeds": seeds}
    for m in metrics:
      diffs = [by[(variant, s)].get(m) - by[(baseline, s)].get(m) for s in seeds
               if by[(variant, s)].get(m) is not None and by[(baseline, s)].get(m) is not None]
      out[variant][m] = t_interval(diffs)
  return out


def position_baseline(rows: List[Dict], tolerance: float = 1e-6) -> Optional[Dict]:
  """The position baseline's row of Table 3: {"NMI", "ARI", "NMI_fg", "ARI_fg": mean_sd over
  run seeds, "by_seed": {seed: {metric: value}}, "equal_across_variants": bool, "unequal":
  [sentences]}, or None when no run measured one.

  It is a function of the world, K and the run seed, not of the model, so every variant of a
  seed must give the same numbers: a difference means the arms were not scored alike (another
  evaluation set, K or seed), and is reported rather than averaged away.
  """
  measured = [r for r in rows if r.get("position_NMI") is not None]
  if not measured:
    return None
  by_seed: Dict[int, Dict[str, float]] = {}
  unequal = []
  for r in measured:
    values = {m[len("position_"):]: r.get(m) for m in POSITION_METRICS}
    first = by_seed.setdefault(int(r["seed"]), values)
    differing = [m for m, v in values.items()
                 if v is None or first[m] is None or abs(v - first[m]) > tolerance]
    if differing:
      unequal.append(f"seed {r['seed']}: {r['variant']} gives "
                     + ", ".join(f"{m} {values[m]} (not {first[m]})" for m in differing))
  out = {m: mean_sd([values[m] for values in by_seed.values()])
         for m in ("NMI", "ARI", "NMI_fg", "ARI_fg")}
  out.update({"by_seed": {str(seed): values for seed, values in sorted(by_seed.items())},
              "equal_across_variants": not unequal, "unequal": unequal})
  return out
