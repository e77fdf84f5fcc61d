"""Preemption (issue 16): SIGTERM or SIGUSR1 saves the run at one step boundary on every process
and exits with the requeue status; the rerun ends bit for bit where an uninterrupted run ends.
Time-based checkpoints (config.trainer.checkpoint_every_minutes) are agreed like signals."""

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest

from metonymy import config_checks
from metonymy.training import trainer
from metonymy.training import run_state
from metonymy.training import preemption
from metonymy.training import sharding
from tests.helpers import compile_cache
from tests.helpers import shared_runs
from tests import test_faults

compile_cache.enable()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Subprocess runs: ~40 steps/s on one loaded core, so a signal lands mid-run; the uninterrupted
# run they end at is shared with tests/test_faults.py (tests/helpers/shared_runs.py).
STEPS = shared_runs.SYNTHETIC_SINGLE_STEPS


def _config(num_steps, checkpoint_every_steps=1000, minutes=0.0):
  config = test_faults._config(num_steps)
  config.trainer.checkpoint_every_steps = checkpoint_every_steps
  config.trainer.checkpoint_every_minutes = minutes
  config.trainer.keep_checkpoints = 100
  return config


def _steps(workdir):
  return sorted(run_state.manager(workdir).all_steps())


def _raw_state(workdir, step):
  """Every params and opt_state array of `step` on this process's first device, however many
  processes wrote it (test_faults._raw_state reads single-process checkpoints only)."""
  import orbax.checkpoint as ocp
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  directory = run_state.directory(workdir)
  items = {}
  for name in ("params", "opt_state"):
    tree = ocp.StandardCheckpointer().metadata(f"{directory}/{step}/{name}").item_metadata.tree
    items[name] = ocp.args.StandardRestore(jax.tree_util.tree_map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), tree))
  mngr = ocp.CheckpointManager(directory)
  try:
    restored = mngr.restore(step, args=ocp.args.Composite(**items))
  finally:
    mngr.close()
  return [np.asarray(x) for x in jax.tree_util.tree_leaves(
      (restored["params"], restored["opt_state"]))]


def _assert_same_state(workdir, reference, step):
  got, expected = _raw_state(workdir, step), _raw_state(reference, step)
  assert len(got) > 10
  assert len(got) == len(expected)
  for a, b in zip(got, expected):
    assert a.dtype == b.dtype and np.array_equal(a, b)  # Bit for bit.


# ------------------------------------------------------------------------------------------------
# In one process: a signal raised at a known step.


@pytest.mark.slow
def test_a_signal_saves_the_next_step_raises_preempted_and_the_rerun_matches(tmp_path,
                                                                             monkeypatch):
  reference, workdir = str(tmp_path / "reference"), str(tmp_path / "preempted")
  trainer.run(_config(8), reference)
  before, before_usr1 = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR1)

  real, calls = sharding.global_batch, []
  def signals_at_step_4(*args, **kwargs):  # The trainer builds step k's batch on call k.
    calls.append(1)
    if len(calls) == 4:
      signal.raise_signal(signal.SIGUSR1)
    return real(*args, **kwargs)
  monkeypatch.setattr(sharding, "global_batch", signals_at_step_4)
  with pytest.raises(preemption.Preempted) as raised:
    trainer.run(_config(8), workdir)
  monkeypatch.undo()
  # Step 4 carried the wish; its result is read while step 5 runs, so step 5 is saved.
  assert raised.value.code == preemption.REQUEUE_EXIT_CODE == 75
  assert raised.value.step == 5 and "SIGUSR1" in str(raised.value)
  assert _steps(workdir) == [5]
  assert test_faults._metric_steps(workdir) == [1, 2, 3, 4, 5]
  # On its way out, the preempted run ignores further signals (else one kills it: status -15).
  assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
  signal.signal(signal.SIGTERM, before)
  signal.signal(signal.SIGUSR1, before_usr1)

  trainer.run(_config(8), workdir)
  assert signal.getsignal(signal.SIGTERM) is before  # A finished loop puts the handlers back.
  assert _steps(workdir) == [5, 8]
  _assert_same_state(workdir, reference, 8)
  assert test_faults._metric_steps(workdir) == list(range(1, 9))


@pytest.mark.slow
def test_checkpoint_every_minutes_saves_by_the_clock(tmp_path):
  # Due at every step: a save resets the clock, so the next wish is the step after the save's.
  workdir = str(tmp_path / "timed")
  trainer.run(_config(7, minutes=1e-9), workdir)
  assert _steps(workdir) == [2, 4, 6, 7]
  workdir = str(tmp_path / "off")
  trainer.run(_config(7, minutes=0.0), workdir)
  assert _steps(workdir) == [7]
  assert config_checks.problems(_config(7, minutes=-1.0)) == [
      "config.trainer.checkpoint_every_minutes=-1.0 must be >= 0 (a size or count; 0 means the "
      "default or all)."]


def test_time_wishes_made_before_a_save_are_stale():
  watch = preemption.Watch(checkpoint_every_minutes=1.0, start_step=10)
  due = np.array([0, 1], np.int32)
  assert watch.decide(11, None) == (False, False)  # A loop's first step has no agreed wishes.
  assert watch.decide(12, due) == (False, True)
  watch.saved(12)
  assert watch.decide(13, due) == (False, False)  # Step 12's wish predates step 12's save.
  assert watch.decide(14, due) == (False, True)
  assert watch.decide(15, np.array([1, 0], np.int32)) == (True, False)


# ------------------------------------------------------------------------------------------------
# Real signals to `python -m metonymy.main` subprocesses.

_STARTED = []  # Every run a test starts; one still alive when the test ends is killed.


@pytest.fixture(autouse=True)
def _kill_leftover_runs():
  yield
  while _STARTED:
    proc = _STARTED.pop()
    if proc.poll() is None:
      proc.kill()
      proc.wait()


def _start(workdir, checkpoint_every_steps=1000, env_extra=None, steps=STEPS):
  env = dict(os.environ, PYTHONUNBUFFERED="1", **compile_cache.ENV, **(env_extra or {}))
  proc = subprocess.Popen(
      [sys.executable, "-m", "metonymy.main", "--config=configs/synthetic_single.py:runlocal",
       f"--workdir={workdir}", f"--config.trainer.num_steps={steps}",
       f"--config.trainer.checkpoint_every_steps={checkpoint_every_steps}",
       "--config.trainer.eval_every_steps=1000", "--config.trainer.keep_checkpoints=100"],
      cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
  _STARTED.append(proc)
  lines = queue.Queue()
  threading.Thread(target=lambda: [lines.put(l) for l in proc.stdout] + [lines.put(None)],
                   daemon=True).start()
  return proc, lines


def _signal_when(proc, lines, ready, target=None, timeout=300):
  """Reads the run's output until `ready(step)` holds (step: the last "step N/.." line), sends
  SIGTERM to `target` (default: proc), then SIGTERM and SIGUSR1 every 20 ms until every process
  exited; returns (step at the signal, output lines)."""
  targets = target or [proc]
  output, step, signalled, deadline = [], 0, None, time.monotonic() + timeout
  ended = False  # proc's output ended (the reader's None).
  while time.monotonic() < deadline and any(p.poll() is None for p in targets + [proc]):
    try:
      line = lines.get(timeout=0.001)
    except queue.Empty:
      line = ""
    ended = ended or line is None
    if line:
      output.append(line)
      if line.startswith("step "):
        step = int(line.split()[1].split("/")[0])
    if signalled is None and ready(step):
      signalled = step
      for p in targets:
        p.send_signal(signal.SIGTERM)
    elif signalled is not None:  # Repeated signals during the save corrupt nothing.
      time.sleep(0.02)
      for p in targets:
        if p.poll() is None:
          p.send_signal(signal.SIGUSR1 if len(output) % 2 else signal.SIGTERM)
  for p in targets + [proc]:
    p.wait(timeout=60)
  while not ended:
    line = lines.get(timeout=120)
    if line is None:
      break
    output.append(line)
  assert signalled is not None, "".join(output)[-3000:]
  return signalled, output


def _saved_step(output):
  line = [l for l in output if l.startswith("Preempted (")][-1]
  return int(line.split("saved at step ")[1].split(";")[0])


@pytest.fixture
def reference(synthetic_single_run):
  """The uninterrupted run a preempted one must end at, bit for bit."""
  assert _steps(synthetic_single_run.workdir) == [STEPS]
  return synthetic_single_run.workdir


def _finish_and_compare(workdir, reference, resumed_from):
  proc, lines = _start(workdir)
  proc.wait(timeout=300)
  out = "".join(iter(lambda: lines.get(timeout=120), None))
  assert proc.returncode == 0, out[-3000:]
  assert f"Resumed from step {resumed_from}" in out, out[-3000:]
  _assert_same_state(workdir, reference, STEPS)
  assert test_faults._metric_steps(workdir) == list(range(1, STEPS + 1))
  assert not os.path.exists(os.path.join(workdir, "run.lock"))


@pytest.mark.slow
def test_sigterm_at_a_random_step_saves_there_requeues_and_the_rerun_matches(tmp_path,
                                                                              reference):
  at = int(np.random.default_rng().integers(3, STEPS - 10))
  workdir = str(tmp_path / "preempted")
  proc, lines = _start(workdir)
  signalled, output = _signal_when(proc, lines, lambda step: step >= at)
  log = "".join(output)[-3000:]
  assert proc.returncode == preemption.REQUEUE_EXIT_CODE, log
  saved = _saved_step(output)
  # One checkpoint, at a step boundary after the signal, the last step the run logged.
  assert _steps(workdir) == [saved] and signalled < saved < STEPS, (signalled, log)
  assert test_faults._metric_steps(workdir) == list(range(1, saved + 1)), log
  assert not any("tmp" in n for n in os.listdir(run_state.directory(workdir)))
  _finish_and_compare(workdir, reference, saved)


@pytest.mark.slow
def test_sigterm_during_an_in_flight_async_save(tmp_path, reference):
  workdir = str(tmp_path / "preempted")
  proc, lines = _start(workdir, checkpoint_every_steps=2)
  in_flight = []
  def saving(step):
    if step >= 6 and test_faults._saving(workdir):
      in_flight.append(step)
      return True
    return False
  signalled, output = _signal_when(proc, lines, saving)
  log = "".join(output)[-3000:]
  assert in_flight, log
  assert proc.returncode == preemption.REQUEUE_EXIT_CODE, log
  saved = _saved_step(output)
  steps = _steps(workdir)
  # The in-flight save finished, then the preemption's own; every checkpoint is final.
  assert steps[-1] == saved > signalled and len(steps) >= 3, (steps, log)
  assert not any("tmp" in n for n in os.listdir(run_state.directory(workdir)))
  for step in steps:
    assert test_faults._checkpoint_is_finite(workdir, step)
  _finish_and_compare(workdir, reference, saved)


# ------------------------------------------------------------------------------------------------
# Two processes on localhost (gloo), the signal to one of them.


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _start_two(workdir, minutes_on_process_1=0.0):
  """Process 0 and 1 of one job; process 1 may have its own checkpoint_every_minutes (its clock
  alone then asks for time-based saves, which both processes must still make together)."""
  port, procs = _free_port(), []
  for i in (0, 1):
    env = compile_cache.process_env(1, PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu",
                                    METONYMY_COORDINATOR=f"127.0.0.1:{port}",
                                    METONYMY_NUM_PROCESSES="2", METONYMY_PROCESS_ID=str(i))
    extra = [f"--config.trainer.checkpoint_every_minutes={minutes_on_process_1 if i else 0.0}"]
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "metonymy.main", "--config=configs/synthetic_single.py:runlocal",
         f"--workdir={workdir}", f"--config.trainer.num_steps={STEPS}",
         "--config.trainer.checkpoint_every_steps=1000", "--config.trainer.eval_every_steps=1000",
         "--config.trainer.keep_checkpoints=100"] + extra,
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        bufsize=1))
    _STARTED.append(procs[-1])
  lines, other = queue.Queue(), []  # Process 1's output is read too, so its pipe never fills.
  threading.Thread(target=lambda: [lines.put(l) for l in procs[0].stdout] + [lines.put(None)],
                   daemon=True).start()
  threading.Thread(target=lambda: other.extend(procs[1].stdout), daemon=True).start()
  return procs, lines, other


def _run_two(workdir):
  """Runs both processes to the end; returns process 0's output."""
  procs, lines, other = _start_two(workdir)
  for proc in procs:
    proc.wait(timeout=300)
  out = "".join(iter(lambda: lines.get(timeout=120), None))
  time.sleep(1)
  assert [p.returncode for p in procs] == [0, 0], out[-3000:] + "".join(other)[-3000:]
  return out


# ------------------------------------------------------------------------------------------------
# The launch scripts requeue on the status, and only on it (srun, scontrol, gcloud faked).


def _fake_commands(tmp_path, **scripts):
  """A PATH directory holding each `name=body` as an executable bash script; calls.log records
  every call's command and arguments."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir(exist_ok=True)
  for name, body in scripts.items():
    path = bin_dir / name
    path.write_text(f'#!/usr/bin/env bash\necho "{name} $*" >> {tmp_path}/calls.log\n{body}\n')
    path.chmod(0o755)
  return dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")


def _calls(tmp_path):
  log = tmp_path / "calls.log"
  return log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("run_status,requeued,status", [(75, True, 0), (0, False, 0),
                                                         (1, False, 1)])
def test_the_slurm_script_requeues_on_the_requeue_status(tmp_path, run_status, requeued, status):
  env = _fake_commands(tmp_path, srun=f"exit {run_status}", scontrol="exit 0")
  env.update(SLURM_JOB_ID="4242", SLURM_RESTART_COUNT="1")
  script = os.path.join(ROOT, "launch", "slurm_gpu.sbatch")
  proc = subprocess.run(["bash", script, "configs/x.py", "--workdir=/w"], env=env, cwd=tmp_path,
                        capture_output=True, text=True, timeout=60)
  assert proc.returncode == status, proc.stdout + proc.stderr
  calls = _calls(tmp_path)
  assert calls[0].startswith("srun --kill-on-bad-exit=1 python -m metonymy.main "
                             "--config=configs/x.py --workdir=/w"), calls
  assert ("scontrol requeue 4242" in calls) == requeued, calls
  with open(script) as f:
    directives = f.read()
  assert "#SBATCH --signal=USR1@" in directives and "#SBATCH --requeue" in directives
  assert f"requeue_status={preemption.REQUEUE_EXIT_CODE}" in directives


def test_the_tpu_script_restarts_a_preempted_run_when_the_slice_is_back(tmp_path):
  # First run preempted (75), then the connection lost (255), then finished; the slice is
  # READY throughout. Without --restart the first 75 ends the script.
  counter = tmp_path / "runs"
  env = _fake_commands(tmp_path, gcloud=f"""
if [[ "$*" == *describe* ]]; then echo READY; exit 0; fi
n=$(cat {counter} 2>/dev/null || echo 0); echo $((n + 1)) > {counter}
case $n in 0) exit 75;; 1) exit 255;; *) exit 0;; esac""")
  script = os.path.join(ROOT, "launch", "tpu_pod.sh")
  # --no-sync: the package is on the workers already (tests/test_launch.py checks the sync).
  proc = subprocess.run(["bash", script, "--restart=5", "--no-sync", "tpu", "zone", "configs/x.py",
                         "--w=1"], env=env, capture_output=True, text=True, timeout=60)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  runs = [c for c in _calls(tmp_path) if " ssh " in c]
  assert len(runs) == 3, runs
  assert "python3 -m metonymy.main --config=configs/x.py --w=1" in "\n".join(_calls(tmp_path))
  counter.unlink()
  proc = subprocess.run(["bash", script, "--no-sync", "tpu", "zone", "configs/x.py"], env=env,
                        capture_output=True, text=True, timeout=60)
  assert proc.returncode == preemption.REQUEUE_EXIT_CODE, proc.stdout + proc.stderr


@pytest.mark.slow
def test_two_processes_jax_notice_before_the_loop_then_a_signal_to_one_mid_run(tmp_path):
  """One two-process job preempted twice, then finished: it ends where an uninterrupted one does.
  (One job, not one per preemption: each two-process launch costs the suite ~25 s of CPU.)"""
  reference = str(tmp_path / "reference")
  _run_two(reference)

  # 1. Before the loop, SIGTERM is JAX's: its coordination service's notifier (installed by
  # jax.distributed.initialize) takes it, and reached_preemption_sync_point stops both processes
  # at one step. Process 0 prints "Weight decay" after the collective model set-up, so process 1
  # is past jax.distributed.initialize by then.
  workdir = str(tmp_path / "preempted")
  procs, lines, other = _start_two(workdir)
  output = []
  while (line := lines.get(timeout=300)) is not None:
    output.append(line)
    if line.startswith("Weight decay"):
      procs[1].send_signal(signal.SIGTERM)
  for proc in procs:
    proc.wait(timeout=120)
  time.sleep(1)
  log = "".join(output)[-3000:] + "\n--- process 1 ---\n" + "".join(other)[-3000:]
  assert [p.returncode for p in procs] == [preemption.REQUEUE_EXIT_CODE] * 2, log
  first = _saved_step(output)
  assert "JAX's preemption notice" in log and f"saved at step {first};" in "".join(other), log
  assert _steps(workdir) == [first], log
  assert first <= STEPS - 16, (first, log)  # Room for the second preemption below.

  # 2. The rerun resumes there; mid-run a signal to process 1 alone, whose own clock also asks
  # for timed saves, saves the same step on both processes.
  at = first + int(np.random.default_rng().integers(3, STEPS - 12 - first))
  procs, lines, other = _start_two(workdir, minutes_on_process_1=0.002)  # ~0.1 s: timed saves.
  signalled, output = _signal_when(procs[0], lines, lambda step: step >= at, target=[procs[1]],
                                   timeout=150)
  time.sleep(1)  # The reader thread drains process 1's pipe.
  other = "".join(other)
  log = "".join(output)[-3000:] + "\n--- process 1 ---\n" + other[-3000:]
  assert f"Resumed from step {first}" in "".join(output), log
  assert [p.returncode for p in procs] == [preemption.REQUEUE_EXIT_CODE] * 2, log
  saved = _saved_step(output)  # Process 0's, which got no signal.
  # The first SIGTERM and a repeated SIGUSR1 can both be pending when the main thread next runs
  # Python code (blocked in a collective on a busy machine); CPython then runs the handlers in
  # signal-number order, USR1 (10) before TERM (15). Either name says process 1 got the signal.
  assert re.search(r"Process 1: Preempted \((SIGTERM|SIGUSR1)", other), log
  assert f"saved at step {saved};" in other, log
  steps = _steps(workdir)
  assert steps[-1] == saved > signalled, (steps, log)
  # Process 1's clock asked for saves; both processes made them (else the save would hang).
  assert len([s for s in steps if s > first]) >= 2, (steps, log)
  data = sorted(os.listdir(os.path.join(run_state.directory(workdir), str(saved), "data")))
  assert [f for f in data if f.startswith("process_")] == [
      "process_0-of-2.json", "process_1-of-2.json"], data

  # 3. The rerun finishes bit for bit where the uninterrupted job ended.
  out = _run_two(workdir)
  assert f"Resumed from step {saved}" in out, out[-3000:]
  _assert_same_state(workdir, reference, STEPS)
  assert test_faults._metric_steps(workdir) == list(range(1, STEPS + 1))
