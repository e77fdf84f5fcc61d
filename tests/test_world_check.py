"""The world check (metonymy/world_check/): what it measures is measured as documented."""

import os

import numpy as np
import pytest

from metonymy import config_lib
from metonymy import loading
from metonymy.world_check import measure as world_check
from metonymy.converters import store

CONFIG_FILE = os.path.join(os.path.dirname(__file__), "..", "configs", "demo.py")


def test_contiguous_quarters_keep_a_connected_quarter_of_each_part():
  rng = np.random.default_rng(0)
  part_ids = np.full((1, 8, 8), 3, np.int32)  # K = 3: background is 3
  part_ids[0, :4, :4] = 0   # 16 patches -> 4 kept
  part_ids[0, 6, 1:6] = 1   # 5 patches in a row -> 2 kept, side by side
  quarters = world_check.contiguous_quarters(part_ids, 3, rng)
  assert ((quarters == 0) <= (part_ids == 0)).all() and ((quarters == 1) <= (part_ids == 1)).all()
  assert (quarters == 0).sum() == 4 and (quarters == 1).sum() == 2 and (quarters == 2).sum() == 0
  rows, cols = np.nonzero(quarters[0] == 1)
  assert (rows == 6).all() and abs(cols[0] - cols[1]) == 1
  # The nearest patches of a random one: a 2 x 2 block, or a run of 4 next to each other.
  rows, cols = np.nonzero(quarters[0] == 0)
  assert (rows.max() - rows.min()) + (cols.max() - cols.min()) <= 3


def _tiny(world_options):
  config = config_lib.load_sibling_config(CONFIG_FILE, "demo", "tiny,world=v2")
  config.world.update(world_options)
  config.world.splits = {"train": 48, "val": 24, "test": 8}
  return config


def test_evidence_is_seen_by_the_whole_part_more_than_by_a_quarter_and_absent_from_v1():
  out = world_check.check(_tiny({}), split="val", train_images=48, images=24)
  evidence = out["evidence"]
  assert np.all(np.array(evidence["whole_sees_evidence"])
                >= np.array(evidence["quarter_sees_evidence"]))
  assert np.mean(evidence["quarter_sees_evidence"]) < np.mean(evidence["whole_sees_evidence"])
  assert out["mechanism"] is None  # no backbone given, none shipped for a 32-px world
  assert 0.0 <= out["position_baseline"]["NMI"] <= 100.0
  whole = world_check.check(_tiny({"evidence_fraction": 1.0}), train_images=16, images=8)
  assert whole["evidence"] is None
  with pytest.raises(ValueError, match="test is for results"):
    world_check.check(_tiny({}), split="test")


def test_the_mechanism_probes_run_on_a_given_backbone(tmp_path):
  config = _tiny({})
  model, params, arch = loading.build_backbone(config.backbone, 0)
  store.save_converted(tmp_path / "backbone", arch, params, source="random init (test)")
  out = world_check.check(config, backbone=str(tmp_path / "backbone"), train_images=48,
                          images=24)
  mech = out["mechanism"]
  for masking in ("early", "late"):
    for region in ("whole", "quarter"):
      assert len(mech[masking][region]["color"]["per_part"]) == 5
      assert 0.0 <= mech[masking][region]["color"]["mean"] <= 1.0
    assert mech[masking]["color_gap"] == pytest.approx(
        mech[masking]["whole"]["color"]["mean"] - mech[masking]["quarter"]["color"]["mean"])
  assert 0.0 < mech["chance"]["color"] < 1.0
  legible = out["part_legibility"]
  assert 0.0 <= legible["part_probe/balanced_accuracy"] <= 1.0
  assert legible["part_probe/chance"] == pytest.approx(1 / 6)
  assert legible["part_probe/images"] == 24
  report = world_check.format_report(out)
  assert "position baseline" in report and "mechanism present" in report
  assert "part legibility" in report


@pytest.mark.slow
def test_the_data_command_runs_the_world_check(tmp_path):
  import json
  import subprocess
  import sys
  output = tmp_path / "check.json"
  done = subprocess.run(
      [sys.executable, "-m", "metonymy.data", "world-check",
       f"--config={CONFIG_FILE}:tiny,world=v2", "--config.world.seed=1", "--train_images=32",
       "--images=16", f"--output={output}"], capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert "position baseline" in done.stdout and "world seed 1" in done.stdout
  assert json.loads(output.read_text())["world"]["seed"] == 1


@pytest.mark.slow
def test_the_world_check_is_a_job_through_the_launcher(tmp_path):
  import json
  from metonymy import launcher
  config = config_lib.load_config(
      os.path.join(os.path.dirname(CONFIG_FILE), "world_check.py"), "tiny,world=v2")
  config.world.seed = 1
  config.world_check.train_images, config.world_check.images = 32, 16
  workdir = tmp_path / "check"
  launcher.launch(config, str(workdir))
  results = json.loads((workdir / "results.json").read_text())
  assert results["world"]["seed"] == 1 and results["images"] == 16
  assert "position baseline" in (workdir / "report.md").read_text()
  assert json.loads((workdir / "config.json").read_text())["job"] == "world_check"
  # Its refusals come before the workdir is written.
  config.world_check.split = "test"
  config.world_check.backbone = str(tmp_path / "nowhere")
  with pytest.raises(launcher.NotStarted, match="test is for results only") as refused:
    launcher.launch(config, str(tmp_path / "refused"))
  assert "world_check.backbone=" in str(refused.value)
  assert not (tmp_path / "refused").exists() or not os.listdir(tmp_path / "refused")
