"""The Table-3 runs trained side by side, each (variant, run seed) in a worker process of its own.

On a CPU, XLA's thread pool keeps the cores busy only part of the time on these small models:
the stand-in's pretraining, measured on 2 cores, runs 1.7 steps/s alone and 1.35 steps/s each
with two at once (2.7 in all). The runs are independent given the stand-in, so `run_all`
trains and benchmarks them `processes` at a time, each exactly as the job would in its own
process (variants.train, variants.benchmark: same configs, seeds and sub-run files), and the
job then reads them back as it reads back a finished run. Each worker's console and logs go to
DIR/<variant>_seed<s>/log.txt. A worker whose job process dies (killed, preempted) stops too:
it sends itself SIGTERM, on which a training run saves a checkpoint and stops (the rerun of the
job resumes it), and exits.
"""

import concurrent.futures
import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from typing import Iterator, List, Tuple

import ml_collections

from metonymy import console
from metonymy.table3 import variants
from metonymy.workdir import Workdir

LOG_FILE = "log.txt"
# How often a worker checks that the job process is alive, and how long it then gives its run
# to save before it exits.
PARENT_CHECK_SECONDS = 2.0
SAVE_GRACE_SECONDS = 120.0
_job_process = None  # In a worker: the job process's pid (_stop_with_parent).


def process_count(requested: int, num_runs: int) -> int:
  """Worker processes for `num_runs` runs: `requested`, or for 0 two on a CPU backend with at
  least two cores and one on an accelerator (two processes would each claim its memory)."""
  if requested < 0:
    raise ValueError(f"config.run_processes={requested}: expected 0 (automatic) or a count >= 1.")
  if requested == 0:
    import jax
    requested = 2 if jax.default_backend() == "cpu" and (os.cpu_count() or 1) >= 2 else 1
  return max(1, min(requested, num_runs))


def log_path(workdir: Workdir, variant: str, seed: int) -> str:
  """DIR/<variant>_seed<s>/log.txt: what a worker printed for that run."""
  return os.path.join(os.fspath(variants.run_dir(workdir, variant, seed)), LOG_FILE)


@contextlib.contextmanager
def _output_to(path: str) -> Iterator[None]:
  """This process's stdout and stderr (file descriptors included, so the libraries' logs and
  progress bars too) appended to `path` while the block runs."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
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


def _train_and_benchmark(config_dict: dict, variant: str, seed: int, backbone: str,
                         workdir: str) -> None:
  """A worker's one run: the job's own train and benchmark steps, output (and the traceback of
  a failure, which is raised again in the job) to its log."""
  files = Workdir(workdir)
  with _output_to(log_path(files, variant, seed)):
    print(f"[table3 worker, pid {os.getpid()}] {variant}, run seed {seed}", flush=True)
    try:
      config = ml_collections.ConfigDict(config_dict)
      train_dir = variants.train(config, variant, seed, backbone, files)
      variants.benchmark(config, variant, seed, backbone, train_dir, files)
    except BaseException:
      traceback.print_exc()
      if os.getppid() != _job_process:  # Stopped by _stop_with_parent: nobody to report to.
        sys.stderr.flush()
        os._exit(1)
      raise


def run_all(config, runs: List[Tuple[int, str]], backbone: str, workdir: Workdir,
            processes: int) -> None:
  """Trains and benchmarks every (run seed, variant) of `runs` in `processes` worker processes,
  started in the order given (seed-major: an early stop leaves complete pairs), printing each
  run's end with an ETA. A failed run stops the rest and raises, naming its log."""
  start = time.perf_counter()
  # "spawn": a fresh interpreter per worker; forking a process whose JAX runtime has started
  # (the stand-in was loaded) is unsafe.
  context = multiprocessing.get_context("spawn")
  config_dict = config.to_dict()
  console.console(f"[table3] {len(runs)} runs in {processes} worker processes; each one's output "
                  f"in DIR/<variant>_seed<s>/{LOG_FILE}")
  with concurrent.futures.ProcessPoolExecutor(processes, mp_context=context,
                                              initializer=_stop_with_parent,
                                              initargs=(os.getpid(),)) as pool:
    futures = {pool.submit(_train_and_benchmark, config_dict, variant, int(seed), backbone,
                           os.fspath(workdir)): (variant, int(seed)) for seed, variant in runs}
    done = 0
    try:
      for future in concurrent.futures.as_completed(futures):
        variant, seed = futures[future]
        try:
          future.result()
        except BaseException as e:
          raise RuntimeError(f"Table-3 run {variant}, run seed {seed} failed ({e!r}); its output: "
                             f"{log_path(workdir, variant, seed)}") from e
        done += 1
        elapsed = time.perf_counter() - start
        eta = elapsed / done * (len(runs) - done)
        console.console(f"[table3] ({done}/{len(runs)}) trained and benchmarked {variant}, run "
                        f"seed {seed}; {elapsed / 60:.0f} min so far, ETA {eta / 60:.0f} min")
    except BaseException:
      for future in futures:
        future.cancel()
      raise
