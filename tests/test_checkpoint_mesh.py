"""Orbax sharded checkpoints restore onto a different device mesh.

Both tests run in a subprocess with 8 virtual CPU devices (like test_train's 8-device test):
  1. a sharded train state saved by run_state.save on a data=2 x fsdp=4 mesh comes back
     bit-identical, laid out exactly as asked, on other meshes (8 x 1, 1 x 8, 4 x 2, the same
     shape over other devices) and on a single device; the Grain iterator's position comes back
     too;
  2. a training run stopped after K steps on data=4 x fsdp=2 and resumed in the same workdir on
     data=8 x fsdp=1 (and, from a copy, on data=2 x fsdp=4) follows an uninterrupted 2K-step
     fsdp=1 run.
"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath

from metonymy.training import run_state
from tests.helpers import compile_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIN_SIZE = 64  # config.mesh.fsdp_min_size for both tests: small arrays get split too.


def _run_on_eight_devices(script, *args, timeout=600):
  env = compile_cache.process_env(8)
  proc = subprocess.run([sys.executable, "-c", script, ROOT, *map(str, args)], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=timeout)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
  line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1]
  return json.loads(line[len("RESULT "):]), proc


# ------------------------------------------------------------------------------------------------
# 1. A sharded state, saved on 2 x 4, restored onto other meshes.

_ARRAYS = r"""
import json, sys
import jax
import jax.numpy as jnp
import numpy as np
assert jax.device_count() == 8, jax.devices()
root, workdir, min_size = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, root)
import grain
import ml_collections
import optax
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding
from metonymy.training import trainer
from metonymy.training import run_state, sharding
from metonymy.workdir import trained_params as workdir_checkpoints


def mesh(data, fsdp):
  return sharding.make_mesh(ml_collections.ConfigDict({"data": data, "fsdp": fsdp}))


def iterator():
  return iter(grain.MapDataset.range(100).shuffle(seed=0).batch(4).to_iter_dataset())


# A TrainState like the trainer's: float32 and bfloat16 parameters (some split by the FSDP rule,
# some not), AdamW moments with non-zero values, an int32 step and a uint32 key.
rng = np.random.default_rng(0)
params = {"w": rng.standard_normal((16, 64)).astype(np.float32),
          "v": rng.standard_normal((40, 6)).astype(np.float32),
          "u": rng.standard_normal((20, 12)).astype(np.float32),
          "t": rng.standard_normal((6, 14)).astype(jnp.bfloat16),
          "b": rng.standard_normal((7,)).astype(np.float32)}
tx = optax.adamw(1e-2)
opt_state = tx.init(params)
_, opt_state = tx.update(jax.tree.map(lambda p: p * 0.5 + 0.25, params), opt_state, params)
state = trainer.TrainState(step=jnp.int32(7), params=params, opt_state=opt_state,
                         rng=jax.random.PRNGKey(3))
host = jax.device_get(state)
host_leaves, treedef = jax.tree_util.tree_flatten(host)
paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(host)[0]]
assert any(x.dtype == jnp.bfloat16 for x in host_leaves)
assert np.abs(np.asarray(host.opt_state[0].nu["w"])).min() > 0  # moments really saved


def shard_shapes(tree):
  # {path: shard shape} for the parameters and Adam moments; every shard of a leaf has it.
  out = {}
  for path, leaf in zip(paths, jax.tree_util.tree_leaves(tree)):
    shapes = {tuple(s.data.shape) for s in leaf.addressable_shards}
    assert len(shapes) == 1, (path, shapes)
    out[path] = list(shapes.pop())
  return out


# Save on data=2 x fsdp=4, through the trainer's own save (async, Composite of 4 items).
source_mesh = mesh(2, 4)
saved = jax.device_put(state, sharding.state_shardings(source_mesh, state, min_size))
result = {"source": shard_shapes(saved)}
data = iterator()
for _ in range(3):
  next(data)
mngr = run_state.manager(workdir)
run_state.save(mngr, saved, data)
mngr.wait_until_finished()
# Orbax recorded the layout it was given: split over "fsdp" of a 2 x 4 mesh, not gathered.
meta = mngr.item_metadata(7)["params"]
result["saved_specs"] = {k: [list(map(int, m.sharding.shape)), list(m.sharding.partition_spec)]
                         for k, m in meta.items()}
mngr.close()
expected_next = next(data)  # what the restored iterator must give next

reversed_mesh = Mesh(np.array(jax.devices()[::-1]).reshape(2, 4), sharding.BATCH_AXES,
                     axis_types=(jax.sharding.AxisType.Auto,) * 2)
targets = {
    "data8_fsdp1": sharding.state_shardings(mesh(8, 1), state, min_size),
    "data1_fsdp8": sharding.state_shardings(mesh(1, 8), state, min_size),
    "data4_fsdp2": sharding.state_shardings(mesh(4, 2), state, min_size),
    "data2_fsdp4_reversed_devices": sharding.state_shardings(reversed_mesh, state, min_size),
    "device5": jax.tree.map(lambda _: SingleDeviceSharding(jax.devices()[5]), state),
}


def check_leaf(name, path, leaf, want, target):
  where = f"{name} {path}"
  assert isinstance(leaf, jax.Array), (where, type(leaf))
  assert leaf.dtype == want.dtype and leaf.shape == want.shape, (where, leaf.dtype, leaf.shape)
  assert leaf.sharding == target, (where, leaf.sharding, target)
  assert {s.device for s in leaf.addressable_shards} == target.device_set, where
  assert len(leaf.addressable_shards) == len(target.device_set), where
  for shard in leaf.addressable_shards:  # every shard holds exactly its slice, bit for bit
    assert shard.data.shape == target.shard_shape(want.shape), where
    got = np.asarray(shard.data)
    assert got.dtype == want.dtype and got.tobytes() == np.asarray(want[shard.index]).tobytes(), (
        where, shard.index)
  assert np.asarray(leaf).tobytes() == np.asarray(want).tobytes(), where


for name, target_sh in targets.items():
  target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        state, target_sh)
  data = iterator()
  mngr = run_state.manager(workdir)
  restored = run_state.restore(mngr, 7, target, data)
  mngr.close()
  assert jax.tree_util.tree_structure(restored) == treedef, name
  for path, leaf, want, s in zip(paths, jax.tree_util.tree_leaves(restored), host_leaves,
                                 jax.tree_util.tree_leaves(target_sh)):
    check_leaf(name, path, leaf, want, s)
  assert int(restored.step) == 7, name
  np.testing.assert_array_equal(next(data), expected_next, err_msg=name)
  result[name] = shard_shapes(restored)

# Parameters alone (what models' from_workdir loaders use): sharded, and without shardings
# (the default device).
params_target = {k: jax.ShapeDtypeStruct(v.shape, v.dtype,
                                         sharding=targets["data1_fsdp8"].params[k])
                 for k, v in params.items()}
restored, step = workdir_checkpoints.restore_params(workdir, params_target)
assert step == 7
for k, leaf in restored.items():
  check_leaf("restore_params 1x8", k, leaf, host.params[k], params_target[k].sharding)
plain = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in params.items()}
restored, _ = workdir_checkpoints.restore_params(workdir, plain)
for k, leaf in restored.items():
  check_leaf("restore_params default", k, leaf, host.params[k],
             SingleDeviceSharding(jax.devices()[0]))
print("RESULT " + json.dumps(result))
"""

_SOURCE = {"w": [16, 16], "v": [10, 6], "u": [5, 12], "t": [6, 14], "b": [7]}
# Shard shape of each parameter (and of its two Adam moments) per target: the FSDP rule splits
# an array of >= MIN_SIZE elements over "fsdp" on its largest axis that fsdp divides.
_EXPECTED_PARAMS = {
    "source": _SOURCE,
    "data8_fsdp1": {"w": [16, 64], "v": [40, 6], "u": [20, 12], "t": [6, 14], "b": [7]},
    "data1_fsdp8": {"w": [16, 8], "v": [5, 6], "u": [20, 12], "t": [6, 14], "b": [7]},
    "data4_fsdp2": {"w": [16, 32], "v": [20, 6], "u": [10, 12], "t": [6, 7], "b": [7]},
    "data2_fsdp4_reversed_devices": _SOURCE,
    "device5": {"w": [16, 64], "v": [40, 6], "u": [20, 12], "t": [6, 14], "b": [7]},
}


@pytest.mark.slow
def test_sharded_state_restores_onto_other_meshes_and_one_device(tmp_path):
  result, _ = _run_on_eight_devices(_ARRAYS, tmp_path, MIN_SIZE)
  assert result.pop("saved_specs") == {
      "w": [[2, 4], [None, "fsdp"]], "v": [[2, 4], ["fsdp", None]],
      "u": [[2, 4], ["fsdp", None]], "t": [[2, 4], []], "b": [[2, 4], []]}
  assert sorted(result) == sorted(_EXPECTED_PARAMS)
  for name, shapes in result.items():
    for group in (".params", ".opt_state[0].mu", ".opt_state[0].nu"):
      got = {k[len(group) + 2:-2]: v for k, v in shapes.items() if k.startswith(group + "[")}
      assert got == _EXPECTED_PARAMS[name], (name, group, got)
    for scalar in (".step", ".opt_state[0].count"):
      assert shapes[scalar] == [], (name, scalar)
    assert shapes[".rng"] == [2], name


# ------------------------------------------------------------------------------------------------
# 2. Stop a run on data=4 x fsdp=2 after K steps; resume it on 8 x 1 and on 2 x 4.

K = 5

_RESUME = r"""
import json, shutil, sys
import jax
assert jax.device_count() == 8, jax.devices()
root, workdir, k, min_size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
sys.path.insert(0, root)
from tests import test_train as t
from metonymy.training import trainer
from metonymy.training import sharding


def config(fsdp):
  # 2K steps, checkpoints at K and 2K; every run has the same cosine schedule over 2K steps.
  config = t._config(2 * k)
  config.mesh.data, config.mesh.fsdp, config.mesh.fsdp_min_size = -1, fsdp, min_size
  config.trainer.checkpoint_every_steps = k
  return config


real = sharding.global_batch
calls = {"n": 0}


def stops_at_batch_k_plus_1(*args, **kwargs):  # steps 1..K run and step K is checkpointed
  calls["n"] += 1
  if calls["n"] == k + 1:
    raise KeyboardInterrupt("simulated stop")
  return real(*args, **kwargs)


sharding.global_batch = stops_at_batch_k_plus_1
try:
  trainer.run(config(2), workdir + "/fsdp2_then_1")
  raise AssertionError("the run was not stopped")
except KeyboardInterrupt:
  pass
sharding.global_batch = real
shutil.copytree(workdir + "/fsdp2_then_1", workdir + "/fsdp2_then_4")
print("RESUMING", flush=True)
trainer.run(config(1), workdir + "/fsdp2_then_1")
trainer.run(config(4), workdir + "/fsdp2_then_4")
trainer.run(config(1), workdir + "/uninterrupted_fsdp1")
print("RESULT " + json.dumps({}))
"""


def _logged_steps(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [row["step"] for row in map(json.loads, f) if "loss" in row]


def _checkpoint_layout(workdir, step):
  """{parameter path: (mesh shape, partition spec)} as Orbax recorded it for the "params" item
  at `step` (read without restoring anything)."""
  path = epath.Path(run_state.directory(workdir)) / str(step) / "params"
  meta = ocp.StandardCheckpointHandler().metadata(path).tree
  return {jax.tree_util.keystr(p): (tuple(map(int, m.sharding.shape)),
                                    tuple(m.sharding.partition_spec))
          for p, m in jax.tree_util.tree_flatten_with_path(meta)[0]}


def _fsdp_layout(mesh_shape):
  """The stage-1 model's parameters under the FSDP rule at MIN_SIZE for fsdp = 2 or 4 (the head
  bias has 65 elements: no fsdp divides it)."""
  return {"['head']['bias']": (mesh_shape, ()),
          "['head']['kernel']": (mesh_shape, ("fsdp", None)),  # [64, 65]
          "['norm']['bias']": (mesh_shape, ("fsdp",)),
          "['norm']['scale']": (mesh_shape, ("fsdp",)),
          "['prototypes']": (mesh_shape, (None, "fsdp"))}  # [6, 64]


@pytest.mark.slow
def test_training_resumes_onto_a_different_mesh(tmp_path):
  from tests import test_train as t  # its helpers only (this module runs no test of it)
  _, proc = _run_on_eight_devices(_RESUME, tmp_path, K, MIN_SIZE)
  out = proc.stdout.split("RESUMING")
  assert "on 8 device(s) {'data': 4, 'fsdp': 2}" in out[0]
  resumed = out[1].split("Resumed from step")
  assert len(resumed) == 3, out[1]  # both resumes, and the reference did not resume
  assert resumed[1].startswith(f" {K} ") and "{'data': 8, 'fsdp': 1}" in resumed[1]
  assert resumed[2].startswith(f" {K} ") and "{'data': 2, 'fsdp': 4}" in resumed[2]

  split1, split4 = str(tmp_path / "fsdp2_then_1"), str(tmp_path / "fsdp2_then_4")
  reference = str(tmp_path / "uninterrupted_fsdp1")
  steps = list(range(1, 2 * K + 1))
  for workdir in (split1, split4, reference):  # each step logged once: no replay, no gap
    assert _logged_steps(workdir) == steps, workdir
    mngr = run_state.manager(workdir)
    assert mngr.all_steps() == [K, 2 * K], workdir
    mngr.close()

  # Step K was saved split over the fsdp=2 mesh; step 2K over each resumed run's own mesh.
  assert _checkpoint_layout(split1, K) == _fsdp_layout((4, 2))
  assert _checkpoint_layout(split4, K) == _fsdp_layout((4, 2))
  assert _checkpoint_layout(split4, 2 * K) == _fsdp_layout((2, 4))
  assert _checkpoint_layout(split1, 2 * K) == {k: ((8, 1), ()) for k in _fsdp_layout(None)}

  # Same trajectory as the uninterrupted run, up to float32 reduction order (the 8-device test
  # measures < 5e-6 relative over the first 10 steps). Restarting the data, the RNG or the
  # optimizer at step K would move the losses by far more.
  expected = t._losses(reference)
  for workdir in (split1, split4):
    got = t._losses(workdir)
    a, b = np.array([got[s] for s in steps]), np.array([expected[s] for s in steps])
    np.testing.assert_allclose(a, b, rtol=1e-5, err_msg=workdir)
    # Final parameters, restored onto this 1-device process from the 8-device checkpoints.
    for step in (K, 2 * K):
      mine, theirs = t._params(workdir, step), t._params(reference, step)
      leaves = jax.tree_util.tree_leaves(mine)
      assert len(leaves) == len(jax.tree_util.tree_leaves(theirs)) > 0
      for x, y in zip(leaves, jax.tree_util.tree_leaves(theirs)):
        x, y = np.asarray(x), np.asarray(y)
        assert x.shape == y.shape and x.dtype == y.dtype
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5 * np.abs(y).max(),
                                   err_msg=f"{workdir} step {step}")
