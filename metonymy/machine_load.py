"""Whether a job had its machine to itself, for the wall times the generated blocks report.

A wall time alone cannot tell a slow program from a busy machine. The demo and the Table-3 job
record, in results.json's "machine", the CPU cores this process may run on and the system's 1-,
5- and 15-minute load averages at the job's start and end; `wall_time_text` turns them into the
blocks' wall-time sentence. The machine counts as shared when a load average over the run
exceeded the cores by more than OWN_THREADS per process of the job: more threads wanted to run
than the cores and the job's own input threads account for (the demo in one process alone on 2
cores ends at a load of about 2.2; the Table-3 job's two worker processes, alone on 2 cores, at a
15-minute load of 3.5: two XLA thread pools keep more threads waiting for the same cores).
"""

import os
from typing import Dict, List, Optional, Tuple

LOAD_WINDOWS_MINUTES = (1, 5, 15)  # The windows of os.getloadavg(), in its order.
# Runnable threads each process of a job brings beside one compute thread per core.
OWN_THREADS = 1


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
          "load_average_end": load_average(), "processes": max(1, int(processes))}


def peak_load(machine: Dict, wall_seconds: float) -> Optional[Tuple[float, str]]:
  """(load, "at the start" / "at the end"): the highest load average that speaks for the run.

  At the end, the 1-minute average and those whose window fits inside the run (a 15-minute
  average after a 5-minute run is mostly what ran before it); at the start, the 1-minute one,
  what was running when the job began. None when the job recorded no load.
  """
  end, start = machine.get("load_average_end"), machine.get("load_average_start")
  seen = [(float(v), "at the end") for v, window in zip(end or (), LOAD_WINDOWS_MINUTES)
          if window == 1 or window * 60 <= wall_seconds]
  if start:
    seen.append((float(start[0]), "at the start"))
  return max(seen, key=lambda s: s[0]) if seen else None


def wall_time_text(wall: str, wall_seconds: float, machine: Dict) -> str:
  """ "Wall time 484 s on 2 cores (load average 3.9 at the end: the cores were shared with other
  jobs)", or "(load average 1.9 at the end: machine otherwise idle)"; without a recorded load
  (results.json files older than this record) only the cores.

  Args:
    wall: the wall time as written ("484 s", "92 min").
    wall_seconds: the same in seconds.
    machine: results.json's "machine" (`cores`, or only `cpu_count` in older files).
  """
  cores = machine.get("cores") or machine.get("cpu_count")
  text = f"Wall time {wall} on {cores} CPU core{'' if cores == 1 else 's'}"
  extra = [machine["backend"]] if machine.get("backend") else []
  peak = peak_load(machine, wall_seconds) if machine.get("cores") else None
  if peak is not None:
    load, when = peak
    own = machine["cores"] + OWN_THREADS * int(machine.get("processes", 1))
    verdict = "the cores were shared with other jobs" if load > own else "machine otherwise idle"
    extra.append(f"load average {load:.1f} {when}: {verdict}")
  return text + (f" ({'; '.join(extra)})" if extra else "")
