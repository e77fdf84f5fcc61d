"""Metrics out of a run, without TensorFlow: JSONL, TensorBoard event files, PNGs, the console.

  WORKDIR/metrics.jsonl       one {"step": s, "<name>": value, ...} object per line (appended
                              across resumes; a resume first trims it to the restored step)
  WORKDIR/tensorboard/        event files (tensorboardX; `tensorboard --logdir WORKDIR`)
  WORKDIR/images/<name>_<step>.png
  WORKDIR/report.md           the latest evaluation in words (`write_text`, replaced each time)

Only process 0 writes; on other processes every method is a no-op.
(`clu.metric_writers` would import TensorFlow, hence tensorboardX.)
"""

import json
import logging as py_logging
import math
import os
import time
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


class Progress:
  """Steps/s and ETA for the console, measured between calls (so compile time and evaluation
  pauses are excluded once `pause`d around them)."""

  def __init__(self, total_steps: int, first_step: int):
    self.total_steps = total_steps
    self._last_step = first_step
    self._last_time = time.perf_counter()
    self._paused = 0.0
    self.steps_per_second = float("nan")

  def pause(self):
    return _Pause(self)

  def update(self, step: int) -> str:
    now = time.perf_counter()
    elapsed = now - self._last_time - self._paused
    if step > self._last_step and elapsed > 0:
      self.steps_per_second = (step - self._last_step) / elapsed
    self._last_step, self._last_time, self._paused = step, now, 0.0
    remaining = (self.total_steps - step) / self.steps_per_second if self.steps_per_second > 0 else float("nan")
    rate = f"{self.steps_per_second:.2f}" if math.isfinite(self.steps_per_second) else "-"
    return f"{rate} steps/s, ETA {_duration(remaining)}"


class _Pause:

  def __init__(self, progress: Progress):
    self.progress = progress

  def __enter__(self):
    self.start = time.perf_counter()

  def __exit__(self, *exc):
    self.progress._paused += time.perf_counter() - self.start


def _duration(seconds: float) -> str:
  if not math.isfinite(seconds):
    return "?"
  seconds = int(round(seconds))
  hours, rest = divmod(seconds, 3600)
  minutes, secs = divmod(rest, 60)
  return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


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


def quiet_library_logs(packages=("orbax", "grain")) -> None:
  """Orbax logs every stage of every save at INFO through absl, burying the progress lines;
  keep those libraries' warnings and errors only. Idempotent."""
  logger = logging.get_absl_logger()
  if not any(isinstance(f, _DropLibraryInfo) for f in logger.filters):
    logger.addFilter(_DropLibraryInfo(packages))
