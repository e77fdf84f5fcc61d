"""The host allocator's cost on a CPU: the same training steps under the system's malloc and under
jemalloc (metonymy/allocator.py), each in a process of its own, in one run.

  python -m metonymy.bench allocator [--steps 40] [--batch-size 32] [--image-size 64]

Each process trains the demo's stand-in architecture (patch 4, width 64, depth 4, 4 registers)
for `steps` SGD steps on fixed random images after a compiled warm-up step, one process at a
time, and reports its steps per second, its page faults per step (getrusage) and a checksum of
its final weights: the allocator must change the time, never the numbers.
"""

import json
import os
import resource
import subprocess
import sys
import time
from typing import Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np

from metonymy import allocator
from metonymy.models import vit

STAND_IN = vit.ViTConfig(patch_size=4, width=64, depth=4, num_heads=4, mlp_dim=128,
                         num_registers=4, pos_embed_grid=(16, 16), image_size=64)


def measure_steps(steps: int, batch_size: int, image_size: int) -> Dict[str, float]:
  """Steps/s, page faults a step and the final weights' checksum of `steps` SGD steps of the
  stand-in's ViT (squared norm of its tokens as the loss: every block's forward and backward),
  in this process."""
  model = vit.VisionTransformer(STAND_IN.replace(
      image_size=image_size, pos_embed_grid=(image_size // 4, image_size // 4)))
  images = jnp.asarray(np.random.default_rng(0).normal(
      size=(batch_size, image_size, image_size, 3)), jnp.float32)
  params = model.init(jax.random.PRNGKey(0), images[:1])["params"]

  def loss(p):
    out = model.apply({"params": p}, images)
    return jnp.mean(jnp.square(out["patch_tokens"])) + jnp.mean(jnp.square(out["prefix_tokens"]))

  @jax.jit
  def step(p):
    return jax.tree_util.tree_map(lambda w, g: w - 1e-3 * g, p, jax.grad(loss)(p))

  params = jax.block_until_ready(step(params))  # compile
  faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  start = time.perf_counter()
  for _ in range(steps):
    params = step(params)
  jax.block_until_ready(params)
  seconds = time.perf_counter() - start
  faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
  checksum = float(sum(np.float64(np.sum(np.abs(np.asarray(leaf))))
                       for leaf in jax.tree_util.tree_leaves(params)))
  return {"steps_per_s": steps / seconds, "faults_per_step": faults / steps,
          "checksum": checksum}


def _child(env: Dict[str, str], steps: int, batch_size: int, image_size: int) -> Dict:
  command = [sys.executable, "-m", "metonymy.bench", "allocator", "--child",
             f"--steps={steps}", f"--batch-size={batch_size}", f"--image-size={image_size}"]
  proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
  if proc.returncode:
    raise RuntimeError(f"allocator bench child failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def run(steps: int = 40, batch_size: int = 32, image_size: int = 64,
        library: Optional[str] = None) -> Dict:
  """Both allocators, system first (None for jemalloc when it is not installed)."""
  base = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF")}
  base[allocator.SWITCH] = "system"
  results = {"device": f"{jax.devices()[0].platform} x {os.cpu_count()} cores",
             "steps": steps, "batch_size": batch_size, "image_size": image_size,
             "system": _child(base, steps, batch_size, image_size), "jemalloc": None}
  library = allocator.find_jemalloc(os.environ) if library is None else library
  if library:
    results["jemalloc"] = _child(allocator.jemalloc_env(base, library), steps, batch_size,
                                 image_size)
  return results


def format_result(results: Dict) -> str:
  system, jemalloc = results["system"], results["jemalloc"]
  lines = [f"stand-in ViT training steps, batch {results['batch_size']} at "
           f"{results['image_size']} px, {results['steps']} steps ({results['device']})",
           f"  system malloc: {system['steps_per_s']:.2f} steps/s, "
           f"{system['faults_per_step']:,.0f} page faults a step"]
  if jemalloc is None:
    lines.append("  jemalloc: not installed (apt install libjemalloc2, or conda install "
                 "jemalloc)")
  else:
    same = "identical" if jemalloc["checksum"] == system["checksum"] else "DIFFERENT"
    lines.append(f"  jemalloc:      {jemalloc['steps_per_s']:.2f} steps/s, "
                 f"{jemalloc['faults_per_step']:,.0f} page faults a step; "
                 f"{jemalloc['steps_per_s'] / system['steps_per_s']:.2f}x the steps/s, final "
                 f"weights {same}")
  return "\n".join(lines)
