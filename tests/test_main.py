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


def test_the_command_line_says_what_it_can_run():
  """--help lists every config with its first docstring line (exit 0); no argument is a usage
  error (exit 2) with the same list; a mistyped config or key gets the nearest names (exit 2)."""
  proc = _main("--help")
  assert proc.returncode == 0, proc.stderr[-2000:]
  configs = sorted(f for f in os.listdir(os.path.join(ROOT, "configs")) if f.endswith(".py"))
  for name in configs:
    assert f"configs/{name}" in proc.stdout, name
  assert "The end-to-end demo on the synthetic parts world" in proc.stdout
  bare = _main()
  assert bare.returncode == 2 and "configs/demo.py" in bare.stderr
  typo = _main("--config=configs/demoo.py", "--workdir=/tmp/unused")
  assert typo.returncode == 2
  assert typo.stderr.strip().splitlines() == [
      "error: no config file configs/demoo.py: did you mean configs/demo.py? `python -m "
      "metonymy.main --help` lists them all."]
  key = _main("--config=configs/demo.py", "--config.single.trainer.num_step=3", "--print_config")
  assert key.returncode == 2 and "Did you mean 'num_steps'" in key.stderr, key.stderr[-2000:]


def test_the_data_command_lists_every_subcommand_and_world_check_its_flags():
  data = subprocess.run([sys.executable, "-m", "metonymy.data", "--help"], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)
  assert data.returncode == 0
  for command in ("check", "world-check", "export-synthetic", "make-fixture"):
    assert command in data.stdout, command
  world = subprocess.run([sys.executable, "-m", "metonymy.data", "world-check", "--help"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert world.returncode == 0, world.stderr[-2000:]
  for flag in ("--config", "--backbone", "--split", "--images", "--output"):
    assert flag in world.stdout, flag


def test_the_probe_job_refuses_a_missing_backbone_before_writing_anything(tmp_path):
  """The benchmark's own refusal of a backbone without a checkpoint comes from the preflight:
  one line, the workdir never created, and the corrected rerun is not taken for another
  config's run."""
  from metonymy.data import fixtures
  root = fixtures.make_cub(tmp_path / "cub").dataset_dir
  workdir = tmp_path / "W"
  proc = _main("--config=configs/probe_cub.py", f"--config.data.root={root}",
               "--config.masks.source=ground_truth", f"--workdir={workdir}")
  assert proc.returncode != 0
  errors = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and "config.backbone.checkpoint is empty" in errors[0], proc.stderr
  assert "Traceback" not in proc.stderr
  assert not workdir.exists()
