"""Sub-runs side by side, each in a worker process of its own: the Table-3 job's runs, the demo's
benchmark and trainings.

On a CPU, XLA's thread pool keeps the cores busy only part of the time on the project's small
synthetic-world models, so two runs at once do more in all than one (docs/experiments.md has
the rates). Sub-runs that only share their inputs (the stand-in, the world) can then run
`processes` at a time. Each task is a module-level function
that runs the project's own sub-jobs (launcher.launch on a Workdir.sub handle, exactly as in the
job's own process; a run's numbers are the same bit for bit) and returns what the job needs
(picklable). A task's console and logs go to its log file.

A worker whose job process dies (killed, preempted) stops too: it sends itself SIGTERM, on
which a training run saves a checkpoint and stops (the rerun of the job resumes it), and exits.
"""

import concurrent.futures
import contextlib
import dataclasses
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable, Iterator, List, Sequence

import jax

from metonymy import console

LOG_FILE = "log.txt"
# How often a worker checks that the job process is alive, and how long it then gives its run
# to save before it exits.
PARENT_CHECK_SECONDS = 2.0
SAVE_GRACE_SECONDS = 120.0
_job_process = None  # In a worker: the job process's pid (_stop_with_parent).


@dataclasses.dataclass(frozen=True)
class Task:
  """One sub-run for a worker: `function(*args)`, its output appended to `log`."""
  name: str  # what the console calls it, e.g. "ste, run seed 1"
  log: str  # a local file path
  function: Callable[..., Any]  # module-level, so a worker can import it
  args: tuple = ()


def process_count(requested: int, num_tasks: int) -> int:
  """Worker processes for `num_tasks` tasks: `requested`, or for 0 two on a CPU backend with at
  least two cores and one on an accelerator (two processes would each claim its memory)."""
  if requested < 0:
    raise ValueError(f"config.run_processes={requested}: expected 0 (automatic) or a count >= 1.")
  if requested == 0:
    requested = 2 if jax.default_backend() == "cpu" and (os.cpu_count() or 1) >= 2 else 1
  return max(1, min(requested, num_tasks))


@contextlib.contextmanager
def _output_to(path: str) -> Iterator[None]:
  """This process's stdout and stderr (file descriptors included, so the libraries' logs and
  progress bars too) appended to `path` while the block runs."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "a", buffering=1) as log:
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    try:
      yield
    finally:
      sys.stdout.flush()
      sys.stderr.flush()
      os.dup2(saved[0], 1)
      os.dup2(saved[1], 2)
      os.close(saved[0])
      os.close(saved[1])


def _stop_with_parent(parent: int) -> None:
  """Worker initializer: a daemon thread that, once the job process `parent` is gone (this
  process then has another parent), stops this worker as the platforms preempt a run."""
  global _job_process
  _job_process = parent

  def watch() -> None:
    while os.getppid() == parent:
      time.sleep(PARENT_CHECK_SECONDS)
    os.kill(os.getpid(), signal.SIGTERM)  # The trainer's handler saves and stops the run.
    time.sleep(SAVE_GRACE_SECONDS)
    os._exit(1)  # A run that did not stop within the grace (outside training, SIGTERM kills).

  threading.Thread(target=watch, name="stop-with-parent", daemon=True).start()


def _run_task(task: Task) -> Any:
  """In a worker: the task, its output (and the traceback of a failure, which is raised again
  in the job) in its log."""
  with _output_to(task.log):
    print(f"[worker, pid {os.getpid()}] {task.name}", flush=True)
    try:
      return task.function(*task.args)
    except BaseException:
      traceback.print_exc()
      if os.getppid() != _job_process:  # Stopped by _stop_with_parent: nobody to report to.
        sys.stderr.flush()
        os._exit(1)
      raise


def run_all(tasks: Sequence[Task], processes: int, prefix: str) -> List[Any]:
  """Runs `tasks` in `processes` worker processes, started in the order given, printing each
  one's end with an ETA (lines start with `prefix`, e.g. "[table3]"); returns their results in
  that order. A failed task stops the rest and raises, naming its log."""
  start = time.perf_counter()
  # "spawn": a fresh interpreter per worker; forking a process whose JAX runtime has started
  # is unsafe.
  context = multiprocessing.get_context("spawn")
  console.console(f"{prefix} {len(tasks)} sub-runs in {processes} worker processes; each one's "
                  f"output in its {LOG_FILE}")
  results: List[Any] = [None] * len(tasks)
  with concurrent.futures.ProcessPoolExecutor(processes, mp_context=context,
                                              initializer=_stop_with_parent,
                                              initargs=(os.getpid(),)) as pool:
    futures = {pool.submit(_run_task, task): i for i, task in enumerate(tasks)}
    done = 0
    try:
      for future in concurrent.futures.as_completed(futures):
        task = tasks[futures[future]]
        try:
          results[futures[future]] = future.result()
        except BaseException as e:
          raise RuntimeError(f"{task.name} failed ({e!r}); its output: {task.log}") from e
        done += 1
        elapsed = time.perf_counter() - start
        eta = elapsed / done * (len(tasks) - done)
        console.console(f"{prefix} ({done}/{len(tasks)}) {task.name} done; {elapsed / 60:.1f} "
                        f"min so far" + (f", ETA {eta / 60:.0f} min" if done < len(tasks) else ""))
    except BaseException:
      for future in futures:
        future.cancel()
      raise
  return results
