"""workdir/writers.py's MetricsLog and layout.Workdir's readers of what it writes: plain
appends to metrics.jsonl locally; on an object store (the GCS emulator, tests/helpers/gcs_emulator.py)
one new object per upload, metrics.jsonl.d/<n>.jsonl, read back as one stream, so the bytes a
run uploads grow with its length, not its square; a resume's trim drops a killed run's records
after the restored step either way."""

import json

import pytest

from metonymy.workdir import writers
from metonymy.workdir import Workdir
from metonymy.workdir import layout
from tests.helpers import gcs_emulator


@pytest.fixture(scope="module")
def gcs():
  pytest.importorskip("gcp_storage_emulator")
  pytest.importorskip("gcsfs")
  with gcs_emulator.serving("metrics") as env:
    yield env


def _record(step: int) -> str:
  return json.dumps({"step": step, "loss": 1.0 / step, "eval/mAP": 0.01 * step}) + "\n"


def _log(files, steps, monkeypatch, every_append=True):
  """A run's metrics: one record per step, uploaded after every record (the worst case of the
  30-s upload interval) unless `every_append` is False."""
  monkeypatch.setattr(writers.MetricsLog, "REMOTE_FLUSH_S", 0.0 if every_append else 1e9)
  log = writers.MetricsLog(files)
  for step in steps:
    log.append(_record(step))
  return log


def test_local_metrics_are_one_file_appended_to_and_trimmed(tmp_path, monkeypatch):
  files = Workdir(tmp_path)
  log = _log(files, range(1, 11), monkeypatch)
  log.close()
  with open(files.metrics_file, "a") as f:
    f.write('{"step": 11, "lo')  # A kill mid-line.
  log = writers.MetricsLog(files)
  log.trim(6)
  log.append(_record(7))
  log.close()
  assert files.metric_files() == [files.metrics_file] and not files.metrics_chunks.exists()
  assert list(files.metric_records("loss")) == list(range(1, 8))


def test_metrics_on_gs_are_new_objects_read_as_one_stream(gcs, monkeypatch):
  files = Workdir("gs://metrics/run")
  log = _log(files, range(1, 6), monkeypatch)
  log.close()
  log = _log(files, range(6, 9), monkeypatch, every_append=False)  # A resumed run: held...
  assert len(files.metric_chunks()) == 5
  log.close()  # ... then uploaded as one more object.
  chunks = files.metric_chunks()
  assert [layout.metrics_chunk_number(p) for p in chunks] == list(range(6))
  assert not files.metrics_file.exists()
  assert list(files.metric_records("eval/")) == list(range(1, 9))
  assert files.metric_records("eval/")[8] == {"mAP": 0.08}


def test_a_resume_on_gs_trims_the_killed_runs_records_once(gcs, monkeypatch):
  files = Workdir("gs://metrics/killed")
  # A run written before the chunks: its metrics.jsonl is read first, and trimmed too.
  files.metrics_file.write_text("".join(_record(s) for s in (1, 2)))
  log = _log(files, range(3, 11), monkeypatch)
  log.close()
  last = files.metric_chunks()[-1]
  last.write_text(last.read_text() + '{"step": 11, "lo')  # A kill mid-upload of a line.
  log = writers.MetricsLog(files)
  log.trim(6)  # Restored at step 6: steps 7..10 are replayed.
  for step in range(7, 13):
    log.append(_record(step))
  log.close()
  steps = [json.loads(line)["step"] for _, _, line in files.metric_lines()]
  assert steps == list(range(1, 13))  # In order, none twice, no half line.
  log = writers.MetricsLog(files)
  log.trim(1)  # Back before every chunk: they all go, the old file keeps its first line.
  log.close()
  assert files.metric_chunks() == [] and list(files.metric_records("loss")) == [1]


@pytest.mark.slow
def test_the_bytes_a_run_uploads_grow_with_its_length_not_its_square(gcs, monkeypatch):
  uploaded = {}
  for steps in (100, 200):
    files = Workdir(f"gs://metrics/length_{steps}")
    with gcs_emulator.counting_uploads() as counts:
      _log(files, range(1, steps + 1), monkeypatch).close()
    uploaded[steps] = sum(n for name, n in counts.items() if "metrics.jsonl" in name)
    assert list(files.metric_records("loss")) == list(range(1, steps + 1))
  ratio = uploaded[200] / uploaded[100]
  assert 1.8 < ratio < 2.3, (uploaded, ratio)  # A whole-file rewrite per upload: about 4.
