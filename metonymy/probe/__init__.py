"""The leakage benchmark (paper Sec. 3, 5.2): part masks, late / early part features, linear
probes, PS / MPPO / NMI / ARI / causal leakage, reports. The job is `run(config, workdir)`.

  masks      part masks from ground truth, files or a trained Stage 1, and the patch-grid rule
  features   late / early masked part features of a frozen backbone (jitted)
  cache      resumable chunked on-disk arrays
  extract    one pass over a split into the cache
  linear     K vectorized linear probes with weight decay chosen on val
  leakage    the causal leakage score
  benchmark  one backbone, one dataset, one seed: everything above
  report     results.json, report.md; plots: the figures
  job        run(config, workdir)
"""

from metonymy.probe import job


def run(config, workdir):
  return job.run(config, workdir)
