"""What a job prints: one progress line per event on process 0 (`console`), and the libraries'
INFO logs kept off the console (`quiet_library_logs`). Used by main, the trainer, the probe, the
demo and the Table-3 job."""

import logging as py_logging
import os

from absl import logging
import jax


def console(message: str) -> None:
  """One progress line on process 0's stdout (not through absl too: under absl.app that would
  print it twice on a terminal)."""
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
