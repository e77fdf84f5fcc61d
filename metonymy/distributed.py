"""Multi-host start-up: `jax.distributed.initialize()` when the job spans several processes.

JAX auto-detects SLURM, Cloud TPU and Kubernetes (JobSet) clusters; elsewhere the coordinator is
given explicitly (`--coordinator_address`, `--num_processes`, `--process_id`, or the
`METONYMY_COORDINATOR` / `METONYMY_NUM_PROCESSES` / `METONYMY_PROCESS_ID` environment variables
that `launch/local.sh` sets). A single process on one machine initializes nothing.
"""

import os
from typing import Optional

import jax
from absl import logging


def _cluster_detected() -> bool:
  env = os.environ
  if int(env.get("SLURM_NTASKS", "1")) > 1 and "SLURM_JOB_ID" in env:
    return True
  if env.get("TPU_WORKER_HOSTNAMES") and "," in env["TPU_WORKER_HOSTNAMES"]:
    return True  # A multi-host Cloud TPU slice.
  return "JOBSET_NAME" in env or "MEGASCALE_COORDINATOR_ADDRESS" in env


def initialize(coordinator_address: Optional[str] = None, num_processes: Optional[int] = None,
               process_id: Optional[int] = None) -> bool:
  """Starts JAX's distributed runtime if this is one process of many; returns whether it did.

  Must run before any computation touches a JAX backend.
  """
  env = os.environ
  coordinator_address = coordinator_address or env.get("METONYMY_COORDINATOR")
  if num_processes is None and "METONYMY_NUM_PROCESSES" in env:
    num_processes = int(env["METONYMY_NUM_PROCESSES"])
  if process_id is None and "METONYMY_PROCESS_ID" in env:
    process_id = int(env["METONYMY_PROCESS_ID"])
  if coordinator_address:
    if num_processes is None or process_id is None:
      raise ValueError("An explicit coordinator needs num_processes and process_id too "
                       f"(got {num_processes!r}, {process_id!r}).")
    jax.distributed.initialize(coordinator_address, num_processes, process_id)
  elif _cluster_detected():
    jax.distributed.initialize()
  else:
    return False
  logging.info("jax.distributed: process %d of %d, %d local / %d global devices",
               jax.process_index(), jax.process_count(), jax.local_device_count(),
               jax.device_count())
  return True


def is_main_process() -> bool:
  """Process 0 writes logs, metric files and reports; every process writes its checkpoint shards."""
  return jax.process_index() == 0
