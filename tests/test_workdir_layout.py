"""metonymy/workdir/layout.py: one place for a workdir's paths, its small files' readers and
writers, and the local copy single-host jobs run in on an object store."""

import json
import os

import pytest

from metonymy.workdir import Workdir
from metonymy.workdir import layout


def test_paths_are_absolute_locally_and_urls_stay_urls(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  local = Workdir("runs/a")
  assert os.fspath(local.checkpoints) == os.path.join(str(tmp_path), "runs", "a", "checkpoints")
  assert local.is_local
  remote = Workdir("gs://bucket/runs/a")
  assert os.fspath(remote.model_file) == "gs://bucket/runs/a/model.json"
  assert os.fspath(remote.sub("train").metrics_file) == "gs://bucket/runs/a/train/metrics.jsonl"
  assert not remote.is_local
  assert os.fspath(remote.image("eval/part_maps", 7)).endswith("images/eval_part_maps_0000007.png")


def test_metric_records_by_prefix_and_a_bad_line_is_named(tmp_path):
  files = Workdir(tmp_path)
  lines = [{"step": 2, "eval/mAP": 0.5, "loss": 1.0}, {"step": 1, "eval/mAP": "nan"},
           {"step": 3, "loss": 0.5}]
  files.metrics_file.write_text("".join(json.dumps(r) + "\n" for r in lines))
  records = files.metric_records("eval/")
  assert list(records) == [1, 2] and records[2] == {"mAP": 0.5}
  assert records[1]["mAP"] != records[1]["mAP"]  # "nan" -> NaN
  files.metrics_file.write_text(json.dumps(lines[0]) + "\n{half a line\n")
  with pytest.raises(ValueError, match=r"metrics.jsonl, line 2: not JSON"):
    files.metric_records("eval/")


def test_model_info_is_required_by_name_and_round_trips(tmp_path):
  files = Workdir(tmp_path)
  assert not files.is_training_workdir()
  with pytest.raises(FileNotFoundError, match=r"model.json not found: .* is not a part-discovery"):
    files.read_model_info()
  files.write_model_info({"model": {"name": "stage1"}})
  assert files.read_model_info() == {"model": {"name": "stage1"}}
  assert files.read_config() is None
  files.write_config_json({"job": "train"})
  assert files.read_config() == {"job": "train"}
  files.config_file.write_text("{not json")
  with pytest.raises(ValueError, match=r"config.json cannot be read as JSON"):
    files.read_config()


def test_write_text_leaves_no_aside_file(tmp_path):
  path = layout.write_text(tmp_path / "deep" / "report.md", "one")
  layout.write_text(path, "two")
  assert path.read_text() == "two"
  assert sorted(os.listdir(tmp_path / "deep")) == ["report.md"]


def test_a_local_workdir_is_its_own_staging_folder(tmp_path):
  with layout.staged_locally(tmp_path / "run") as local:
    assert local == os.fspath(tmp_path / "run")


def test_paths_inside_the_jobs_tree_are_recorded_relative_to_the_holder(tmp_path):
  root = tmp_path / "demo"
  backbone, sub = root / "backbone", root / "single"
  assert layout.record_path(backbone, sub, root) == "workdir:../backbone"
  assert layout.record_path(backbone, root, root) == "workdir:backbone"
  table3 = root / "ste_seed0"
  assert layout.record_path(table3 / "train", table3 / "probe", root) == "workdir:../train"
  assert layout.record_path(backbone, table3 / "train", root) == "workdir:../../backbone"
  # An input outside the tree (a user's checkpoint) is recorded as given, absolute locally.
  assert layout.record_path(tmp_path / "ckpt", sub, root) == os.fspath(tmp_path / "ckpt")
  assert layout.record_path(tmp_path / "demo2", sub, root) == os.fspath(tmp_path / "demo2")
  assert layout.record_path("gs://b/demo/backbone", "gs://b/demo/single",
                            "gs://b/demo") == "workdir:../backbone"


def test_a_relative_record_resolves_against_where_the_workdir_is_now(tmp_path):
  moved = tmp_path / "moved"
  assert layout.resolve_path("workdir:../backbone", moved / "single") == os.fspath(
      moved / "backbone")
  assert layout.resolve_path("workdir:../../backbone",
                             "gs://b/t3/ste_seed0/train") == "gs://b/t3/backbone"
  assert layout.resolve_path("workdir:backbone", "gs://b/demo") == "gs://b/demo/backbone"
  # Older records (absolute), a user's path and "no checkpoint" are returned as they are.
  for recorded in ("/old/place/backbone", "gs://b/ckpt", ""):
    assert layout.resolve_path(recorded, moved) == recorded
  # An unresolved record is never taken for a path of the current directory.
  with pytest.raises(ValueError, match=r"'workdir:../backbone' is a path recorded relative to "
                                       r"a workdir; read it with layout.resolve_path"):
    Workdir("workdir:../backbone")


def test_write_json_is_strict_json_and_names_the_file(tmp_path):
  path = layout.write_json(tmp_path / "results.json", {"mAP": 0.5, "rows": [1, 2]})
  assert layout.read_json(path) == {"mAP": 0.5, "rows": [1, 2]}
  with pytest.raises(ValueError, match=r"bad.json: not written, Out of range float values"):
    layout.write_json(tmp_path / "bad.json", {"mAP": float("nan")})
  assert not (tmp_path / "bad.json").exists()
