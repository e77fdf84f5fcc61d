"""One run per workdir, and only a run of the workdir's own config (issue 13, items 2 and 3)."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from metonymy.workdir import claim as workdir_claim
from tests.helpers import compile_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _main(*args, timeout=300):
  env = dict(os.environ, **compile_cache.ENV)
  return subprocess.run([sys.executable, "-m", "metonymy.main", *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=timeout)


def _write_lock(workdir, **holder):
  path = os.path.join(workdir, workdir_claim.LOCK_FILE)
  with open(path, "w") as f:
    json.dump(holder, f)
  return path


def test_a_second_claim_is_refused_naming_the_holder_and_a_released_lock_is_free(tmp_path):
  lock = workdir_claim.acquire(str(tmp_path))
  with pytest.raises(workdir_claim.WorkdirBusyError,
                     match=rf"in use by another run: process {os.getpid()} on host "
                           rf"{socket.gethostname()}"):
    workdir_claim.acquire(str(tmp_path))
  lock.release()
  assert not os.path.exists(tmp_path / workdir_claim.LOCK_FILE)
  workdir_claim.acquire(str(tmp_path)).release()


def test_a_crashed_runs_lock_is_taken_over(tmp_path):
  gone = subprocess.Popen([sys.executable, "-c", "pass"])
  gone.wait()
  _write_lock(tmp_path, host=socket.gethostname(), pid=gone.pid, start_time="1")
  lock = workdir_claim.acquire(str(tmp_path))  # Same host, PID gone: stale.
  assert lock.holder["pid"] == os.getpid()
  lock.release()

  # Another host: only the heartbeat's age tells.
  path = _write_lock(tmp_path, host="elsewhere", pid=1)
  with pytest.raises(workdir_claim.WorkdirBusyError, match=r"process 1 on host elsewhere"):
    workdir_claim.acquire(str(tmp_path))
  old = time.time() - workdir_claim.STALE_S - 60
  os.utime(path, (old, old))
  workdir_claim.acquire(str(tmp_path)).release()


def test_a_reused_pid_does_not_keep_a_stale_lock(tmp_path):
  # This process's PID, but recorded with another start time: the PID was reused.
  _write_lock(tmp_path, host=socket.gethostname(), pid=os.getpid(), start_time="-1")
  workdir_claim.acquire(str(tmp_path)).release()


def test_config_differences_name_the_keys_that_decide_the_files():
  saved = {"job": "train", "model": {"name": "stage1", "num_parts": 5},
           "backbone": {"preset": "vit_tiny_test", "image_size": 32},
           "trainer": {"num_steps": 40}}
  resumed = json.loads(json.dumps(saved))
  resumed["trainer"]["num_steps"] = 41  # May change between a run and its resume.
  assert workdir_claim.config_differences(saved, resumed) == []
  other = json.loads(json.dumps(saved))
  other["model"].update(name="two_stage", num_parts=8, stage2={"mask": "hard"})
  assert workdir_claim.config_differences(saved, other) == [
      'model.name: "stage1" -> "two_stage"', "model.num_parts: 5 -> 8",
      'model.stage2: "<absent>" -> {"mask": "hard"}']


@pytest.mark.slow
def test_main_refuses_a_locked_workdir_at_once(tmp_path):
  lock = workdir_claim.acquire(str(tmp_path))
  try:
    start = time.perf_counter()
    proc = _main("--config=configs/synthetic_single.py:runlocal", f"--workdir={tmp_path}")
    seconds = time.perf_counter() - start
  finally:
    lock.release()
  assert proc.returncode != 0
  assert f"in use by another run: process {os.getpid()}" in proc.stderr, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert set(os.listdir(tmp_path)) == set(), os.listdir(tmp_path)  # Nothing written.
  assert seconds < 60, seconds


@pytest.mark.slow
def test_main_refuses_another_configs_workdir_and_keeps_its_files(tmp_path,
                                                                  synthetic_single_run):
  # A finished synthetic_single.py:runlocal workdir (tests/helpers/shared_runs.py), copied: were the
  # refusal to write, it would write into the copy.
  workdir = tmp_path / "single"
  shutil.copytree(synthetic_single_run.workdir, workdir)
  assert json.loads((workdir / "config.json").read_text())["model"]["name"] == "stage1"
  before = {name: (workdir / name).read_bytes() for name in ("config.json", "model.json")}

  proc = _main("--config=configs/synthetic_hard.py:runlocal", f"--workdir={workdir}")
  assert proc.returncode != 0
  message = proc.stderr.strip().splitlines()[-1]
  assert message.startswith(f"error: {workdir} holds a run of another config"), message
  assert 'model.name: "stage1" -> "two_stage"' in message, message
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert {name: (workdir / name).read_bytes() for name in before} == before
  assert not (workdir / workdir_claim.LOCK_FILE).exists()


def test_training_needs_a_workdir():
  proc = _main("--config=configs/synthetic_single.py:runlocal", timeout=120)
  assert proc.returncode != 0
  assert "--workdir=DIR is required for the 'train' job" in proc.stderr, proc.stderr[-3000:]
