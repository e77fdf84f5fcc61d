"""PS against the synthetic world's cross-part correlation, late vs early masking: the picture that
separates leakage from real correlation (metonymy/demo/sweep.py, mode "correlation_sweep").

  python -m metonymy.main --config=configs/demo_correlation_sweep.py --workdir=/tmp/demo_sweep
  python -m metonymy.main --config=configs/demo_correlation_sweep.py:small \
      --workdir=/tmp/sweep_small
  python -m metonymy.main --config=configs/demo_correlation_sweep.py --workdir=/tmp/demo_sweep \
      --config.benchmark.backbone.checkpoint=/tmp/metonymy_demo/backbone   # reuse the demo's

One backbone (configs/demo.py's, pretrained on the correlation-0 world, or the one given) is
benchmarked on worlds that differ only in `correlation`; each point has its own workdir
correlation_<c>/ with the full benchmark report. Outputs: ps_vs_correlation.png, report.md,
results.json.
arg (flag): none for 5 correlations at the demo's size; `small` for correlations 0 and 1 at the
demo's `tiny` size (seconds of compute; the test).
"""

import ml_collections

from metonymy import config_lib


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  small = config_lib.parse_arg(arg, small=False).small
  correlations = (0.0, 1.0) if small else (0.0, 0.25, 0.5, 0.75, 1.0)
  config = config_lib.load_sibling_config(__file__, "demo", "tiny" if small else "")
  config.mode = "correlation_sweep"
  # The story's training blocks are not used by the sweep: drop them so overrides fail loudly.
  del config["single"]
  del config["two_stage"]
  del config["readme"]
  config.sweep = ml_collections.ConfigDict({"correlations": tuple(correlations)})
  return config
