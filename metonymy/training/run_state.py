"""Orbax checkpoints of a training run: `WORKDIR/checkpoints/<step>/`, and the workdir layout.

Items of one checkpoint:
  params     the trainable parameters (the frozen backbone is not saved: it is reloaded from
             config.backbone, or from WORKDIR/backbone for a random-init backbone)
  opt_state  the optimizer state
  progress   {"step": int32, "rng": uint32 [2]} (the run's base key; step keys are
             fold_in(rng, step), so they need no saving of their own)
  data       the Grain training iterator's position

Saving is asynchronous; a checkpoint only counts once Orbax finalized it, so a run killed during
a save resumes from the previous one. Before each save the checkpoint directory is probed (a
directory made and removed), so an unwritable one ends the run with an OSError naming it, where
Orbax's own directory creation would fail in a background thread and leave the save waiting
forever.

A checkpoint holding a NaN or Inf is never resumed from (the trainer never writes one: it checks
the updated state first), nor is one with a truncated or missing file when an older one reads:
`restore_newest_finite` refuses it with a warning naming its step (and the file), moves it to
WORKDIR/refused_checkpoints/<step> for inspection, and restores the newest usable one.

Arrays restore onto whatever mesh the resuming run has (another device count, another FSDP
split). The data position is saved per process; resumed with another number of processes, the
position comes from the step instead: the training stream is the same for any process count
(data/pipeline.py), and every process's iterator has consumed exactly one batch per step.
"""

import os
import uuid
from typing import Optional

from absl import logging
from etils import epath
import grain
import jax
from jax.experimental import multihost_utils
import orbax.checkpoint as ocp

from metonymy.workdir import Workdir
from metonymy.workdir import layout
from metonymy.workdir import trained_params

all_finite = trained_params.all_finite
_all_finite_jit = trained_params.all_finite_jit


def directory(workdir) -> epath.Path:
  return Workdir(workdir).checkpoints


def check_writable(path) -> None:
  """Raises OSError naming `path` unless a directory can be created in it (it is created first).

  Orbax creates a step's directory in a background thread; when that fails (the path is a file,
  read-only, permission denied) the save waits forever for a signal that never comes. This
  probe, done the same way just before each save, turns that into an immediate error. (An
  object store has no directories to fail on: there it only checks nothing.)"""
  if not layout.is_local(path):
    return
  path = os.fspath(path)
  probe = os.path.join(path, f".write-probe-{jax.process_index()}-{uuid.uuid4().hex[:8]}")
  try:
    os.makedirs(path, exist_ok=True)
    os.mkdir(probe)
    os.rmdir(probe)
  except OSError as e:
    raise OSError(e.errno, f"Cannot save checkpoints: the checkpoint directory {path} is not a "
                           f"writable directory ({type(e).__name__}: {e}). Fix or remove it; the "
                           f"checkpoints already in it are untouched.") from e


def manager(workdir, max_to_keep: Optional[int] = 2) -> ocp.CheckpointManager:
  check_writable(directory(workdir))
  options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                         enable_async_checkpointing=True)
  return ocp.CheckpointManager(directory(workdir), options=options)


def save(mngr: ocp.CheckpointManager, state, data_iterator) -> None:
  """Starts saving `state` (a train.TrainState) and the iterator at step `state.step`."""
  step = int(jax.device_get(state.step))
  check_writable(mngr.directory)
  mngr.save(step, args=ocp.args.Composite(
      params=ocp.args.StandardSave(state.params),
      opt_state=ocp.args.StandardSave(state.opt_state),
      progress=ocp.args.StandardSave({"step": state.step, "rng": state.rng}),
      data=grain.checkpoint.CheckpointSave(data_iterator)))


def _data_saved_by_this_process(mngr: ocp.CheckpointManager, step: int) -> bool:
  """Whether `step`'s data item holds this process's iterator state (Grain's per-process file)."""
  name = f"process_{jax.process_index()}-of-{jax.process_count()}.json"
  return (epath.Path(mngr.directory) / str(step) / "data" / name).exists()


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


def _refuse(mngr: ocp.CheckpointManager, step: int) -> None:
  """Moves `step` out of the checkpoint directory (process 0), so that it is neither resumed from
  nor in the way of the step's next save; every process then re-reads the step list."""
  directory_ = epath.Path(mngr.directory)
  refused = _refused_path(mngr, step)
  if jax.process_index() == 0:
    refused.parent.mkdir(parents=True, exist_ok=True)
    target, n = refused, 1
    while target.exists():
      target, n = refused.parent / f"{refused.name}.{n}", n + 1
    (directory_ / str(step)).rename(target)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(f"metonymy_refuse_checkpoint_{step}")
  mngr.reload()


def _refused_path(mngr: ocp.CheckpointManager, step: int) -> epath.Path:
  """Where `_refuse` moves `step`: the workdir holding the manager's directory (WORKDIR/
  checkpoints) keeps it in refused_checkpoints/<step> (layout.Workdir.refused_checkpoint)."""
  return Workdir(epath.Path(mngr.directory).parent).refused_checkpoint(step)


def _unreadable_reason(error: BaseException, step_dir: str) -> str:
  """One line saying which file of a checkpoint could not be read and why, from an exception
  chain (TensorStore names the OCDBT database and the array; other errors name the file)."""
  chain, e = [], error
  while e is not None and e not in chain:
    chain.append(e)
    e = e.__cause__ or e.__context__
  for e in chain:  # The first message that names a file inside the step's directory.
    text = str(e).splitlines()[0] if str(e) else ""
    if step_dir in text or getattr(e, "filename", None):
      return f"{type(e).__name__}: {text[:400]}"
  text = str(error).splitlines()[0] if str(error) else ""
  return f"{type(error).__name__}: {text[:400]} (somewhere under {step_dir})"


def restore_newest_finite(mngr: ocp.CheckpointManager, abstract_state, data_iterator):
  """(state, step, refused) for the newest checkpoint that reads and whose parameters and
  optimizer state are all finite, or (None, None, refused) when there is none.

  A newer checkpoint that holds a NaN or Inf, or that cannot be read while an older one can (a
  truncated or missing file: the older one reading shows the run itself fits the checkpoints),
  is refused with a warning naming its step and the file, moved to
  WORKDIR/refused_checkpoints/<step> (kept for inspection, out of the way of the step's next
  save), and listed in `refused` as (step, reason). When no checkpoint reads at all, nothing is
  moved and a ValueError names every step's error."""
  refused, unreadable = [], []  # unreadable: (step, reason, error), newest first.
  directory_ = str(mngr.directory)

  def refuse(step, reason):
    logging.warning("Refusing checkpoint step %d in %s: %s. Moved to %s; resuming from the "
                    "newest usable checkpoint instead.", step, directory_, reason,
                    os.fspath(_refused_path(mngr, step)))
    _refuse(mngr, step)
    refused.append((step, reason))

  for step in sorted(mngr.all_steps(), reverse=True):
    try:
      state = restore(mngr, step, abstract_state, data_iterator)
    except Exception as e:  # pylint: disable=broad-except  (TensorStore, JSON, OS errors, ...)
      reason = _unreadable_reason(e, os.path.join(directory_, str(step)))
      unreadable.append((step, f"it cannot be read ({reason})", e))
      continue
    for bad_step, reason, _ in unreadable:
      refuse(bad_step, reason)
    unreadable = []
    if bool(jax.device_get(_all_finite_jit((state.params, state.opt_state)))):
      return state, step, refused
    refuse(step, "it holds NaN/Inf values")
  if unreadable:
    listed = "; ".join(f"step {s}: {r}" for s, r, _ in unreadable)
    raise ValueError(
        f"No checkpoint in {directory_} can be restored into this run ({listed}). When every "
        f"checkpoint fails, the run is the likelier cause (another model, K or backbone than the "
        f"one that wrote them: compare with the workdir's config.json); nothing was moved."
    ) from unreadable[0][2]
  return None, None, refused
