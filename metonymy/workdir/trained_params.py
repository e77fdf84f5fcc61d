"""Reading a workdir's Orbax checkpoints back without the training state: the parameters of the
latest (or a given) step, refusing any that hold NaN or Inf. The training run's own save and
restore, with the optimizer and the data iterator, is training/run_state.py."""

from typing import Any, Optional, Tuple

from absl import logging
import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from metonymy.workdir import layout
from metonymy.workdir.layout import Workdir


def all_finite(tree) -> jax.Array:
  """bool []: no NaN or Inf in any floating-point leaf of `tree` (integer leaves are skipped).
  Cheap inside a jitted step: one reduction per leaf."""
  leaves = [x for x in jax.tree_util.tree_leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
  if not leaves:
    return jnp.array(True)
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


all_finite_jit = jax.jit(all_finite)


def restore_params(workdir, abstract_params, step: Optional[int] = None) -> Tuple[Any, int]:
  """(params, step) of `workdir`'s latest checkpoint (or `step`), without the optimizer or data.

  `abstract_params`: the parameter tree as ShapeDtypeStructs (e.g. jax.eval_shape(model.init,
  ...)); without shardings the arrays land on the default device.
  """
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract_params = jax.tree_util.tree_map(
      lambda x: x if getattr(x, "sharding", None) is not None
      else jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), abstract_params)
  checkpoints = Workdir(workdir).checkpoints
  layout.refresh(checkpoints)  # Another process (the training run) may have saved since.
  mngr = ocp.CheckpointManager(checkpoints)
  try:
    steps = mngr.all_steps()
    if not steps:
      raise FileNotFoundError(f"No checkpoint in {checkpoints}.")
    if step is not None and step not in steps:
      raise FileNotFoundError(f"No checkpoint for step {step} in {checkpoints}; "
                              f"steps saved: {sorted(steps)}.")
    # The newest finite checkpoint (or exactly `step`); one with a NaN/Inf is refused.
    for candidate in ([step] if step is not None else sorted(steps, reverse=True)):
      restored = mngr.restore(candidate, args=ocp.args.Composite(
          params=ocp.args.StandardRestore(abstract_params)))
      if bool(jax.device_get(all_finite_jit(restored["params"]))):
        return restored["params"], int(candidate)
      logging.warning("Refusing checkpoint step %d in %s: its parameters hold NaN/Inf values.",
                      candidate, checkpoints)
    raise FloatingPointError(
        f"No checkpoint with finite parameters in {checkpoints} (tried steps "
        f"{[step] if step is not None else sorted(steps, reverse=True)}).")
  finally:
    mngr.close()
