"""Metrics out of a run, without TensorFlow: JSONL, TensorBoard event files, PNGs, the console.

  WORKDIR/metrics.jsonl       one {"step": s, "<name>": value, ...} object per line (appended
                              across resumes; a resume first trims it to the restored step)
  WORKDIR/tensorboard/        event files (tensorboardX; `tensorboard --logdir WORKDIR`): the
                              scalars, the part-map images, the resolved config as text
  WORKDIR/images/<name>_<step>.png
  WORKDIR/report.md           the latest evaluation in words (`write_text`, replaced each time)
  WORKDIR/parameters.txt      the parameter tables of the run's start (clu.parameter_overview)

Only process 0 writes; on other processes every method is a no-op. TensorBoard files come from
tensorboardX because `clu.metric_writers` needs TensorFlow; the console's steps/s and ETA come from
clu's ReportProgress, the optional trace from clu's Profile.
"""

import contextlib
import json
import logging as py_logging
import math
import os
import sys
import time
import types
from typing import Dict, Optional

import numpy as np
from absl import logging


def _scalar(value) -> float:
  return float(np.asarray(value))


class MetricWriter:

  def __init__(self, workdir: str, enabled: bool = True):
    self.enabled = enabled
    self.workdir = workdir
    self._tb = None
    if not enabled:
      return
    os.makedirs(os.path.join(workdir, "images"), exist_ok=True)
    self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a")
    try:
      from tensorboardX import SummaryWriter
    except ImportError as e:
      raise ImportError("The trainer writes TensorBoard files with tensorboardX: "
                        "pip install tensorboardX (it is in requirements.txt).") from e
    self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

  def write_scalars(self, step: int, scalars: Dict[str, float]) -> None:
    if not self.enabled:
      return
    values = {name: _scalar(v) for name, v in scalars.items()}
    record = {"step": int(step)}
    # JSON has no NaN/Inf literals that every reader accepts: write them as strings.
    record.update({k: (v if math.isfinite(v) else str(v)) for k, v in values.items()})
    self._jsonl.write(json.dumps(record) + "\n")
    self._jsonl.flush()
    for name, value in values.items():
      self._tb.add_scalar(name, value, int(step))

  def trim(self, step: int) -> None:
    """Drops the metrics.jsonl records after `step` (and a line a kill left half-written): a
    resumed run repeats those steps, which would otherwise appear twice. TensorBoard needs no
    such help: it drops the events after a step that is logged again."""
    if not self.enabled:
      return
    path = self._jsonl.name
    self._jsonl.close()
    with open(path) as f:
      lines = f.readlines()
    kept = []
    for line in lines:
      try:
        record = json.loads(line)
      except ValueError:
        continue
      if isinstance(record, dict) and isinstance(record.get("step"), int) and (
          record["step"] <= step):
        kept.append(line if line.endswith("\n") else line + "\n")
    if len(kept) != len(lines):
      with open(path + ".tmp", "w") as f:  # Written aside, then renamed: a kill keeps one whole.
        f.writelines(kept)
      os.replace(path + ".tmp", path)
    self._jsonl = open(path, "a")

  def write_image(self, step: int, name: str, image: np.ndarray) -> Optional[str]:
    """uint8 [H, W, 3] -> a PNG under images/ and a TensorBoard image; returns the PNG path."""
    if not self.enabled:
      return None
    from PIL import Image
    path = os.path.join(self.workdir, "images", f"{name.replace('/', '_')}_{int(step):07d}.png")
    Image.fromarray(image).save(path)
    self._tb.add_image(name, image, int(step), dataformats="HWC")
    return path

  def write_config(self, config) -> None:
    """The resolved config as TensorBoard text (tag "config", step 0), so a run's event files
    say what ran."""
    if not self.enabled:
      return
    body = config.to_json_best_effort(indent=2) if hasattr(config, "to_json_best_effort") else (
        json.dumps(config, indent=2, default=str))
    self._tb.add_text("config", "```\n" + body + "\n```", 0)

  def write_figure(self, step: int, name: str, png_path: str) -> None:
    """A PNG already written (a report's figure) as a TensorBoard image."""
    if not self.enabled:
      return
    from PIL import Image
    with Image.open(png_path) as image:
      pixels = np.asarray(image.convert("RGB"))
    self._tb.add_image(name, pixels, int(step), dataformats="HWC")

  def write_text(self, name: str, text: str) -> Optional[str]:
    """Replaces WORKDIR/<name> with `text` (written aside, then renamed: a reader or a kill never
    sees half a file); returns the path."""
    if not self.enabled:
      return None
    path = os.path.join(self.workdir, name)
    with open(path + ".tmp", "w") as f:
      f.write(text)
    os.replace(path + ".tmp", path)
    return path

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
  from tensorboard.backend.event_processing import event_accumulator
  accumulator = event_accumulator.EventAccumulator(
      os.path.join(workdir, "tensorboard"), size_guidance={event_accumulator.TENSORS: 0})
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
    from clu import periodic_actions
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
  import jax
  if not num_steps or jax.process_index() != 0:
    return None
  return _periodic_actions().Profile(
      logdir=os.path.join(workdir, "tensorboard"), num_profile_steps=num_steps,
      profile_duration_ms=None, first_profile=first_step, every_secs=None)


def stop_profiler() -> None:
  """Ends a trace the run finished (or stopped) inside of; nothing if none is running."""
  import jax
  try:
    jax.profiler.stop_trace()
  except RuntimeError:  # "No profile started": Profile stopped it itself.
    pass


def write_parameter_tables(workdir: str, trees: Dict[str, object]) -> Optional[str]:
  """WORKDIR/parameters.txt: one table per named tree (name, shape, dtype, size;
  clu.parameter_overview), there to read rather than scrolling past on the console. Process 0
  writes and returns the path; other processes return None."""
  import jax
  from clu import parameter_overview
  if jax.process_index() != 0:
    return None
  path = os.path.join(workdir, "parameters.txt")
  with open(path, "w") as f:
    for title, tree in trees.items():
      table = parameter_overview.get_parameter_overview(tree, include_stats=False)
      f.write(f"{title}\n{table}\n\n")
  return path


def console(message: str) -> None:
  """One progress line on process 0's stdout (not through absl too: under absl.app that would
  print it twice on a terminal)."""
  import jax  # Here: the writers themselves need no JAX.
  if jax.process_index() == 0:
    print(message, flush=True)


class _DropLibraryInfo(py_logging.Filter):
  """Drops INFO (and lower) records logged from `packages`' source files."""

  def __init__(self, packages):
    super().__init__()
    self.markers = tuple(f"{os.sep}{p}{os.sep}" for p in packages)

  def filter(self, record) -> bool:
    return record.levelno >= py_logging.WARNING or not any(
        m in record.pathname for m in self.markers)


def quiet_library_logs(packages=("orbax", "grain", os.path.join("clu", "platform"))) -> None:
  """Orbax logs every stage of every save at INFO through absl, burying the progress lines, and
  clu's ReportProgress logs (through clu.platform) a second progress line beside the console's:
  keep those libraries' warnings and errors only. Idempotent."""
  logger = logging.get_absl_logger()
  if not any(isinstance(f, _DropLibraryInfo) for f in logger.filters):
    logger.addFilter(_DropLibraryInfo(packages))
