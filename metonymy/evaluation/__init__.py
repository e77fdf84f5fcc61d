"""Evaluation metrics of the leakage benchmark: NumPy (scikit-learn for k-means only).

  metrics       attribute AP / mAP / AUROC, vectorized over columns, with sample weights
  part_metrics  contingency matrix, part assignment (tau or manual), PS (eq. 1), MPPO (eq. 2),
                NMI / ARI of part assignments at keypoints, mask coverage of the true parts
                on the patch grid (Fig. 4)
  bootstrap     bootstrap confidence intervals and averaging over seeds
  position_baseline  the position-only partition, the chance row of NMI / ARI
  part_names    how discovered parts are named ("part k", "part k (≈ wing)") and coloured
"""

from metonymy.evaluation import bootstrap
from metonymy.evaluation import metrics
from metonymy.evaluation import part_metrics
from metonymy.evaluation import part_names
from metonymy.evaluation import position_baseline

__all__ = ["bootstrap", "metrics", "part_metrics", "part_names", "position_baseline"]
