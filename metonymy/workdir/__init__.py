"""A run's workdir, on any filesystem Orbax writes to (a local folder, `gs://bucket/...`).

  layout          where each file of a workdir is (`Workdir`), and the readers and writers of
                  the small ones: config.json, model.json, metrics.jsonl, reports
  claim           one run at a time per workdir, and only a run of the workdir's own config
  trained_params  the trained parameters read back from a workdir's checkpoints (Orbax); the
                  training run's own save and restore is training/run_state.py

  files = workdir.Workdir(path)          # files.checkpoints, files.model_file, ...
  lock = workdir.claim.claim(path, config)

The trainer, the probe, the demo, the Table-3 job and `loading` find a workdir's files here;
nothing else joins a workdir path by hand. The package imports nothing else of metonymy's, so
every layer may use it; importing it (without `trained_params`) does not import JAX.
"""

from metonymy.workdir import claim
from metonymy.workdir import layout
from metonymy.workdir.layout import (Workdir, as_path, is_local, read_json, record_path,
                                     resolve_path, write_json, write_text)
