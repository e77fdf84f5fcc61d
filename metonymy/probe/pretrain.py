"""A quick supervised pretraining of a random-init tiny backbone, standing in for a pretrained one.

Randomly initialised ViTs leak little that a linear probe can read (their attention mixes a
near-uniform average of all tokens into every token, mostly background), so a benchmark of one
shows late PS ~ early PS. A backbone trained to describe the whole object from its tokens gathers
object information into every patch, which is the leakage the paper measures. This trains one in
minutes on CPU:

  loss = mean over heads h in {CLS, mean patch token} of BCE(linear_h(feature_h), attributes),

with AdamW (warmup + cosine), on `images` examples of the training split held in memory (random
horizontal flips). Only for random-init backbones (`backbone_pretraining.steps` > 0).
"""

import time
from typing import Dict

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging


def _load(source, count: int, transforms):
  """Stacked normalized images [N, H, W, 3], attributes [N, A], validity [N, A]."""
  xs, ys, vs = [], [], []
  for i in range(min(count, len(source))):
    example = transforms(source[i])
    xs.append(np.asarray(example["image"], np.float32))
    ys.append(example["attributes"])
    vs.append(example["attribute_valid"])
  return np.stack(xs), np.stack(ys).astype(np.float32), np.stack(vs).astype(np.float32)


def pretrain(model, params, source, transforms, *, steps: int, batch_size: int = 32,
             learning_rate: float = 3e-3, images: int = 4000, seed: int = 0,
             progress: bool = True) -> Dict:
  """Returns the trained backbone params (the heads are dropped)."""
  start = time.perf_counter()
  x, y, valid = _load(source, images, transforms)
  width = model.config.width
  heads = {h: {"w": jnp.zeros((width, y.shape[1])), "b": jnp.zeros((y.shape[1],))}
           for h in ("cls", "patches")}
  schedule = optax.warmup_cosine_decay_schedule(0.0, learning_rate, max(1, steps // 10), steps)
  optimizer = optax.adamw(schedule, weight_decay=0.05)
  state = optimizer.init((params, heads))

  def loss_fn(trainable, xb, yb, vb):
    backbone, head = trainable
    out = model.apply({"params": backbone}, xb)
    feats = {"cls": out["prefix_tokens"][:, 0], "patches": out["patch_tokens"].mean(1)}
    total = 0.0
    for h, f in feats.items():
      bce = optax.sigmoid_binary_cross_entropy(f @ head[h]["w"] + head[h]["b"], yb)
      total += (bce * vb).sum() / jnp.maximum(vb.sum(), 1.0)
    return total / len(feats)

  @jax.jit
  def step(trainable, opt_state, xb, yb, vb):
    loss, grads = jax.value_and_grad(loss_fn)(trainable, xb, yb, vb)
    updates, opt_state = optimizer.update(grads, opt_state, trainable)
    return optax.apply_updates(trainable, updates), opt_state, loss

  rng = np.random.default_rng(seed)
  trainable = (params, heads)
  bar = None
  if progress:
    from tqdm.auto import tqdm
    bar = tqdm(total=steps, desc="pretrain backbone", unit="step", dynamic_ncols=True)
  loss = float("nan")
  for i in range(steps):
    idx = rng.integers(0, len(x), batch_size)
    flip = rng.random(batch_size) < 0.5
    xb = np.where(flip[:, None, None, None], x[idx][:, :, ::-1], x[idx])
    trainable, state, loss = step(trainable, state, xb, y[idx], valid[idx])
    if bar is not None:
      bar.update(1)
      if i % 50 == 0:
        bar.set_postfix(loss=f"{float(loss):.4f}")
  if bar is not None:
    bar.close()
  logging.info("pretrained the backbone for %d steps in %.0f s, final loss %.4f", steps,
               time.perf_counter() - start, float(loss))
  return trainable[0]
