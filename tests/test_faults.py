"""Faults a user hits on purpose (issue 13): a run never saves a non-finite state and never
resumes from one or from a checkpoint that does not read, a save that cannot be written ends the
run at once instead of hanging, and a resume repeats no metrics."""

import json

import importlib.util
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metonymy import train
from metonymy.training import checkpointing
from tests import compile_cache

compile_cache.enable()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_FILE = os.path.join(ROOT, "configs", "synthetic_single.py")


def _config(num_steps, heads_lr=None):
  """The runlocal synthetic config (what `--config=configs/synthetic_single.py:runlocal` runs),
  checkpointing every 2 steps."""
  spec = importlib.util.spec_from_file_location("synthetic_single", CONFIG_FILE)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config("runlocal")
  config.trainer.num_steps = num_steps
  config.trainer.checkpoint_every_steps = 2
  config.trainer.eval_every_steps = 1000
  if heads_lr is not None:
    config.optimizer.learning_rates.heads = heads_lr
  return config


def _checkpoint_is_finite(workdir, step):
  """Whether every float leaf of `step`'s params and opt_state is finite (read raw, no target)."""
  import orbax.checkpoint as ocp
  mngr = ocp.CheckpointManager(checkpointing.directory(workdir))
  try:
    restored = mngr.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(), opt_state=ocp.args.StandardRestore()))
  finally:
    mngr.close()
  leaves = jax.tree_util.tree_leaves((restored["params"], restored["opt_state"]))
  return all(np.all(np.isfinite(np.asarray(x))) for x in leaves
             if np.issubdtype(np.asarray(x).dtype, np.inexact))


def _steps(workdir):
  return sorted(checkpointing.manager(workdir).all_steps())


def test_a_non_finite_update_is_never_saved_and_a_saved_one_is_refused(tmp_path, monkeypatch,
                                                                        capsys):
  workdir = str(tmp_path / "run")
  train.run(_config(4), workdir)
  assert _steps(workdir) == [2, 4]

  # An update to Inf (finite loss and gradients before it): stops before step 5 is saved.
  with pytest.raises(train.NonFiniteError,
                     match=r"step 5.*updated params/opt_state.*last good checkpoint is step 4.*"
                           r"lower the learning rates.*learning_rates.heads=1e\+39"):
    train.run(_config(5, heads_lr=1e40), workdir)
  assert _steps(workdir) == [2, 4]
  assert all(_checkpoint_is_finite(workdir, s) for s in _steps(workdir))

  # A non-finite checkpoint written anyway (as older versions did: the check switched off) is
  # refused on resume, moved aside, and the run continues from the newest finite one.
  monkeypatch.setattr(checkpointing, "all_finite", lambda tree: jnp.array(True))
  try:
    train.run(_config(5, heads_lr=1e40), workdir)
  except Exception:  # pylint: disable=broad-except  (evaluating Inf weights may fail)
    pass
  monkeypatch.undo()
  assert _steps(workdir) == [4, 5] and not _checkpoint_is_finite(workdir, 5)
  capsys.readouterr()
  train.run(_config(5), workdir)
  out = capsys.readouterr().out
  assert "refused checkpoint step 5: it holds NaN/Inf values" in out, out
  assert "Resumed from step 4" in out, out
  assert os.path.isdir(os.path.join(workdir, checkpointing.REFUSED_DIR, "5"))
  assert _steps(workdir) == [4, 5]
  assert all(_checkpoint_is_finite(workdir, s) for s in _steps(workdir))


def test_a_save_into_an_unwritable_directory_fails_at_once(tmp_path):
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "checkpoints").write_text("x\n")
  env = dict(os.environ, **compile_cache.ENV)
  proc = subprocess.run(
      [sys.executable, "-m", "metonymy.main", "--config=configs/synthetic_single.py:runlocal",
       f"--workdir={workdir}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode != 0
  assert f"checkpoint directory {workdir / 'checkpoints'} is not a writable directory" in (
      proc.stderr), proc.stderr[-3000:]
  assert (workdir / "checkpoints").read_text() == "x\n"


def _metric_steps(workdir):
  """The step of every metrics.jsonl record that has a loss (one per trained step)."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r["step"] for r in map(json.loads, f) if "loss" in r]


def test_a_truncated_file_in_the_newest_checkpoint_falls_back_to_the_previous(tmp_path, capsys):
  workdir = str(tmp_path / "run")
  train.run(_config(4), workdir)
  params = os.path.join(checkpointing.directory(workdir), "4", "params")
  arrays = [os.path.join(d, f) for d, _, files in os.walk(params) for f in files
            if os.sep + "d" + os.sep in os.path.join(d, f) + os.sep and "ocdbt" in d]
  broken = max(arrays, key=os.path.getsize)
  with open(broken, "r+b") as f:
    f.truncate(100)

  capsys.readouterr()
  train.run(_config(6), workdir)
  out = capsys.readouterr().out
  assert "refused checkpoint step 4: it cannot be read" in out, out
  assert os.path.join("checkpoints", "4", "params") in out, out  # Names the file.
  assert "Resumed from step 2" in out, out
  assert _steps(workdir) == [4, 6]
  kept = os.path.join(workdir, checkpointing.REFUSED_DIR, "4", "params",
                      os.path.relpath(broken, params))
  assert os.path.getsize(kept) == 100  # Left for inspection, untouched.


def test_no_readable_checkpoint_is_an_error_that_moves_nothing(tmp_path):
  workdir = str(tmp_path / "run")
  train.run(_config(2), workdir)
  metadata = os.path.join(checkpointing.directory(workdir), "2", "params", "_METADATA")
  with open(metadata, "w") as f:
    f.write("{")
  with pytest.raises(ValueError, match=r"No checkpoint in .* can be restored.*step 2: it cannot"):
    train.run(_config(4), workdir)
  assert _steps(workdir) == [2]


def test_a_resume_trims_metrics_to_the_restored_step(tmp_path):
  workdir = str(tmp_path / "run")
  train.run(_config(4), workdir)
  # A kill during the save of step 4: the run resumes from step 2 and repeats steps 3 and 4.
  import shutil
  shutil.rmtree(os.path.join(checkpointing.directory(workdir), "4"))
  with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
    f.write('{"step": 5, "lo')  # And a line the kill cut short.
  train.run(_config(4), workdir)
  assert _metric_steps(workdir) == [1, 2, 3, 4]
