"""Multi-host start-up: `jax.distributed.initialize()` when the job spans several processes.

JAX auto-detects SLURM, Cloud TPU and Kubernetes (JobSet) clusters (under SLURM with the GPUs
bound to tasks, this module names each task's devices: `slurm_local_device_ids`); elsewhere the
coordinator is given explicitly (`--coordinator_address`, `--num_processes`, `--process_id`, or the
`METONYMY_COORDINATOR` / `METONYMY_NUM_PROCESSES` / `METONYMY_PROCESS_ID` environment variables
that `launch/local.sh` sets). A single process on one machine initializes nothing.
"""

import os
from typing import List, Optional

import jax
from absl import logging


def _cluster_detected() -> bool:
  env = os.environ
  if int(env.get("SLURM_NTASKS", "1")) > 1 and "SLURM_JOB_ID" in env:
    return True
  if env.get("TPU_WORKER_HOSTNAMES") and "," in env["TPU_WORKER_HOSTNAMES"]:
    return True  # A multi-host Cloud TPU slice.
  return "JOBSET_NAME" in env or "MEGASCALE_COORDINATOR_ADDRESS" in env


def _tasks_on_this_node(env) -> Optional[int]:
  """SLURM's task count on this node: SLURM_NTASKS_PER_NODE, else SLURM_TASKS_PER_NODE's entry
  for the first node group ("8(x2),4" -> 8; this node's share when the job is regular)."""
  if env.get("SLURM_NTASKS_PER_NODE", "").isdigit():
    return int(env["SLURM_NTASKS_PER_NODE"])
  first = env.get("SLURM_TASKS_PER_NODE", "").split(",")[0].split("(")[0]
  return int(first) if first.isdigit() else None


def slurm_local_device_ids(env) -> Optional[List[int]]:
  """The GPUs of this SLURM task as indices among the devices it can see, or None for JAX's
  own choice.

  JAX's SLURM detection takes local device [SLURM_LOCALID]: right when every task of a node
  sees all of the node's GPUs, wrong when SLURM binds GPUs to tasks (`--gpus-per-task=1`,
  `--gpu-bind`): then task 3 sees one device, index 0, and device 3 is "invalid device ordinal"
  (JAX issues #28194, #23452). So a task whose CUDA_VISIBLE_DEVICES (ROCR_VISIBLE_DEVICES on AMD)
  holds its own share takes every device it sees; one that sees as many devices as the node has
  tasks takes its local id, as JAX would.
  """
  visible = env.get("CUDA_VISIBLE_DEVICES") or env.get("ROCR_VISIBLE_DEVICES")
  if not visible or "SLURM_LOCALID" not in env:
    return None
  count = len([d for d in visible.split(",") if d.strip()])
  tasks = _tasks_on_this_node(env)
  if tasks is not None and tasks > 1 and count == tasks:
    return [int(env["SLURM_LOCALID"])]  # Unbound: every task sees the whole node.
  return list(range(count))  # Bound: this task's own devices, whatever their global numbers.


def initialize(coordinator_address: Optional[str] = None, num_processes: Optional[int] = None,
               process_id: Optional[int] = None) -> bool:
  """Starts JAX's distributed runtime if this is one process of many; returns whether it did.

  Must run before any computation touches a JAX backend; a second call (a second run started in
  the same process) finds the runtime started and leaves it.
  """
  if jax.distributed.is_initialized():
    return True
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
    jax.distributed.initialize(local_device_ids=slurm_local_device_ids(env))
  else:
    return False
  logging.info("jax.distributed: process %d of %d, %d local / %d global devices",
               jax.process_index(), jax.process_count(), jax.local_device_count(),
               jax.device_count())
  return True


def is_main_process() -> bool:
  """Process 0 writes logs, metric files and reports; every process writes its checkpoint shards."""
  return jax.process_index() == 0
