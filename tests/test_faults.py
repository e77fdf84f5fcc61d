"""Faults a user hits on purpose (issue 13): a run never saves a non-finite state and never
resumes from one or from a checkpoint that does not read, a save that cannot be written ends the
run at once instead of hanging, and a resume repeats no metrics."""

import json

import importlib.util
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metonymy.training import trainer
from metonymy.training import run_state
from metonymy.workdir import layout as workdir_layout
from tests.helpers import compile_cache
from tests.helpers import shared_runs

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
  mngr = ocp.CheckpointManager(run_state.directory(workdir))
  try:
    restored = mngr.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(), opt_state=ocp.args.StandardRestore()))
  finally:
    mngr.close()
  leaves = jax.tree_util.tree_leaves((restored["params"], restored["opt_state"]))
  return all(np.all(np.isfinite(np.asarray(x))) for x in leaves
             if np.issubdtype(np.asarray(x).dtype, np.inexact))


def _steps(workdir):
  return sorted(run_state.manager(workdir).all_steps())


def _copy(run, tmp_path):
  """Its own copy of a shared finished run (tests/helpers/shared_runs.py), to break or continue."""
  workdir = str(tmp_path / "run")
  shutil.copytree(run.workdir, workdir)
  return workdir


@pytest.mark.slow
def test_a_non_finite_update_is_never_saved_and_a_saved_one_is_refused(tmp_path, monkeypatch,
                                                                        capsys,
                                                                        trained_four_steps_run):
  workdir = _copy(trained_four_steps_run, tmp_path)
  assert _steps(workdir) == [2, 4]

  # An update to Inf (finite loss and gradients before it): stops before step 5 is saved.
  with pytest.raises(trainer.NonFiniteError,
                     match=r"step 5.*updated params/opt_state.*last good checkpoint is step 4.*"
                           r"lower the learning rates.*learning_rates.heads=1e\+39"):
    trainer.run(_config(5, heads_lr=1e40), workdir)
  assert _steps(workdir) == [2, 4]
  assert all(_checkpoint_is_finite(workdir, s) for s in _steps(workdir))

  # A non-finite checkpoint written anyway (as older versions did: the check switched off) is
  # refused on resume, moved aside, and the run continues from the newest finite one.
  monkeypatch.setattr(run_state, "all_finite", lambda tree: jnp.array(True))
  try:
    trainer.run(_config(5, heads_lr=1e40), workdir)
  except Exception:  # pylint: disable=broad-except  (evaluating Inf weights may fail)
    pass
  monkeypatch.undo()
  assert _steps(workdir) == [4, 5] and not _checkpoint_is_finite(workdir, 5)
  capsys.readouterr()
  trainer.run(_config(5), workdir)
  out = capsys.readouterr().out
  assert "refused checkpoint step 5: it holds NaN/Inf values" in out, out
  assert "Resumed from step 4" in out, out
  assert os.path.isdir(os.path.join(workdir, workdir_layout.REFUSED_DIR, "5"))
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


@pytest.mark.slow
def test_a_truncated_file_in_the_newest_checkpoint_falls_back_to_the_previous(
    tmp_path, capsys, trained_four_steps_run):
  workdir = _copy(trained_four_steps_run, tmp_path)
  params = os.path.join(run_state.directory(workdir), "4", "params")
  arrays = [os.path.join(d, f) for d, _, files in os.walk(params) for f in files
            if os.sep + "d" + os.sep in os.path.join(d, f) + os.sep and "ocdbt" in d]
  broken = max(arrays, key=os.path.getsize)
  with open(broken, "r+b") as f:
    f.truncate(100)

  capsys.readouterr()
  trainer.run(_config(6), workdir)
  out = capsys.readouterr().out
  assert "refused checkpoint step 4: it cannot be read" in out, out
  assert os.path.join("checkpoints", "4", "params") in out, out  # Names the file.
  assert "Resumed from step 2" in out, out
  assert _steps(workdir) == [4, 6]
  kept = os.path.join(workdir, workdir_layout.REFUSED_DIR, "4", "params",
                      os.path.relpath(broken, params))
  assert os.path.getsize(kept) == 100  # Left for inspection, untouched.


@pytest.mark.slow
def test_no_readable_checkpoint_is_an_error_that_moves_nothing(tmp_path):
  workdir = str(tmp_path / "run")
  trainer.run(_config(2), workdir)
  metadata = os.path.join(run_state.directory(workdir), "2", "params", "_METADATA")
  with open(metadata, "w") as f:
    f.write("{")
  with pytest.raises(ValueError, match=r"No checkpoint in .* can be restored.*step 2: it cannot"):
    trainer.run(_config(4), workdir)
  assert _steps(workdir) == [2]


def test_a_resume_trims_metrics_to_the_restored_step(tmp_path, trained_four_steps_run):
  workdir = _copy(trained_four_steps_run, tmp_path)
  # A kill during the save of step 4: the run resumes from step 2 and repeats steps 3 and 4.
  shutil.rmtree(os.path.join(run_state.directory(workdir), "4"))
  with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
    f.write('{"step": 5, "lo')  # And a line the kill cut short.
  trainer.run(_config(4), workdir)
  assert _metric_steps(workdir) == [1, 2, 3, 4]


# ------------------------------------------------------------------------------------------------
# Repeated SIGKILLs: a run killed at random moments (at a step, during a checkpoint save, during
# start-up) and resumed each time ends with exactly the parameters of an uninterrupted run.

_KILL_STEPS = shared_runs.SYNTHETIC_SINGLE_STEPS  # The uninterrupted run's (reference).


def _start(workdir):
  import queue
  import threading
  env = dict(os.environ, PYTHONUNBUFFERED="1", **compile_cache.ENV)
  proc = subprocess.Popen(
      [sys.executable, "-m", "metonymy.main", "--config=configs/synthetic_single.py:runlocal",
       f"--workdir={workdir}", f"--config.trainer.num_steps={_KILL_STEPS}",
       "--config.trainer.checkpoint_every_steps=2", "--config.trainer.eval_every_steps=1000"],
      cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
  lines = queue.Queue()
  threading.Thread(target=lambda: [lines.put(l) for l in proc.stdout] + [lines.put(None)],
                   daemon=True).start()
  return proc, lines


def _saving(workdir):
  """Whether a checkpoint is being written (Orbax's temporary step directory exists)."""
  try:
    return any("tmp" in name for name in os.listdir(run_state.directory(workdir)))
  except FileNotFoundError:
    return False


def _raw_state(workdir, step):
  import orbax.checkpoint as ocp
  mngr = ocp.CheckpointManager(run_state.directory(workdir))
  try:
    restored = mngr.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(), opt_state=ocp.args.StandardRestore()))
  finally:
    mngr.close()
  return [np.asarray(x) for x in jax.tree_util.tree_leaves(
      (restored["params"], restored["opt_state"]))]


def _run_and_kill(workdir, moment, rng, log):
  """Starts the run and SIGKILLs it at `moment` ("step", "save" or "startup"); returns what was
  happening at the kill, or None if the run finished first."""
  import queue
  import signal
  import time
  proc, lines = _start(workdir)
  output, resumed, step, deadline = [], 0, 0, time.monotonic() + 300
  ahead = int(rng.integers(1, 7))  # Steps past the resumed one before a "step"/"save" kill.
  startup_delay = float(rng.uniform(0.5, 3.0))
  started = time.monotonic()
  while time.monotonic() < deadline:
    try:
      line = lines.get(timeout=0.001)
    except queue.Empty:
      line = ""
    if line is None:
      break
    if line:
      output.append(line)
      if line.startswith("Resumed from step "):
        resumed = int(line.split()[3])
      if line.startswith("step "):
        step = int(line.split()[1].split("/")[0])
    fire = ((moment == "step" and step >= resumed + ahead) or
            (moment == "save" and step >= resumed + ahead and _saving(workdir)) or
            (moment == "startup" and time.monotonic() - started > startup_delay))
    if fire:
      if moment == "step":
        time.sleep(float(rng.uniform(0, 0.03)))
      during_save = _saving(workdir)
      proc.send_signal(signal.SIGKILL)
      proc.wait()
      log.append(f"killed ({moment}) after step {step}, resumed from {resumed}"
                 f"{', during a save' if during_save else ''}")
      return during_save
  proc.wait(timeout=60)
  assert proc.returncode == 0, "".join(output)[-4000:]
  log.append(f"not killed ({moment}): finished, resumed from {resumed}")
  return None


@pytest.mark.slow
def test_repeated_sigkills_resume_to_the_uninterrupted_result(tmp_path, synthetic_single_run):
  import time
  start = time.monotonic()
  reference = synthetic_single_run.workdir
  assert _steps(reference) == [_KILL_STEPS]  # Checkpointed at its end only; the killed run every 2.
  workdir = str(tmp_path / "killed")
  rng = np.random.default_rng(13)
  log, kills, during_saves = [], 0, 0
  for moment in ("startup", "step", "save", "step", "save", "step", "save"):
    during_save = _run_and_kill(workdir, moment, rng, log)
    if during_save is not None:
      kills += 1
      during_saves += during_save
  proc, lines = _start(workdir)  # The final resume, to the end.
  assert proc.wait(timeout=300) == 0
  elapsed = time.monotonic() - start
  summary = f"{kills} kills ({during_saves} during a save) in {elapsed:.0f} s: {log}"
  print(summary)
  assert kills >= 5 and during_saves >= 2, summary

  got, expected = _raw_state(workdir, _KILL_STEPS), _raw_state(reference, _KILL_STEPS)
  assert len(got) == len(expected)
  for a, b in zip(got, expected):
    assert a.dtype == b.dtype and np.array_equal(a, b), summary  # Bit for bit.
  assert _metric_steps(workdir) == list(range(1, _KILL_STEPS + 1)), summary
  assert not os.path.exists(os.path.join(workdir, "run.lock"))
