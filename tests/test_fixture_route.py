"""Trying a real dataset's configs before downloading it: `python -m metonymy.data make-fixture`
writes a miniature CUB in the official layout, `configs/cub_ste.py:runlocal` trains on it and
`configs/probe_cub.py:runlocal` benchmarks that run's own parts and Stage-2 ViT, all through
`python -m metonymy.main` as a user would type it."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args, timeout=600):
  proc = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True,
                        timeout=timeout)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return proc


def test_make_fixture_refuses_a_folder_with_files(tmp_path):
  (tmp_path / "x").write_text("mine")
  proc = subprocess.run([sys.executable, "-m", "metonymy.data", "make-fixture", "--dataset",
                         "cub", "--root", str(tmp_path)], capture_output=True, text=True)
  assert proc.returncode == 1 and "not empty" in proc.stderr
  assert (tmp_path / "x").read_text() == "mine"


@pytest.mark.slow
def test_cub_fixture_trains_cub_ste_and_probes_its_parts(tmp_path):
  fixture, train, probe = tmp_path / "cub", tmp_path / "cub_ste", tmp_path / "probe_cub"
  _run("metonymy.data", "make-fixture", "--dataset", "cub", "--root", str(fixture))
  check = _run("metonymy.data", "check", "--dataset", "cub", "--root", str(fixture))
  assert json.loads(check.stdout.strip().splitlines()[-1])["num_attributes"] == 248
  _run("metonymy.main", "--config=configs/cub_ste.py:runlocal", f"--config.data.root={fixture}",
       f"--workdir={train}")
  assert (train / "model.json").exists() and (train / "checkpoints").is_dir()
  # The training part-map image: image, discovered parts and keypoints, each >= 192 px, legend.
  from PIL import Image
  pngs = sorted((train / "images").glob("eval_part_maps_*.png"))
  assert pngs, sorted(os.listdir(train))
  with Image.open(pngs[-1]) as image:
    assert image.height > 3 * 192 and image.width > 192
  _run("metonymy.main", "--config=configs/probe_cub.py:runlocal", f"--config.data.root={fixture}",
       "--config.masks.source=stage1", f"--config.masks.path={train}",
       f"--config.backbone.checkpoint={train}", f"--workdir={probe}")
  with open(probe / "results.json") as f:
    results = json.load(f)
  assert results["ps_late"] is not None and results["ps_early"] is not None
  assert results["causal_leakage_early"] == 0.0
  # The trained workdir's parts are discovered: "part 1..K" (best match "≈ group" in the
  # matrices), never the dataset's part names nor the old "P0".
  seed0 = next(iter(results["backbones"].values()))["seeds"][0]
  assert seed0["part_names"] == [f"part {k + 1}" for k in range(seed0["num_parts"])]
  report = (probe / "report.md").read_text()
  assert "| part 1" in report and "P0" not in report
