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


def restore(mngr: ocp.CheckpointManager, step: int, abstract_state, data_iterator):
  """The train state saved at `step`, laid out like `abstract_state` (ShapeDtypeStructs with
  shardings); `data_iterator` is moved to the saved position in place."""
  restored = mngr.restore(step, args=ocp.args.Composite(
      params=ocp.args.StandardRestore(abstract_state.params),
      opt_state=ocp.args.StandardRestore(abstract_state.opt_state),
      progress=ocp.args.StandardRestore({"step": abstract_state.step, "rng": abstract_state.rng}),
      data=grain.checkpoint.CheckpointRestore(data_iterator)))
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
