"""`python -m metonymy.probe.export_part_maps`: a trained workdir's part maps in the probe's file
format, giving the benchmark the numbers `masks.source="stage1"` gives from the model itself."""

import os
import subprocess
import sys

import numpy as np
import pytest

from metonymy import config_lib
from metonymy.probe import export_part_maps
from metonymy import probe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE_CONFIG = os.path.join(ROOT, "configs", "probe_synthetic.py")


@pytest.fixture
def trained(trained_four_steps_run):
  """A finished 4-step training run (tests/helpers/shared_runs.py, shared with tests/test_faults.py)."""
  return trained_four_steps_run.workdir


def _probe_config(**masks):
  config = config_lib.load_config(PROBE_CONFIG, "tiny")
  config.masks.update(masks)
  return config


def test_the_export_holds_every_example_with_labels_in_0_to_k(trained, tmp_path):
  config = _probe_config()
  path = export_part_maps.export(config, trained, "test", str(tmp_path / "maps_{split}.npz"))
  assert path.endswith("maps_test.npz")
  archive = np.load(path)
  maps, k = archive["test"], int(archive["num_parts"])
  assert k == 5 and maps.shape == (64, 32, 32)  # probe_synthetic:tiny: 64 test images, 32 px.
  assert maps.min() >= 0 and maps.max() <= k
  with pytest.raises(ValueError, match=r"\.npy or \.npz"):
    export_part_maps.export(config, trained, "test", str(tmp_path / "maps.png"))


@pytest.mark.slow
def test_the_probe_on_the_exported_file_equals_the_probe_on_the_workdir(trained, tmp_path):
  path = export_part_maps.export(_probe_config(), trained, "test", str(tmp_path / "m_{split}.npz"))
  export_part_maps.export(_probe_config(), trained, "train", str(tmp_path / "m_{split}.npz"))
  export_part_maps.export(_probe_config(), trained, "val", str(tmp_path / "m_{split}.npz"))
  assert os.path.exists(path)
  results = {}
  for name, masks in (("stage1", {"source": "stage1", "path": trained}),
                      ("file", {"source": "file", "path": str(tmp_path / "m_{split}.npz")})):
    config = _probe_config(**masks)
    config.features.cache_dir = ""
    results[name] = probe.run(config, str(tmp_path / name))
  for key in ("ps_late", "ps_early", "causal_leakage_late", "causal_leakage_early"):
    assert results["file"][key] == results["stage1"][key], key


def test_the_command_line_names_a_missing_flag_and_a_bad_key(tmp_path):
  proc = subprocess.run([sys.executable, "-m", "metonymy.probe.export_part_maps",
                         f"--config={PROBE_CONFIG}:tiny", "--config.masks.nope=1",
                         f"--workdir={tmp_path}", f"--output={tmp_path}/m.npz"], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode != 0
  assert "error: Unknown config key 'masks.nope'" in proc.stderr, proc.stderr[-2000:]
  # The command's old name is an alias of it.
  proc = subprocess.run([sys.executable, "-m", "metonymy.export_part_maps",
                         f"--config={PROBE_CONFIG}:tiny", f"--workdir={tmp_path}",
                         f"--output={tmp_path}/m.npz"], cwd=ROOT, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode != 0
  error = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert len(error) == 1 and "model.json not found" in error[0], proc.stderr[-2000:]
