"""workdir/writers.py's console progress: clu's ReportProgress measures steps/s between the steps
it reports, without the time spent inside `pause()`, and imports without TensorFlow."""

import os
import subprocess
import sys

from metonymy.workdir import writers


def test_progress_reports_on_log_steps_and_leaves_pauses_out(monkeypatch):
  now = [100.0]
  monkeypatch.setattr(writers.time, "monotonic", lambda: now[0])
  progress = writers.Progress(total_steps=5, every_steps=2)
  progress(1)  # The first timed step: the clock starts.
  assert progress.line(1) == "- steps/s, ETA ?"
  now[0] += 2.0
  progress(2)  # Reported: 1 step in 2 s.
  assert progress.line(2) == "0.50 steps/s, ETA 0m06s"
  now[0] += 1.0
  progress(3)
  with progress.pause():  # An evaluation: not training time.
    now[0] += 50.0
  now[0] += 1.0
  progress(4)  # 2 steps in 2 s of training.
  assert progress.steps_per_second == 1.0
  now[0] += 0.25
  progress(5)  # The last step is reported although 5 % 2 != 0.
  assert progress.line(5) == "4.00 steps/s, ETA 0m00s"


def test_profiler_is_off_by_default(tmp_path):
  assert writers.profiler(str(tmp_path), 0, 1) is None


def test_clu_periodic_actions_import_without_tensorflow():
  code = ("import sys; from metonymy.workdir import writers; writers._periodic_actions(); "
          "assert 'tensorflow' not in sys.modules")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


def test_a_training_process_imports_neither_torch_nor_scikit_learn_before_it_needs_them(tmp_path):
  """Each costs a process 1-2 s of CPU. Torch: the TensorBoard writer never needs it, and it stays
  importable afterwards (the checkpoint converters need it). scikit-learn: only the position
  baseline's k-means, fit at the first evaluation."""
  code = ("import sys; import numpy as np; from metonymy.training import trainer; "
          "from metonymy.workdir import writers; "
          "from metonymy.evaluation import position_baseline; "
          f"w = writers.MetricWriter({str(tmp_path)!r}); w.write_scalars(1, {{'loss': 0.5}}); "
          "assert 'torch' not in sys.modules, 'torch was imported'; "
          "assert 'sklearn' not in sys.modules, 'sklearn was imported'; "
          "position_baseline.fit(np.ones((1, 1, 2)), np.ones((1, 1), bool), (4, 4), 1); "
          "assert 'sklearn' in sys.modules; import torch; torch.zeros(1)")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert os.listdir(tmp_path / "tensorboard")


def test_a_training_run_shows_its_curves_images_and_config_in_tensorboard(tmp_path):
  """The event files a short run writes, read back with tensorboard's own reader."""
  from metonymy import config_lib
  from metonymy.training import trainer
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  config = config_lib.load_config(os.path.join(root, "configs", "synthetic_single.py"), "runlocal")
  trainer.run(config, str(tmp_path))
  shown = writers.read_tensorboard(str(tmp_path))
  assert {"loss", "grad_norm", "train/part_share/max", "lr/prototypes", "eval/stage1/mAP",
          "eval/parts/NMI", "train/relative_change/prototypes"} <= shown["scalars"], shown
  assert "eval/part_maps" in shown["images"] and "config" in shown["text"]
