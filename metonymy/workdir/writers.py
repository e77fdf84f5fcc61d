"""Metrics out of a run, without TensorFlow: JSONL, TensorBoard event files, PNGs.

  WORKDIR/metrics.jsonl       one {"step": s, "<name>": value, ...} object per line (appended
                              across resumes; a resume first trims it to the restored step); on
                              an object store metrics.jsonl.d/<n>.jsonl, one object per upload
                              (layout.Workdir.metric_files reads either as one stream)
  WORKDIR/tensorboard/        event files (tensorboardX; `tensorboard --logdir WORKDIR`): the
                              scalars, the part-map images, the resolved config as text
  WORKDIR/images/<name>_<step>.png
  WORKDIR/report.md           the latest evaluation in words (`write_text`, replaced each time)
  WORKDIR/parameters.txt      the parameter tables of the run's start (clu.parameter_overview)

The paths come from metonymy/workdir (local or gs://). Only process 0 writes; on other processes
every method is a no-op. TensorBoard files come from tensorboardX (its own GCS writer for gs://)
because `clu.metric_writers` needs TensorFlow; the console's steps/s and ETA come from clu's
ReportProgress, the optional trace from clu's Profile.
"""

import contextlib
import io
import json
import math
import os
import sys
import time
import types
from typing import Dict, List, Optional

from clu import parameter_overview
import jax
import numpy as np
from PIL import Image
from tensorboard.backend.event_processing import event_accumulator

from metonymy.workdir import Workdir
from metonymy.workdir import layout


def _scalar(value) -> float:
  return float(np.asarray(value))


class MetricsLog:
  """A workdir's metrics stream (layout.Workdir.metric_files). Locally metrics.jsonl, appended
  to. An object store has no append: there the lines since the last upload go up as one new
  object, metrics.jsonl.d/<n>.jsonl, at most every `REMOTE_FLUSH_S` and at `flush`/`close`, so
  the bytes a run uploads grow with its length (rewriting one object whole at every upload
  would make them grow with its square)."""

  REMOTE_FLUSH_S = 30.0

  def __init__(self, files: Workdir):
    self.files = files
    self._local = files.is_local
    self._pending: List[str] = []
    self._last_upload = 0.0
    if self._local:
      self._file = open(files.metrics_file, "a")
    else:
      self._next_chunk = self._after_last_chunk()

  def _after_last_chunk(self) -> int:
    chunks = self.files.metric_chunks()
    return layout.metrics_chunk_number(chunks[-1]) + 1 if chunks else 0

  def append(self, line: str) -> None:
    if self._local:
      self._file.write(line)
      self._file.flush()
      return
    self._pending.append(line)
    if time.monotonic() - self._last_upload >= self.REMOTE_FLUSH_S:
      self.flush()

  def flush(self) -> None:
    if self._local:
      self._file.flush()
      return
    if self._pending:
      layout.write_text(layout.metrics_chunk(self.files.metrics_chunks, self._next_chunk),
                        "".join(self._pending))
      self._next_chunk += 1
      self._pending = []
    self._last_upload = time.monotonic()

  def trim(self, step: int) -> None:
    """Drops the records after `step` (and a line a kill left half-written). On an object store
    each file of the stream that holds such a record is replaced by its kept lines (removed
    when none is kept); a kill halfway leaves whole files, and the next resume trims again."""
    if self._local:
      self._file.close()
      with open(self.files.metrics_file) as f:
        lines = f.readlines()
      kept = _records_up_to(lines, step)
      if len(kept) != len(lines):  # Aside, then renamed: a kill keeps one whole file.
        layout.write_text(self.files.metrics_file, "".join(kept))
      self._file = open(self.files.metrics_file, "a")
      return
    self.flush()
    for path in self.files.metric_files():
      lines = path.read_text().splitlines(keepends=True)
      kept = _records_up_to(lines, step)
      if len(kept) == len(lines):
        continue
      if kept or path == self.files.metrics_file:
        layout.write_text(path, "".join(kept))
      else:
        path.unlink()
    self._next_chunk = self._after_last_chunk()

  def close(self) -> None:
    if self._local:
      self._file.close()
    else:
      self.flush()


def _records_up_to(lines: List[str], step: int) -> List[str]:
  """The lines of `lines` that are whole records of a step <= `step`, each ending in a newline."""
  kept = []
  for line in lines:
    try:
      record = json.loads(line)
    except ValueError:
      continue
    if isinstance(record, dict) and isinstance(record.get("step"), int) and (
        record["step"] <= step):
      kept.append(line if line.endswith("\n") else line + "\n")
  return kept


def _summary_writer_class():
  """tensorboardX's SummaryWriter, imported without PyTorch.

  tensorboardX imports torch, where it is installed, only to accept torch tensors. Everything
  logged here is a number or a numpy array, and importing torch costs a process 1-2 s of CPU, as
  much as a short run's training. A process that already has torch keeps it.
  """
  hide_torch = "torch" not in sys.modules
  if hide_torch:
    sys.modules["torch"] = None  # `import torch` raises ImportError while this entry is there.
  try:
    from tensorboardX import SummaryWriter
  except ImportError as e:
    raise ImportError("The trainer writes TensorBoard files with tensorboardX: "
                      "pip install tensorboardX (it is in requirements.txt).") from e
  finally:
    if hide_torch:
      del sys.modules["torch"]
  return SummaryWriter


class MetricWriter:

  def __init__(self, workdir, enabled: bool = True):
    self.enabled = enabled
    self.files = Workdir(workdir)
    self.workdir = self.files.path
    self._tb = None
    if not enabled:
      return
    self.files.images.mkdir(parents=True, exist_ok=True)
    self._jsonl = MetricsLog(self.files)
    self._tb = _summary_writer_class()(os.fspath(self.files.tensorboard))

  def write_scalars(self, step: int, scalars: Dict[str, float]) -> None:
    if not self.enabled:
      return
    values = {name: _scalar(v) for name, v in scalars.items()}
    record = {"step": int(step)}
    # JSON has no NaN/Inf literals that every reader accepts: write them as strings.
    record.update({k: (v if math.isfinite(v) else str(v)) for k, v in values.items()})
    self._jsonl.append(json.dumps(record) + "\n")
    for name, value in values.items():
      self._tb.add_scalar(name, value, int(step))

  def trim(self, step: int) -> None:
    """Drops the metrics.jsonl records after `step` (and a line a kill left half-written): a
    resumed run repeats those steps, which would otherwise appear twice. TensorBoard needs no
    such help: it drops the events after a step that is logged again."""
    if self.enabled:
      self._jsonl.trim(step)

  def write_image(self, step: int, name: str, image: np.ndarray) -> Optional[str]:
    """uint8 [H, W, 3] -> a PNG under images/ and a TensorBoard image; returns the PNG path."""
    if not self.enabled:
      return None
    path = self.files.image(name, step)
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    path.write_bytes(buffer.getvalue())
    self._tb.add_image(name, image, int(step), dataformats="HWC")
    return os.fspath(path)

  def write_config_to_tensorboard(self, config) -> None:
    """The resolved config as TensorBoard text (tag "config", step 0), so a run's event files
    say what ran."""
    if not self.enabled:
      return
    body = config.to_json_best_effort(indent=2) if hasattr(config, "to_json_best_effort") else (
        json.dumps(config, indent=2, default=str))
    self._tb.add_text("config", "```\n" + body + "\n```", 0)

  def write_figure(self, step: int, name: str, png_path) -> None:
    """A PNG already written (a report's figure) as a TensorBoard image."""
    if not self.enabled:
      return
    with Image.open(io.BytesIO(layout.as_path(png_path).read_bytes())) as image:
      pixels = np.asarray(image.convert("RGB"))
    self._tb.add_image(name, pixels, int(step), dataformats="HWC")

  def write_text(self, name: str, text: str) -> Optional[str]:
    """Replaces WORKDIR/<name> with `text` (layout.write_text: a reader or a kill never sees
    half a file); returns the path."""
    if not self.enabled:
      return None
    return os.fspath(layout.write_text(self.files.output(name), text))

  def flush(self) -> None:
    if self.enabled:
      self._jsonl.flush()
      self._tb.flush()

  def close(self) -> None:
    if self.enabled:
      self._jsonl.close()
      self._tb.close()
      self.enabled = False


def read_tensorboard(workdir: str) -> Dict[str, set]:
  """{"scalars": tags, "images": tags, "text": tags} of the event files in WORKDIR/tensorboard
  (tensorboard's own reader), e.g. to check what a run shows."""
  accumulator = event_accumulator.EventAccumulator(
      os.fspath(Workdir(workdir).tensorboard), size_guidance={event_accumulator.TENSORS: 0})
  accumulator.Reload()
  tags = accumulator.Tags()
  # add_text is stored as a tensor summary of the text plugin, tagged "<name>/text_summary".
  text = {t[:-len("/text_summary")] if t.endswith("/text_summary") else t
          for t in tags.get("tensors", [])
          if accumulator.SummaryMetadata(t).plugin_data.plugin_name == "text"}
  return {"scalars": set(tags.get("scalars", [])), "images": set(tags.get("images", [])),
          "text": text}


def _periodic_actions():
  """clu.periodic_actions, with or without TensorFlow.

  It imports clu.metric_writers, whose package imports its TensorFlow summary writer. metonymy
  writes TensorBoard files with tensorboardX and uses none of clu's writers, so where TensorFlow
  is not installed a placeholder stands in for that one module (constructing its SummaryWriter
  raises); where it is, clu's own is used."""
  try:
    from clu import periodic_actions  # After the placeholder below where TensorFlow is absent.
    return periodic_actions
  except ModuleNotFoundError as e:
    if e.name != "tensorflow":
      raise
  name = "clu.metric_writers.summary_writer"
  placeholder = types.ModuleType(name)

  class SummaryWriter:

    def __init__(self, *args, **kwargs):
      raise ImportError("clu's SummaryWriter needs TensorFlow, which is not installed; metonymy "
                        "writes TensorBoard files with tensorboardX.")

  placeholder.SummaryWriter = SummaryWriter
  sys.modules[name] = placeholder
  from clu import periodic_actions
  return periodic_actions


class _Rate:
  """The MetricWriter clu's ReportProgress reports to: keeps its steps/s for the console line
  and the step's metrics record."""

  def __init__(self):
    self.steps_per_second = float("nan")

  def write_scalars(self, step: int, scalars) -> None:
    del step
    if "steps_per_sec" in scalars:
      self.steps_per_second = float(scalars["steps_per_sec"])


class Progress:
  """Steps/s and ETA for the console, from clu's ReportProgress. Call it after every step from
  the first timed one on (the step that compiled is left out); it measures between the steps it
  reports (every `every_steps`, and the last), leaving out the time spent inside `pause()`."""

  def __init__(self, total_steps: int, every_steps: int):
    self.total_steps = total_steps
    self._rate = _Rate()
    self._report = _periodic_actions().ReportProgress(
        num_train_steps=total_steps, writer=self._rate, every_steps=every_steps, every_secs=None)
    self._paused = 0.0

  def __call__(self, step: int) -> None:
    self._report(step, time.monotonic() - self._paused)

  @property
  def steps_per_second(self) -> float:
    return self._rate.steps_per_second

  @contextlib.contextmanager
  def pause(self):
    start = time.monotonic()
    try:
      yield
    finally:
      self._paused += time.monotonic() - start

  def line(self, step: int) -> str:
    """"<steps/s> steps/s, ETA <time>" as of the last report ("-" and "?" before the first)."""
    rate = self.steps_per_second
    remaining = (self.total_steps - step) / rate if rate > 0 else float("nan")
    return f"{f'{rate:.2f}' if math.isfinite(rate) else '-'} steps/s, ETA {_duration(remaining)}"


def _duration(seconds: float) -> str:
  if not math.isfinite(seconds):
    return "?"
  seconds = int(round(seconds))
  hours, rest = divmod(seconds, 3600)
  minutes, secs = divmod(rest, 60)
  return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def profiler(workdir: str, num_steps: int, first_step: int):
  """clu's Profile hook: one JAX trace of `num_steps` steps after `first_step`, into
  WORKDIR/tensorboard (TensorBoard's profile tab); call it after every step. None when num_steps
  is 0, or on processes other than 0."""
  if not num_steps or jax.process_index() != 0:
    return None
  return _periodic_actions().Profile(
      logdir=os.fspath(Workdir(workdir).tensorboard), num_profile_steps=num_steps,
      profile_duration_ms=None, first_profile=first_step, every_secs=None)


def stop_profiler() -> None:
  """Ends a trace the run finished (or stopped) inside of; nothing if none is running."""
  try:
    jax.profiler.stop_trace()
  except RuntimeError:  # "No profile started": Profile stopped it itself.
    pass


def write_parameter_tables(workdir: str, trees: Dict[str, object]) -> Optional[str]:
  """WORKDIR/parameters.txt: one table per named tree (name, shape, dtype, size;
  clu.parameter_overview), there to read rather than scrolling past on the console. Process 0
  writes and returns the path; other processes return None."""
  if jax.process_index() != 0:
    return None
  text = "".join(
      f"{title}\n{parameter_overview.get_parameter_overview(tree, include_stats=False)}\n\n"
      for title, tree in trees.items())
  return os.fspath(layout.write_text(Workdir(workdir).parameters_file, text))
