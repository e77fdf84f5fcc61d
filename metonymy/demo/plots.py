"""The correlation sweep's figure: PS against the world's cross-part correlation, late and early
masking side by side, so the late-early gap (leakage) and the early curve's fall (real
correlation) read off one plot."""

from typing import Dict, List

import numpy as np

from metonymy.probe import plots as probe_plots


def plot_sweep(path: str, points: List[Dict]) -> None:
  """PS against correlation, late and early masking, with bootstrap intervals when present."""
  fig, ax = probe_plots.subplots(figsize=(5.2, 3.8))
  x = np.array([p["correlation"] for p in points])
  for masking, color, marker in (("late", "tab:red", "o"), ("early", "tab:blue", "s")):
    y = np.array([np.nan if p.get(f"ps_{masking}") is None else p[f"ps_{masking}"]
                  for p in points], float)
    ci = [p.get(f"ps_{masking}_ci") for p in points]
    if all(c is not None and None not in c for c in ci):
      err = np.abs(np.array(ci, float).T - y)
      ax.errorbar(x, y, yerr=err, color=color, marker=marker, capsize=3,
                  label=f"{masking} masking")
    else:
      ax.plot(x, y, color=color, marker=marker, label=f"{masking} masking")
  ax.set_xlabel("cross-part attribute correlation of the world")
  ax.set_ylabel("part specificity (PS)")
  ax.set_title("Leakage vs real correlation")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
