"""`python -m metonymy.main`: --print_config shows the resolved config and runs nothing; an
override of a key the config lacks fails naming the key."""

import os
import subprocess
import sys

import pytest

from metonymy import config_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _main(*args):
  return subprocess.run([sys.executable, "-m", "metonymy.main", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)


def test_print_config_prints_the_resolved_config_and_exits_without_a_workdir():
  proc = _main("--config=configs/celeba_ste.py:runlocal", "--config.trainer.num_steps=7",
               "--config.model.stage2.hard_gradient=none", "--print_config")
  assert proc.returncode == 0, proc.stderr[-3000:]
  want = config_lib.load_config(os.path.join(ROOT, "configs", "celeba_ste.py"), "runlocal")
  want.trainer.num_steps = 7
  want.model.stage2.hard_gradient = "none"
  assert proc.stdout == str(want)
  assert "Running job" not in proc.stderr


def test_an_unknown_override_or_arg_fails_naming_it():
  proc = _main("--config=configs/probe_suite.py:dataset=synthetic", "--config.backbones.x=1",
               "--print_config")
  assert proc.returncode != 0
  assert "Unknown config key 'backbones.x'" in proc.stderr, proc.stderr[-3000:]
  proc = _main("--config=configs/demo.py:small", "--print_config")
  assert proc.returncode != 0
  assert "Unknown config argument 'small'" in proc.stderr, proc.stderr[-3000:]
  # A typo in the arg is one error line, not absl's FATAL flag-parsing traceback.
  proc = _main("--config=configs/synthetic_single.py:runlocl", "--workdir=/tmp/unused")
  assert proc.returncode != 0
  assert proc.stderr.strip().startswith("error: Unknown config argument 'runlocl'"), proc.stderr
  assert "FATAL" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]


def test_a_world_option_overridden_in_a_sub_job_is_refused_naming_its_one_home(tmp_path):
  """The demo and the Table-3 job stamp config.world into every sub-job at run time: an
  override of a sub-job's copy would be silently replaced, so it is refused before anything is
  written."""
  for config in ("configs/demo.py", "configs/synthetic_table3.py:small"):
    proc = _main(f"--config={config}", "--config.single.data.options.seed=3",
                 f"--workdir={tmp_path / 'W'}")
    assert proc.returncode != 0
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert lines == ["error: --config.single.data.options.seed is not read: the world's options "
                     "have one home, config.world (pass --config.world.seed=... instead)."], lines
    assert not (tmp_path / "W").exists()
  proc = _main("--config=configs/demo.py", "--config.world.seed=3", "--print_config")
  assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.slow
def test_a_missing_input_is_one_error_line_and_leaves_the_workdir_untouched(tmp_path):
  """A data root or checkpoint that is not there fails before the workdir is claimed: one
  `error:` line naming the key and the file, no traceback, no config.json, no lock."""
  workdir = tmp_path / "W"
  empty = tmp_path / "not_cub"
  empty.mkdir()
  for args, named in (
      ((f"--config.data.root={tmp_path / 'no_such_cub'}",), "config.data.root="),
      ((f"--config.data.root={empty}",), f"missing required file: {empty}/images.txt"),
      ((f"--config.data.root={empty}", f"--config.backbone.checkpoint={tmp_path / 'nope'}"),
       "config.backbone.checkpoint=")):
    proc = _main("--config=configs/cub_single.py:runlocal", *args, f"--workdir={workdir}")
    assert proc.returncode != 0
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert lines and all(l.startswith("error: ") for l in lines), proc.stderr[-3000:]
    assert named in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not workdir.exists()
  proc = _main("--config=configs/probe_cub.py", f"--config.data.root={empty}",
               f"--config.masks.path={tmp_path / 'maps_{split}.npy'}", f"--workdir={workdir}")
  assert proc.returncode != 0 and "error: " in proc.stderr and not workdir.exists()
