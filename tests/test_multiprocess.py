"""Two processes on localhost (JAX's distributed runtime, gloo CPU collectives) reproduce the
single-process run: the same global batches, the same training steps, and a checkpoint written by
both processes that both resume from (and that one process resumes from too)."""

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import compile_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 6

# Runs in every process. Prints the first two global batches' example digests (gathered from all
# processes) and trains; the loss trajectory is read back from metrics.jsonl.
_SCRIPT = r"""
import hashlib, json, os, sys
sys.path.insert(0, {root!r})
from metonymy import distributed
if {num_processes} > 1:
  distributed.initialize("127.0.0.1:{port}", {num_processes}, {process_id})
import jax
import numpy as np
from jax.experimental import multihost_utils
from metonymy.training import trainer
from metonymy.training import inputs, sharding
from tests import test_train

config = test_train._config({num_steps})
config.trainer.checkpoint_every_steps = {checkpoint_every}
config.trainer.eval_every_steps = {num_steps}
assert jax.process_count() == {num_processes} and jax.device_count() == {num_processes}

mesh = sharding.make_mesh(config.mesh)
with jax.set_mesh(mesh):
  source, _ = inputs.sources(config.data)
  per_process = config.data.batch_size // jax.process_count()
  it = iter(inputs.train_pipeline(source, config.data, (0.5,) * 3, (0.25,) * 3, per_process,
                                  config.seed))
  digests = []
  for _ in range(2):
    batch = sharding.global_batch(inputs.device_keys(next(it), inputs.TRAIN_KEYS),
                                  sharding.batch_sharding(mesh))
    images = np.asarray(multihost_utils.process_allgather(batch["image"], tiled=True))
    digests.append([hashlib.sha256(x.tobytes()).hexdigest()[:16] for x in images])
if jax.process_index() == 0:
  print("DIGESTS " + json.dumps(digests), flush=True)
if {stop_at_batch}:  # A simulated kill of every process when the trainer asks for this batch.
  real, calls = sharding.global_batch, []
  def dies(*args, **kwargs):
    calls.append(1)
    if len(calls) == {stop_at_batch}:
      raise KeyboardInterrupt("simulated kill")
    return real(*args, **kwargs)
  sharding.global_batch = dies
try:
  trainer.run(config, {workdir!r})
except KeyboardInterrupt:
  print("KILLED", flush=True)
"""


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _launch(workdir: str, num_processes: int, num_steps: int, checkpoint_every: int,
            stop_at_batch: int = 0):
  """Runs the script in `num_processes` processes of one job; returns process 0's stdout."""
  port = _free_port()
  env = compile_cache.process_env(1, JAX_PLATFORMS="cpu")
  procs = [subprocess.Popen(
      [sys.executable, "-c", _SCRIPT.format(root=ROOT, port=port, num_processes=num_processes,
                                            process_id=i, num_steps=num_steps,
                                            checkpoint_every=checkpoint_every, workdir=workdir,
                                            stop_at_batch=stop_at_batch)],
      cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
      for i in range(num_processes)]
  outputs = []
  try:
    for i, proc in enumerate(procs):
      out, err = proc.communicate(timeout=600)
      assert proc.returncode == 0, f"process {i} of {num_processes} failed:\n{err[-4000:]}"
      outputs.append(out)
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
  return outputs[0]


def _single_process_run(workdir: str):
  """The script's single-process run, in this process (one CPU device, as a pytest worker has):
  trains `workdir` and returns its first two global batches' digests, as the script prints them."""
  from metonymy.training import inputs
  from metonymy.training import trainer
  from tests import test_train
  config = test_train._config(STEPS)  # pylint: disable=protected-access
  config.trainer.checkpoint_every_steps = STEPS // 2
  config.trainer.eval_every_steps = STEPS
  source, _ = inputs.sources(config.data)
  batches = iter(inputs.train_pipeline(source, config.data, (0.5,) * 3, (0.25,) * 3,
                                       config.data.batch_size, config.seed))
  digests = [[hashlib.sha256(np.asarray(x, np.float32).tobytes()).hexdigest()[:16]
              for x in next(batches)["image"]] for _ in range(2)]
  trainer.run(config, workdir)
  return digests


def _digests(stdout: str):
  line = [l for l in stdout.splitlines() if l.startswith("DIGESTS ")][-1]
  return json.loads(line[len("DIGESTS "):])


def _losses(workdir: str):
  from tests import test_train
  return test_train._losses(workdir)


@pytest.mark.slow
def test_two_processes_match_one_process_through_a_checkpoint(tmp_path):
  single, multi = str(tmp_path / "single"), str(tmp_path / "multi")
  single_digests = _single_process_run(single)
  # Two processes, killed after step 4 (checkpoint at 3), then a second launch that resumes from
  # the checkpoint both processes wrote (parameters, optimizer state, step, RNG and each
  # process's data position) and replays step 4.
  first_out = _launch(multi, 2, STEPS, checkpoint_every=STEPS // 2, stop_at_batch=STEPS // 2 + 2)
  assert "on 2 device(s)" in first_out and "KILLED" in first_out
  # A copy of the killed run resumes on ONE process: the data position comes from the step.
  shrunk = str(tmp_path / "shrunk")
  shutil.copytree(multi, shrunk)
  second_out = _launch(multi, 2, STEPS, checkpoint_every=STEPS // 2)
  assert f"Resumed from step {STEPS // 2}" in second_out
  shrunk_out = _launch(shrunk, 1, STEPS, checkpoint_every=STEPS // 2)
  assert f"Resumed from step {STEPS // 2}" in shrunk_out and "on 1 device(s)" in shrunk_out

  # The global batch: 4 + 4 examples from two processes are the single process's 8, in order.
  assert _digests(first_out) == single_digests
  assert len(set(single_digests[0])) == 8

  # The train step and the checkpoint round trip: the same trajectory. Two devices reduce the
  # batch in another order than one, so values agree to float32 rounding (the 8-device test
  # measures < 5e-6 relative).
  expected = _losses(single)
  for name, workdir in (("two processes", multi), ("two, then one process", shrunk)):
    got = _losses(workdir)
    assert sorted(got) == sorted(expected) == list(range(1, STEPS + 1)), name
    np.testing.assert_allclose([got[s] for s in range(1, STEPS + 1)],
                               [expected[s] for s in range(1, STEPS + 1)], rtol=2e-5,
                               err_msg=name)
  from tests import test_train
  params_multi, params_single = test_train._params(multi), test_train._params(single)
  import jax
  for a, b in zip(jax.tree_util.tree_leaves(params_multi), jax.tree_util.tree_leaves(params_single)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
  # The evaluation pools the global batch: the part segmentation comes back from the eval step
  # with the maps (each process holds half of it), so the coverage is the single process's.
  evals = {}
  for name, workdir in (("one process", single), ("two processes", multi)):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      evals[name] = [json.loads(line) for line in f if '"eval/parts/coverage"' in line][-1]
  coverage = [k for k in evals["one process"] if k.startswith(("eval/parts/coverage",
                                                               "eval/parts/area_ratio"))]
  assert len(coverage) == 2 + 2 * 5, coverage
  for key in coverage:
    assert evals["two processes"][key] == evals["one process"][key], key
  # Only process 0 writes logs and metrics; both wrote their data-iterator state.
  step_dir = os.path.join(multi, "checkpoints", str(STEPS))
  data_files = sorted(os.listdir(os.path.join(step_dir, "data")))
  assert [f for f in data_files if f.startswith("process_")] == [
      "process_0-of-2.json", "process_1-of-2.json"], data_files
  with open(os.path.join(multi, "metrics.jsonl")) as f:
    logged = [json.loads(line)["step"] for line in f if '"loss"' in line]
  # Each step once, in order: step 4 was logged before the kill and replayed after the resume,
  # and the resume trims the records after the restored step (MetricWriter.trim).
  assert logged == [1, 2, 3, 4, 5, 6], logged


@pytest.mark.slow
def test_single_host_jobs_refuse_several_processes(tmp_path):
  port = _free_port()
  procs = []
  for i in range(2):
    env = compile_cache.process_env(1, JAX_PLATFORMS="cpu",
                                    METONYMY_COORDINATOR=f"127.0.0.1:{port}",
                                    METONYMY_NUM_PROCESSES="2", METONYMY_PROCESS_ID=str(i))
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "metonymy.main", "--config=configs/probe_synthetic.py:tiny",
         f"--workdir={tmp_path}"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True))
  for i, proc in enumerate(procs):
    _, err = proc.communicate(timeout=300)
    assert proc.returncode != 0, f"process {i} ran the probe job"
    assert "runs on one host" in err and f"process {i} of 2" in err, err[-2000:]
  assert not os.path.exists(tmp_path / "results.json")
