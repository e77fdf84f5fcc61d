"""What a run records about its own files is relative to its workdir (layout.record_path), so a
demo or Table-3 workdir loads from wherever it is: moved on local disk (`mv`), or written on
gs:// (the demo runs in a local staging folder copied back when it ends). From there every
trained sub-run loads (`loading.load_trained_part_model`), the probe reads one's part masks
(`masks.source=stage1`), `export_part_maps` exports one's part maps, and no file under the
workdir names where it was written (the old location, the staging folder).

One run per fixture, shared by the assertions: the runs are the expensive part. The moved runs
are tests/test_demo.py's and tests/test_table3.py's (tests/helpers/shared_runs.py: each is written in
one folder and moved to another before any test reads it).
"""

import os
import shutil
import subprocess
import sys

import pytest

from metonymy import loading
from metonymy.runs import workers
from metonymy.workdir import layout

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGING_PREFIX = "metonymy-staged-"  # layout.staged_locally's temporary folders
# Orbax's own marker of a finished checkpoint on a filesystem without atomic rename: its text is
# a log line naming where the checkpoint was committed, and only its existence is ever read. And
# the worker processes' console output (runs/workers.py), which names the folder the run was
# written in as a top run's console does; nothing reads it back.
ORBAX_MARKER = "commit_success.txt"
NOT_RECORDS = (ORBAX_MARKER, workers.LOG_FILE)
DEMO_TRAIN_RUNS = ("single", "two_stage_ste")

pytestmark = pytest.mark.slow


def _command(module, args, env=None, cwd=None):
  env = dict(env or os.environ)
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  proc = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=1200)
  assert proc.returncode == 0, (args, proc.stdout[-2000:], proc.stderr[-3000:])
  return proc


def _main(args, **kwargs):
  return _command("metonymy.main", args, **kwargs)


def _files(path):
  """Every file under `path` (local or gs://)."""
  for entry in layout.as_path(path).iterdir():
    if entry.is_dir():
      yield from _files(entry)
    else:
      yield entry


def _files_naming(path, *texts):
  """The files under `path` whose bytes hold any of `texts` (Orbax's markers left out)."""
  needles = [t.encode() for t in texts]
  return [os.fspath(f) for f in _files(path)
          if f.name not in NOT_RECORDS and any(n in f.read_bytes() for n in needles)]


@pytest.fixture
def moved_demo(tiny_demo_run):
  """The tiny demo run (tests/helpers/shared_runs.py), written in one folder and moved: (new, old)."""
  return tiny_demo_run.workdir, tiny_demo_run.written


@pytest.fixture
def moved_table3(small_table3_run):
  """The small Table-3 job (tests/helpers/shared_runs.py), written in one folder and moved: (new, old)."""
  return small_table3_run.workdir, small_table3_run.written


@pytest.fixture(scope="module")  # Module: the emulator's variables leave os.environ after it.
def gs_demo(tmp_path_factory):
  pytest.importorskip("gcp_storage_emulator")
  pytest.importorskip("gcsfs")
  from tests.helpers import gcs_emulator
  with gcs_emulator.serving("records") as env:
    url = "gs://records/demo"
    _main([f"--config={ROOT}/configs/demo.py:tiny", f"--workdir={url}"],
          env=dict(os.environ, **env), cwd=tmp_path_factory.mktemp("gs_demo"))
    layout.refresh(url)
    yield url, env


def _assert_loads_from(workdir, train_runs, tmp_path, env=None):
  """Every train run under `workdir` loads; the probe reads the first one's masks and
  export_part_maps exports the last one's maps."""
  for name in train_runs:
    trained = loading.load_trained_part_model(f"{workdir}/{name}")
    assert trained.meta["step"] > 0 and trained.num_parts > 0, name
  probe = tmp_path / "probe"
  _main([f"--config={ROOT}/configs/probe_synthetic.py:tiny", "--config.masks.source=stage1",
         f"--config.masks.path={workdir}/{train_runs[0]}", f"--workdir={probe}"],
        env=env, cwd=tmp_path)
  assert layout.read_json(probe / "results.json")["masks"]["source"] == "stage1"
  output = tmp_path / "maps_{split}.npz"
  _command("metonymy.probe.export_part_maps",
           [f"--config={ROOT}/configs/probe_synthetic.py:tiny", f"--workdir={workdir}/"
            f"{train_runs[-1]}", "--split=test", f"--output={output}"], env=env, cwd=tmp_path)
  assert (tmp_path / "maps_test.npz").exists()


def test_a_moved_demo_names_neither_its_old_place_nor_a_staging_folder(moved_demo):
  moved, written = moved_demo
  assert not _files_naming(moved, written, STAGING_PREFIX)
  # What it records instead: its own files relative to the workdir holding the record.
  assert layout.read_json(f"{moved}/single/model.json")["backbone"]["checkpoint"] == (
      "workdir:../backbone")
  assert layout.read_json(f"{moved}/benchmark/config.json")["backbone"]["checkpoint"] == (
      "workdir:../backbone")
  assert layout.read_json(f"{moved}/results.json")["backbone"]["path"] == "workdir:backbone"


def test_a_moved_demo_loads_from_where_it_is(moved_demo, tmp_path):
  _assert_loads_from(moved_demo[0], DEMO_TRAIN_RUNS, tmp_path)


def test_a_train_run_recorded_the_old_way_still_loads(moved_demo, tmp_path):
  """Workdirs written before the relative records name their backbone by an absolute path."""
  moved, _ = moved_demo
  old = tmp_path / "single"
  shutil.copytree(f"{moved}/single", old)
  model = layout.read_json(old / "model.json")
  model["backbone"]["checkpoint"] = f"{moved}/backbone"
  layout.write_json(old / "model.json", model)
  assert loading.load_trained_part_model(old).meta["step"] > 0


def test_a_demo_on_gs_names_no_staging_folder_and_loads_from_gs(gs_demo, tmp_path):
  url, env = gs_demo
  assert not _files_naming(url, STAGING_PREFIX)
  _assert_loads_from(url, DEMO_TRAIN_RUNS, tmp_path, env=dict(os.environ, **env))


def test_a_moved_table3_job_names_no_old_place_and_loads_from_where_it_is(moved_table3,
                                                                           tmp_path):
  moved, written = moved_table3
  assert not _files_naming(moved, written, STAGING_PREFIX)
  results = layout.read_json(f"{moved}/results.json")
  assert results["backbone"]["path"] == "workdir:backbone"
  runs = sorted(f"{r['variant']}_seed{r['seed']}" for r in results["rows"])
  for run in runs:
    masks = layout.read_json(f"{moved}/{run}/probe/config.json")["masks"]
    assert masks["path"] == "workdir:../train", run
  _assert_loads_from(moved, [f"{run}/train" for run in runs], tmp_path)
