"""How every report of a run is written: numbers as text, markdown tables, JSON-ready values,
the generated blocks of markdown files and the wall-time sentence. Reports format what a job
computed; nothing here measures or computes a result.

  fmt / fmt_int / with_ci    a number to text, one way for report.md, README's blocks and the
                             console: fixed decimals, "n/a" for what was not measured
  markdown_table             a GitHub markdown table
  sanitize                   a JSON-ready copy of a results dict (NumPy to Python, NaN to None)
  read_block / write_block   the text between `<!-- NAME:begin -->` and `<!-- NAME:end -->` of a
                             markdown file, rewritten by the code that measured it
  wall_time_text             "Wall time 484 s on 2 CPU cores (load average ...)": whether the
                             job had its machine to itself (runs/machine_load.py records it)

README.md holds the demo's blocks (demo:results, demo:seeds) and the Table-3 job's
(table3:results for world seed 0, table3:results:worldN for world seed N); docs/benchmarks.md
the benchmarks' (bench:vit, bench:suite).
"""

import math
import os
from typing import Dict, List, Optional, Tuple

import numpy as np

# ------------------------------------------------------------------------------------------------
# Numbers and tables.


def fmt(value, digits: int = 3) -> str:
  """`value` to `digits` decimals; "n/a" for None and non-finite values."""
  if value is None or not math.isfinite(float(value)):
    return "n/a"
  return f"{value:.{digits}f}"


def fmt_int(value) -> str:
  return "n/a" if value is None else str(int(value))


def with_ci(results_block: Dict, key: str, digits: int = 3) -> str:
  """`results_block[key]` followed by its `<key>_ci` interval when there is one."""
  value, ci = results_block.get(key), results_block.get(f"{key}_ci")
  if ci and all(c is not None for c in ci):
    return f"{fmt(value, digits)} [{fmt(ci[0], digits)}, {fmt(ci[1], digits)}]"
  return fmt(value, digits)


def markdown_table(header: List[str], rows: List[List[str]]) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(r) + " |" for r in rows]
  return "\n".join(lines)


def sanitize(obj):
  """JSON-ready copy: NumPy scalars and arrays to Python, NaN and infinities to None."""
  if isinstance(obj, dict):
    return {str(k): sanitize(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [sanitize(v) for v in obj]
  if isinstance(obj, np.ndarray):
    return sanitize(obj.tolist())
  if isinstance(obj, (np.bool_, bool)):
    return bool(obj)
  if isinstance(obj, (np.integer, int)):
    return int(obj)
  if isinstance(obj, (np.floating, float)):
    return float(obj) if math.isfinite(float(obj)) else None
  return obj


# ------------------------------------------------------------------------------------------------
# Generated blocks of markdown files.


def markers(name: str) -> Tuple[str, str]:
  return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def read_block(path: str, name: str) -> Tuple[str, str, str]:
  """(text before the begin marker, the block between the markers, text from the end marker
  on), markers excluded. FileNotFoundError / ValueError name the file and the markers."""
  begin, end = markers(name)
  if not os.path.exists(path):
    raise FileNotFoundError(f"README {path!r} does not exist.")
  with open(path) as f:
    text = f.read()
  start, stop = text.find(begin), text.find(end)
  if start < 0 or stop < start:
    raise ValueError(f"{path} has no '{begin}' ... '{end}' block (in that order); add the two "
                     "marker lines where the generated text should go.")
  return text[:start], text[start + len(begin):stop], text[stop + len(end):]


def write_block(path: str, name: str, body: str) -> None:
  """Replaces the block `name` of `path` with `body` (one newline after the begin marker and
  before the end marker)."""
  head, _, tail = read_block(path, name)
  begin, end = markers(name)
  with open(path, "w") as f:
    f.write(f"{head}{begin}\n{body.strip(chr(10))}\n{end}{tail}")


# ------------------------------------------------------------------------------------------------
# The wall-time sentence. A wall time alone cannot tell a slow program from a busy machine: the
# demo and the Table-3 job record, in results.json's "machine" (runs/machine_load.py), the cores
# and the 1-, 5- and 15-minute load averages at the job's start and end. The machine counts as
# shared when a load average over the run exceeded the cores by more than OWN_THREADS per process
# of the job: more threads wanted to run than the cores and the job's own input threads account
# for (docs/experiments.md gives the loads a job alone on 2 cores ends at).

LOAD_WINDOWS_MINUTES = (1, 5, 15)  # The windows of os.getloadavg(), in its order.
# Runnable threads each process of a job brings beside one compute thread per core.
OWN_THREADS = 1


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
  (results.json files older than this record) only the cores; the host allocator where recorded
  (metonymy/allocator.py: a CPU run's time depends on it).

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
  if machine.get("allocator"):
    extra.append(f"host allocator: {machine['allocator']}")
  return text + (f" ({'; '.join(extra)})" if extra else "")
