"""Device mesh, shardings and global batches: data parallel, with optional FSDP.

Mesh axes ("data", "fsdp"). The batch is split over both axes (every device gets B / devices
examples). Parameters, optimizer state and the frozen backbone are replicated, except that with
fsdp > 1 every array of at least `min_size` elements is split along "fsdp" on its largest axis
that divides evenly (ZeRO-3 style: XLA gathers it for the forward pass). Adam's moments have
their parameter's shape, so the same rule shards them like their parameter.
"""

from typing import Any, Dict

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

BATCH_AXES = ("data", "fsdp")


def make_mesh(mesh_config) -> Mesh:
  """Mesh of shape (data, fsdp) over all devices; data = -1 takes what fsdp leaves."""
  devices = jax.device_count()
  fsdp = int(mesh_config.fsdp)
  data = int(mesh_config.data)
  if fsdp < 1 or devices % fsdp:
    raise ValueError(f"config.mesh.fsdp={fsdp} must be >= 1 and divide the {devices} devices.")
  if data == -1:
    data = devices // fsdp
  if data * fsdp != devices:
    raise ValueError(f"config.mesh.data * config.mesh.fsdp = {data} * {fsdp} must equal the "
                     f"number of devices, {devices} (data = -1 fills it).")
  auto = (jax.sharding.AxisType.Auto,) * 2
  return jax.make_mesh((data, fsdp), BATCH_AXES, axis_types=auto)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) axis split over every device."""
  return NamedSharding(mesh, P(BATCH_AXES))


def _fsdp_spec(shape, fsdp: int, min_size: int) -> P:
  if fsdp == 1 or int(np.prod(shape, dtype=np.int64)) < min_size:
    return P()
  for axis in np.argsort(shape)[::-1]:
    if shape[axis] % fsdp == 0:
      spec = [None] * len(shape)
      spec[axis] = "fsdp"
      return P(*spec)
  return P()


def state_shardings(mesh: Mesh, abstract_tree, min_size: int):
  """NamedSharding for every leaf of a tree of arrays / ShapeDtypeStructs (see module doc)."""
  fsdp = mesh.shape["fsdp"]
  return jax.tree_util.tree_map(
      lambda x: NamedSharding(mesh, _fsdp_spec(tuple(x.shape), fsdp, min_size)), abstract_tree)


def global_batch(host_batch: Dict[str, np.ndarray], sharding: NamedSharding) -> Dict[str, Any]:
  """This process's examples -> global jax.Arrays split over the mesh's batch axes."""
  return {key: jax.make_array_from_process_local_data(sharding, np.asarray(value))
          for key, value in host_batch.items()}
