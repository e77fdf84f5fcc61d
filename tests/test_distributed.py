"""Which GPUs a SLURM task takes (distributed.slurm_local_device_ids): JAX's own rule,
[SLURM_LOCALID], is an invalid device ordinal once SLURM binds GPUs to tasks."""

from metonymy import distributed


def _env(localid, visible, **extra):
  env = {"SLURM_JOB_ID": "1", "SLURM_NTASKS": "16", "SLURM_LOCALID": str(localid),
         "SLURM_NTASKS_PER_NODE": "8", **extra}
  if visible is not None:
    env["CUDA_VISIBLE_DEVICES"] = visible
  return env


def test_a_task_bound_to_one_gpu_takes_device_0_whatever_its_local_id():
  # --gpus-per-task=1: task 3 sees one GPU (physical 3) as its device 0.
  assert distributed.slurm_local_device_ids(_env(3, "3")) == [0]
  assert distributed.slurm_local_device_ids(_env(7, "0")) == [0]


def test_a_task_bound_to_several_gpus_takes_all_it_sees():
  env = _env(1, "2,3", SLURM_NTASKS_PER_NODE="4")  # --gpus-per-task=2, 4 tasks a node
  assert distributed.slurm_local_device_ids(env) == [0, 1]


def test_unbound_tasks_that_see_the_whole_node_take_their_local_id():
  assert distributed.slurm_local_device_ids(_env(5, "0,1,2,3,4,5,6,7")) == [5]
  env = _env(2, "0,1,2,3", SLURM_NTASKS_PER_NODE="", SLURM_TASKS_PER_NODE="4(x2)")
  assert distributed.slurm_local_device_ids(env) == [2]


def test_no_visible_devices_or_no_slurm_leaves_jax_its_own_choice():
  assert distributed.slurm_local_device_ids(_env(3, None)) is None
  assert distributed.slurm_local_device_ids({"CUDA_VISIBLE_DEVICES": "0"}) is None
