"""A gs:// workdir against a real GCS API (gcp-storage-emulator on 127.0.0.1, tests/helpers/gcs_emulator.py),
as a TPU-pod user runs it: `python -m metonymy.main ... --workdir=gs://bucket/run` trains,
checkpoints, is killed, resumes and ends bit for bit where an uninterrupted run ends; the probe
reads that run's part masks from gs://; --print_config and a busy workdir's refusal. No local
`gs:` folder ever appears (the bug this guards: os.path joins of a URL)."""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from metonymy.workdir import Workdir
from tests.helpers import gcs_emulator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 120  # Long enough for the kill to land between two checkpoints.
TRAIN = [f"--config={ROOT}/configs/synthetic_single.py:runlocal", f"--config.trainer.num_steps={STEPS}",
         "--config.trainer.checkpoint_every_steps=20", f"--config.trainer.eval_every_steps={STEPS}",
         "--config.trainer.keep_checkpoints=10"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gcs():
  pytest.importorskip("gcp_storage_emulator")
  pytest.importorskip("gcsfs")
  with gcs_emulator.serving("bucket") as env:
    yield env


def _fresh_path(url):
  """epath.Path(url) with gcsfs's listing cache dropped (another process wrote there)."""
  from metonymy.workdir import layout
  layout.refresh(url)
  return layout.as_path(url)


def _main(args, cwd, env, timeout=600):
  return subprocess.run([sys.executable, "-m", "metonymy.main", *args], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=timeout)


def _env(gcs):
  env = dict(os.environ, **gcs)
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  return env


def _params(url):
  """The final checkpoint's parameters of the gs:// run at `url`, as host arrays."""
  from metonymy import loading
  _fresh_path(url)
  trained = loading.load_trained_part_model(url)
  return trained.meta["step"], [np.asarray(x) for x in jax.tree_util.tree_leaves(trained.params)]


def _assert_no_local_gs_folder(cwd):
  assert not any(name.startswith("gs:") for name in os.listdir(cwd)), os.listdir(cwd)


def test_print_config_with_a_gs_workdir_writes_nothing(gcs, tmp_path):
  proc = _main([*TRAIN, "--workdir=gs://bucket/printed", "--print_config"], tmp_path, _env(gcs))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f"num_steps: {STEPS}" in proc.stdout
  assert not _fresh_path("gs://bucket/printed").exists()
  _assert_no_local_gs_folder(tmp_path)


def test_train_kill_resume_and_probe_on_gs(gcs, tmp_path):
  env = _env(gcs)
  # The uninterrupted run, checkpointed at its end only (the killed run's checkpoints are the
  # ones that must land on gs:// mid-run; each costs seconds against the emulator).
  proc = _main([*TRAIN, "--config.trainer.checkpoint_every_steps=1000",
                "--workdir=gs://bucket/reference"], tmp_path, env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  reference = _fresh_path("gs://bucket/reference")
  for name in ("config.json", "model.json", "metrics.jsonl.d", "checkpoints", "backbone",
               "tensorboard", "images", "report.md"):
    assert (reference / name).exists(), name
  assert not (reference / "run.lock").exists()  # Released at the end.

  # Killed (SIGKILL: no save, no cleanup) once a checkpoint is final on gs://, then resumed.
  run = subprocess.Popen([sys.executable, "-m", "metonymy.main", *TRAIN,
                          "--workdir=gs://bucket/killed"], cwd=tmp_path, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  deadline = time.time() + 300
  checkpoints = "gs://bucket/killed/checkpoints"
  while time.time() < deadline and run.poll() is None:
    found = _fresh_path(checkpoints)
    # On an object store Orbax marks a finished checkpoint with commit_success.txt (no rename).
    if found.exists() and any(p.name.isdigit() and (p / "commit_success.txt").exists()
                              for p in found.iterdir()):
      break
    time.sleep(0.2)
  killed_mid_run = run.poll() is None
  run.send_signal(signal.SIGKILL)
  run.communicate(timeout=60)
  assert killed_mid_run, "the run ended before a checkpoint was seen on gs://"
  # The lock of the killed process stays: same host, PID gone, so the rerun takes it over.
  assert _fresh_path("gs://bucket/killed/run.lock").exists()
  proc = _main([*TRAIN, "--workdir=gs://bucket/killed"], tmp_path, env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "Resumed from step" in proc.stdout, proc.stdout[-2000:]

  step, expected = _params("gs://bucket/reference")
  got_step, got = _params("gs://bucket/killed")
  assert step == got_step == STEPS
  assert len(got) == len(expected)
  for a, b in zip(got, expected):
    assert a.dtype == b.dtype and np.array_equal(a, b)  # Bit for bit.
  _fresh_path("gs://bucket/killed")
  # On gs:// metrics.jsonl is metrics.jsonl.d/<n>.jsonl, one object per upload, read in order.
  records = [json.loads(line) for _, _, line in Workdir("gs://bucket/killed").metric_lines()]
  steps = [r["step"] for r in records if "loss" in r]
  assert steps == sorted(set(steps)) and steps[-1] == STEPS  # Trimmed: no step twice.

  # The probe reads the run's part masks from gs:// and writes its report there.
  proc = _main([f"--config={ROOT}/configs/probe_synthetic.py:tiny", "--config.masks.source=stage1",
                "--config.masks.path=gs://bucket/reference", "--workdir=gs://bucket/probe"],
               tmp_path, env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = json.loads(_fresh_path("gs://bucket/probe/results.json").read_text())
  assert results["masks"]["source"] == "stage1"
  seed0 = next(iter(results["backbones"].values()))["seeds"][0]
  assert seed0["part_names"] == [f"part {k + 1}" for k in range(5)]  # The run's K = 5 parts.
  assert results["ps_late"] is not None and results["causal_leakage_early"] == 0.0
  assert _fresh_path("gs://bucket/probe/report.md").exists()
  _assert_no_local_gs_folder(tmp_path)


def test_a_busy_gs_workdir_is_refused_naming_the_holder_and_the_way_out(gcs, tmp_path):
  lock = _fresh_path("gs://bucket/busy/run.lock")
  lock.parent.mkdir(parents=True, exist_ok=True)
  holder = {"host": "tpu-worker-7", "pid": 4242, "start_time": "1", "started": "earlier",
            "command": "python -m metonymy.main ..."}
  lock.write_text(json.dumps(holder))
  proc = _main([*TRAIN, "--workdir=gs://bucket/busy"], tmp_path, _env(gcs))
  assert proc.returncode != 0
  error = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert len(error) == 1, proc.stderr[-3000:]
  assert "process 4242 on host tpu-worker-7" in error[0]
  assert "gcloud storage rm gs://bucket/busy/run.lock" in error[0]
  assert json.loads(_fresh_path("gs://bucket/busy/run.lock").read_text()) == holder
  assert not _fresh_path("gs://bucket/busy/config.json").exists()
  _assert_no_local_gs_folder(tmp_path)
