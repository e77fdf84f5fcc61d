"""Orbax checkpoints of a training run: `WORKDIR/checkpoints/<step>/`, and the workdir layout.

Items of one checkpoint:
  params     the trainable parameters (the frozen backbone is not saved: it is reloaded from
             config.backbone, or from WORKDIR/backbone for a random-init backbone)
  opt_state  the optimizer state
  progress   {"step": int32, "rng": uint32 [2]} (the run's base key; step keys are
             fold_in(rng, step), so they need no saving of their own)
  data       the Grain training iterator's position

Saving is asynchronous; a checkpoint only counts once Orbax finalized it, so a run killed during
a save resumes from the previous one.

Arrays restore onto whatever mesh the resuming run has (another device count, another FSDP
split). The data position is saved per process; resumed with another number of processes, the
position comes from the step instead: the training stream is the same for any process count
(data/pipeline.py), and every process's iterator has consumed exactly one batch per step.
"""

import os
from typing import Any, Optional, Tuple

import grain
import jax
import orbax.checkpoint as ocp

CHECKPOINT_DIR = "checkpoints"
# Written by the trainer at the start of a run: what a model's loader (e.g.
# models/stage1.PartMasks.from_workdir) needs to rebuild the model without the dataset.
MODEL_FILE = "model.json"
# A random-init frozen backbone is saved here (converted-checkpoint layout), so resuming and
# loading never re-draw it.
BACKBONE_DIR = "backbone"


def directory(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR)


def manager(workdir: str, max_to_keep: Optional[int] = 2) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                         enable_async_checkpointing=True)
  return ocp.CheckpointManager(directory(workdir), options=options)


def save(mngr: ocp.CheckpointManager, state, data_iterator) -> None:
  """Starts saving `state` (a train.TrainState) and the iterator at step `state.step`."""
  step = int(jax.device_get(state.step))
  mngr.save(step, args=ocp.args.Composite(
      params=ocp.args.StandardSave(state.params),
      opt_state=ocp.args.StandardSave(state.opt_state),
      progress=ocp.args.StandardSave({"step": state.step, "rng": state.rng}),
      data=grain.checkpoint.CheckpointSave(data_iterator)))


def _data_saved_by_this_process(mngr: ocp.CheckpointManager, step: int) -> bool:
  """Whether `step`'s data item holds this process's iterator state (Grain's per-process file)."""
  name = f"process_{jax.process_index()}-of-{jax.process_count()}.json"
  return os.path.exists(os.path.join(str(mngr.directory), str(step), "data", name))


def restore(mngr: ocp.CheckpointManager, step: int, abstract_state, data_iterator):
  """The train state saved at `step`, laid out like `abstract_state` (ShapeDtypeStructs with
  shardings); `data_iterator` is moved to the saved position in place."""
  items = dict(
      params=ocp.args.StandardRestore(abstract_state.params),
      opt_state=ocp.args.StandardRestore(abstract_state.opt_state),
      progress=ocp.args.StandardRestore({"step": abstract_state.step, "rng": abstract_state.rng}))
  same_processes = _data_saved_by_this_process(mngr, step)
  if same_processes:
    items["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
  restored = mngr.restore(step, args=ocp.args.Composite(**items))
  if not same_processes:  # Written by another number of processes: position from the step.
    state = data_iterator.get_state()
    if set(state) != {"next_index"}:
      raise ValueError(
          f"Checkpoint step {step} in {mngr.directory} was written by another number of "
          f"processes than this run's {jax.process_count()}, and this data iterator's state "
          f"({sorted(state)}) cannot be set from the step alone. Resume with the original "
          f"number of processes, or with config.data.worker_count=0.")
    data_iterator.set_state({"next_index": int(step)})
  progress = restored["progress"]
  return abstract_state.replace(step=progress["step"], rng=progress["rng"],
                                params=restored["params"], opt_state=restored["opt_state"])


def restore_params(workdir: str, abstract_params, step: Optional[int] = None) -> Tuple[Any, int]:
  """(params, step) of `workdir`'s latest checkpoint (or `step`), without the optimizer or data.

  `abstract_params`: the parameter tree as ShapeDtypeStructs (e.g. jax.eval_shape(model.init,
  ...)); without shardings the arrays land on the default device.
  """
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract_params = jax.tree_util.tree_map(
      lambda x: x if getattr(x, "sharding", None) is not None
      else jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), abstract_params)
  mngr = ocp.CheckpointManager(directory(workdir))
  try:
    steps = mngr.all_steps()
    if not steps:
      raise FileNotFoundError(f"No checkpoint in {directory(workdir)}.")
    if step is None:
      step = max(steps)
    elif step not in steps:
      raise FileNotFoundError(f"No checkpoint for step {step} in {directory(workdir)}; "
                              f"steps saved: {sorted(steps)}.")
    restored = mngr.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(abstract_params)))
    return restored["params"], int(step)
  finally:
    mngr.close()
