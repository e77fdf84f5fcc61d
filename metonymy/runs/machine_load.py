"""What a job records of its machine, for the wall times its report states
(reporting.wall_time_text reads it): the CPU cores this process may run on and the system's 1-,
5- and 15-minute load averages at the job's start and end, and the host allocator (a CPU job
runs about twice as fast on jemalloc: metonymy/allocator.py), in results.json's "machine"."""

import os
from typing import Dict, List, Optional

from metonymy import allocator


def usable_cores() -> int:
  """The cores this process may run on (its CPU affinity), os.cpu_count() where none is told."""
  try:
    return len(os.sched_getaffinity(0))
  except (AttributeError, OSError):  # No affinity on macOS / Windows.
    return os.cpu_count() or 1


def load_average() -> Optional[List[float]]:
  """[1-min, 5-min, 15-min] load averages, or None where the system keeps none (Windows)."""
  try:
    return [round(float(v), 2) for v in os.getloadavg()]
  except (AttributeError, OSError):
    return None


def at_end(load_average_start: Optional[List[float]], processes: int = 1) -> Dict:
  """The entries results.json's "machine" gains at the end of a job started with that load and
  run in `processes` processes (its worker processes, runs/workers.py, or itself)."""
  return {"cores": usable_cores(), "load_average_start": load_average_start,
          "load_average_end": load_average(), "processes": max(1, int(processes)),
          "allocator": allocator.name()}
