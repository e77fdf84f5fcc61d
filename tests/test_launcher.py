"""launcher.launch starts every run the same way: the checks, the preflight, the claim, then the
job. A sub-run (launched on its parent's `Workdir.sub` handle) is checked like a top run and
writes the same config.json, under its parent's lock: no second one."""

import json
import sys
import types

import ml_collections
import pytest

from metonymy import launcher
from metonymy.workdir import Workdir
from metonymy.workdir import layout

FAKE_JOB = "metonymy_test_launcher_fake_job"


@pytest.fixture
def jobs(monkeypatch):
  """The "demo" and "train" jobs replaced by `seen[name] = fn(config, workdir)` stand-ins."""
  seen = {}

  def install(**runs):
    for name, fn in runs.items():
      module = types.ModuleType(f"{FAKE_JOB}_{name}")
      module.run = lambda config, workdir, fn=fn, name=name: seen.setdefault(name, []).append(
          fn(config, workdir))
      monkeypatch.setitem(sys.modules, module.__name__, module)
      monkeypatch.setitem(launcher.JOBS, name, module.__name__)
    return seen

  return install


def _train_config(checkpoint="workdir:../backbone", num_parts=4):
  return ml_collections.ConfigDict({"job": "train", "backbone": {"checkpoint": checkpoint},
                                    "model": {"name": "stage1", "num_parts": num_parts}})


def _demo_config():
  return ml_collections.ConfigDict({"job": "demo", "mode": "story"})


def test_a_sub_run_is_claimed_under_its_parents_lock_and_writes_its_config(tmp_path, jobs):
  root = tmp_path / "demo"

  def train(config, workdir):
    assert workdir.is_sub_run and workdir.root.path == layout.as_path(root)
    assert (root / layout.LOCK_FILE).exists()  # The parent's lock, held.
    assert not workdir.lock_file.exists()  # None of its own.
    return json.loads(workdir.config_file.read_text())

  def demo(config, workdir):
    workdir.backbone.mkdir(parents=True)
    launcher.launch(_train_config(), workdir.sub("single"))

  seen = jobs(demo=demo, train=train)
  launcher.launch(_demo_config(), root)
  assert seen["train"] == [_train_config().to_dict()]
  assert not (root / layout.LOCK_FILE).exists()  # Released when the parent ended.
  assert layout.read_json(root / layout.CONFIG_FILE)["job"] == "demo"


def test_a_sub_runs_input_is_checked_where_its_record_points(tmp_path, jobs):
  def demo(config, workdir):
    with pytest.raises(launcher.NotStarted, match=r"config.backbone.checkpoint='workdir:../nope'"):
      launcher.launch(_train_config("workdir:../nope"), workdir.sub("single"))
    assert not workdir.sub("single").path.exists()  # Refused before writing anything.

  seen = jobs(demo=demo, train=lambda config, workdir: pytest.fail("the job ran"))
  launcher.launch(_demo_config(), tmp_path / "demo")
  assert seen == {"demo": [None]}


def test_a_sub_run_of_another_config_is_refused_naming_the_key(tmp_path, jobs):
  def demo(config, workdir):
    workdir.backbone.mkdir(parents=True)
    launcher.launch(_train_config(num_parts=4), workdir.sub("single"))
    with pytest.raises(launcher.NotStarted, match=r"model.num_parts: 4 -> 8"):
      launcher.launch(_train_config(num_parts=8), workdir.sub("single"))

  seen = jobs(demo=demo, train=lambda config, workdir: config.model.num_parts)
  launcher.launch(_demo_config(), tmp_path / "demo")
  assert seen["train"] == [4]


def test_a_top_run_with_a_missing_input_writes_nothing(tmp_path, jobs):
  seen = jobs(train=lambda config, workdir: pytest.fail("the job ran"))
  workdir = tmp_path / "W"
  with pytest.raises(launcher.NotStarted, match=r"config.backbone.checkpoint="):
    launcher.launch(_train_config(str(tmp_path / "nope")), workdir)
  with pytest.raises(launcher.NotStarted, match=r"Unknown job 'nope'"):
    launcher.launch(ml_collections.ConfigDict({"job": "nope"}), workdir)
  with pytest.raises(launcher.NotStarted, match=r"--workdir=DIR is required for the 'train'"):
    launcher.launch(_train_config(""), None)
  assert not workdir.exists() and not seen


def test_a_handle_keeps_its_tree(tmp_path):
  root = Workdir(tmp_path / "demo")
  sub = root.sub("ste_seed0").sub("probe")
  assert Workdir(sub).root is root and not root.is_sub_run and Workdir(sub).is_sub_run
  assert sub.record(root.backbone) == "workdir:../../backbone"
  assert sub.resolve("workdir:../train") == str(tmp_path / "demo" / "ste_seed0" / "train")
  assert str(sub) == str(tmp_path / "demo" / "ste_seed0" / "probe")
