"""Pretraining of a random-init backbone, standing in for a pretrained one (the demo's and
`configs/probe_synthetic.py:trained`'s "DINO"): a trainer, as training/trainer.py is one, for
the backbone itself.

Part discovery needs patch features in which the part a patch belongs to is the geometry, and the
leakage benchmark needs a backbone that has learned the world it is probed on. The stand-in learns
from image-level signals only, never from part masks or keypoints (those are what part discovery
is scored against). Two objectives (`objective`):

"attributes", supervised: two linear heads read the image-level attributes,

  cls:    logits = W z_cls + b                                             [B, A]
  parts:  alpha_g = softmax_n(q_g . z_n)  (one query per attribute group g, over patches n)
          logits_a = w_a . sum_n alpha_{g(a), n} z_n + b_a                 [B, A]

  g(a) is the part an attribute describes (the dataset's attribute-to-part table, e.g. Table S9's
  groups for CUB): an image-level fact about the labels, not a location. Loss per head (`loss`):
  "group_softmax" takes a softmax cross-entropy over each attribute group (names sharing the
  prefix before "::") whose valid labels are one-hot in every loaded example, and BCE for all
  other attributes; "bce" is BCE everywhere. Such a backbone holds a patch's part linearly but
  mixes the image into every token with depth (docs/experiments.md, "The stand-in").

"self_supervised": DINOv2's recipe scaled to a tiny ViT (training/self_supervised.py: an EMA
  teacher, multi-crop, DINO on the CLS token, iBOT on masked patch tokens, KoLeo; or masked-pixel
  reconstruction), optionally with the attribute heads above as one more term
  (`self_supervised.attributes` > 0).

AdamW (warm-up + cosine), decoupled weight decay on 2-D weights only (training/optimizer.py's
`decay_mask`), on `images` examples of the training split held in memory, with random horizontal
flips and, with `augment="affine"`, random similarities (AUGMENTATIONS); the self-supervised
objective makes its own views. Progress (steps/s, ETA) on the console; with a `writer`, the loss
terms every 50 steps and every evaluation go to TensorBoard and metrics.jsonl. A killed run
resumes bit for bit from `state_dir` (PretrainingState).
"""

import contextlib
import dataclasses
import json
import os
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from absl import logging
from flax import serialization
from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import optax

from metonymy import console
from metonymy import converters
from metonymy.evaluation import metrics
from metonymy.evaluation import token_geometry
from metonymy.models import vit
from metonymy.training import geometry
from metonymy.training import optimizer as optimizer_lib
from metonymy.training import self_supervised
from metonymy.workdir import writers

HEADS = ("cls", "parts")
LOG_EVERY = 50  # steps between loss records and progress lines
OBJECTIVES = ("attributes", "self_supervised")
LOSSES = ("group_softmax", "bce")
# "flip": random horizontal flips. "affine": flips, then one random similarity per image with
# the ranges of Stage 1's equivariance prior (PDiscoFormer's: angle up to 90 degrees, shift up
# to 11% of the size, scale 0.8-1.4), so that the features the prior compares are stable under
# its transforms; the attributes do not change under either.
AUGMENTATIONS = ("flip", "affine")
AFFINE_RANGES = {"max_degrees": 90.0, "max_translate": 0.11, "scale_range": (0.8, 1.4)}


def random_affine_warp(images: jnp.ndarray, rng: jax.Array) -> jnp.ndarray:
  """images [B, H, W, C], each moved by its own random similarity (AFFINE_RANGES); what comes
  from outside the frame reads 0 (the normalized mean colour)."""
  keys = jax.random.split(rng, images.shape[0])
  transforms = jax.vmap(lambda key: geometry.sample_affine(key, **AFFINE_RANGES))(keys)
  return jax.vmap(lambda image, t: geometry.warp_images(image[None], t)[0])(images, transforms)


@dataclasses.dataclass
class Pretrained:
  """What `pretrain` returns: the backbone's parameters, the heads' (`init_heads`; kept to
  measure the backbone's own quality), the loss curve [(step, loss)], the wall time (of every
  session, when resumed) and what `evaluate` returned along the way [(step, value)]."""
  params: Dict
  heads: Dict
  loss_history: List[Tuple[int, float]]
  seconds: float
  evaluations: List[Tuple[int, object]] = dataclasses.field(default_factory=list)


def load_examples(source, count: int, transforms):
  """Stacked normalized images [N, H, W, 3], attributes [N, A], validity [N, A] (float32)."""
  xs, ys, vs = [], [], []
  for i in range(min(count, len(source))):
    example = transforms(source[i])
    xs.append(np.asarray(example["image"], np.float32))
    ys.append(example["attributes"])
    vs.append(example["attribute_valid"])
  return np.stack(xs), np.stack(ys).astype(np.float32), np.stack(vs).astype(np.float32)


def exclusive_groups(attribute_names: Sequence[str], labels: np.ndarray,
                     valid: np.ndarray) -> List[Tuple[int, int]]:
  """[(start, stop)]: runs of consecutive attributes sharing a name prefix before "::" whose
  labels are valid and one-hot in every example of `labels` [N, A] (the softmax groups)."""
  prefixes = [name.split("::")[0] if "::" in name else None for name in attribute_names]
  groups, start = [], 0
  for a in range(1, len(prefixes) + 1):
    if a == len(prefixes) or prefixes[a] != prefixes[start] or prefixes[a] is None:
      if prefixes[start] is not None and a - start >= 2:
        block, block_valid = labels[:, start:a], valid[:, start:a]
        if np.all(block_valid == 1) and np.all(block.sum(1) == 1):
          groups.append((start, a))
      start = a
  return groups


def init_heads(rng: jax.Array, width: int, attribute_part: Sequence[int]) -> Dict:
  """Zero linear read-outs; small random part queries (zero ones would give every part the same
  uniform pooling and the same gradient)."""
  num_attributes, num_groups = len(attribute_part), max(attribute_part) + 1
  linear = lambda: {"w": jnp.zeros((width, num_attributes)), "b": jnp.zeros((num_attributes,))}
  return {"cls": linear(),
          "parts": dict(linear(), q=0.02 * jax.random.normal(rng, (width, num_groups)))}


def head_logits(out: Dict[str, jnp.ndarray], heads: Dict,
                attribute_part: Sequence[int]) -> Dict[str, jnp.ndarray]:
  """{head: logits [B, A]} of a backbone output (`prefix_tokens` [B, P, D], `patch_tokens`
  [B, N, D]); attribute_part [A]: each attribute's group."""
  cls = out["prefix_tokens"][:, 0]
  patches = out["patch_tokens"]
  attention = jax.nn.softmax(patches @ heads["parts"]["q"], axis=1)        # [B, N, G]
  pooled = jnp.einsum("bng,bnd->bgd", attention, patches)                   # [B, G, D]
  per_attribute = pooled[:, np.asarray(attribute_part)]                     # [B, A, D]
  return {"cls": cls @ heads["cls"]["w"] + heads["cls"]["b"],
          "parts": jnp.einsum("bad,da->ba", per_attribute, heads["parts"]["w"])
                   + heads["parts"]["b"]}


def attribute_loss(logits: jnp.ndarray, labels: jnp.ndarray, valid: jnp.ndarray,
                   groups: Sequence[Tuple[int, int]]) -> jnp.ndarray:
  """Mean over targets: one softmax cross-entropy per example and group in `groups`, one BCE per
  valid attribute outside them."""
  in_group = np.zeros(labels.shape[-1], bool)
  total, count = 0.0, 0.0
  for start, stop in groups:
    in_group[start:stop] = True
    total += jnp.sum(optax.softmax_cross_entropy(logits[:, start:stop], labels[:, start:stop]))
    count += logits.shape[0]
  rest = valid * jnp.asarray(~in_group, valid.dtype)
  total += jnp.sum(optax.sigmoid_binary_cross_entropy(logits, labels) * rest)
  count += jnp.sum(rest)
  return total / jnp.maximum(count, 1.0)


def _check_options(loss: str, augment: str, objective: str) -> None:
  for name, value, allowed in (("loss", loss, LOSSES), ("augment", augment, AUGMENTATIONS),
                               ("objective", objective, OBJECTIVES)):
    if value not in allowed:
      raise ValueError(f"backbone_pretraining.{name} must be one of {allowed}, got {value!r}")


def pretrain(model, params, source, transforms, *, steps: int, batch_size: int = 32,
             learning_rate: float = 1e-3, weight_decay: float = 0.05, images: int = 4000,
             loss: str = "group_softmax", augment: str = "flip", seed: int = 0,
             progress: bool = True, heads: Optional[Dict] = None,
             evaluate: Optional[Callable[[int, Dict, Dict], object]] = None,
             evaluate_every: int = 0, state_dir: str = "", checkpoint_every: int = 0,
             objective: str = "attributes", self_supervised_options: Optional[Dict] = None,
             writer=None) -> Pretrained:
  """Trains `params` of `model` (a VisionTransformer) on `images` examples of `source`; `heads`
  continues the attribute read-outs of an earlier stage (default: fresh ones, `init_heads`).

  `objective` "attributes" or "self_supervised" (the module docstring), the latter with
  `self_supervised_options` (self_supervised.Recipe's fields). What comes back as the backbone
  is the teacher's where there is one (as DINO evaluates and releases its teacher).

  `evaluate(step, params, heads)` is called after every `evaluate_every` steps before the last
  (the caller measures the final weights): a quality curve, to tell whether a longer schedule
  would still help. It reads the weights only, so the trajectory is the same without it; what it
  returns (JSON-ready) is kept in `Pretrained.evaluations` and, with a `writer`
  (training/writers.MetricWriter), written under `pretrain_eval/` with the loss terms.

  `state_dir`: the run saves its state there every `checkpoint_every` steps (0: at its end only)
  and at its end, and a run with the same arguments resumes from it, bit for bit: the weights,
  the optimizer, the teacher and its centres, the data order, the loss curve and the
  evaluations so far (PretrainingState)."""
  _check_options(loss, augment, objective)
  recipe = None
  if objective == "self_supervised":
    recipe = self_supervised.Recipe.from_dict(self_supervised_options or {})
  start = time.perf_counter()
  x, y, valid = load_examples(source, images, transforms)
  uses_attributes = recipe is None or recipe.attributes > 0
  groups = (exclusive_groups(source.info.attribute_names, y, valid)
            if loss == "group_softmax" and uses_attributes else [])
  logging.info("pretraining (%s): %d images, %d softmax groups over %d attributes", objective,
               len(x), len(groups), y.shape[1])
  attribute_part = tuple(source.info.attribute_part)
  if heads is None and uses_attributes:
    heads = init_heads(jax.random.PRNGKey(seed), model.config.width, attribute_part)
  # steps = 0 returns the random weights (and zero heads): a random-init baseline.
  schedule = optax.warmup_cosine_decay_schedule(0.0, learning_rate, max(1, steps // 10),
                                                max(steps, 2))
  adamw = optax.adamw(schedule, weight_decay=weight_decay, mask=optimizer_lib.decay_mask)

  trained_heads = HEADS if recipe is None or recipe.attribute_heads == "cls_and_parts" else ("cls",)

  def attributes_loss(head, out, yb, vb):
    logits = head_logits(out, head, attribute_part)
    return (sum(attribute_loss(logits[h], yb, vb, groups) for h in trained_heads)
            / len(trained_heads))

  if recipe is None:
    tx = adamw
    trainable = (params, heads)
    state = tx.init(trainable)

    @jax.jit
    def step(carry, xb, yb, vb, rng, index):
      del index
      trainable, opt_state = carry
      if augment == "affine":
        xb = random_affine_warp(xb, rng)

      def loss_fn(trainable):
        backbone, head = trainable
        return attributes_loss(head, model.apply({"params": backbone}, xb), yb, vb)

      value, grads = jax.value_and_grad(loss_fn)(trainable)
      updates, opt_state = tx.update(grads, opt_state, trainable)
      return (optax.apply_updates(trainable, updates), opt_state), value, {}
    carry = (trainable, state)
    backbone_of = lambda carry: carry[0][0]
    heads_of = lambda carry: carry[0][1]
  else:
    # DINO clips every gradient at global norm 3.
    tx = optax.chain(optax.clip_by_global_norm(3.0), adamw)
    trainable = {"backbone": params, **self_supervised.init_heads(
        recipe, jax.random.PRNGKey(seed), model.config.width, model.config.patch_size)}
    if uses_attributes:
      trainable["attribute_heads"] = heads
    teacher = (jax.tree.map(jnp.array, self_supervised.teacher_part(trainable))
               if recipe.distills else {})
    carry = (trainable, tx.init(trainable), teacher,
             self_supervised.centers(recipe, model.config.width))

    @jax.jit
    def step(carry, xb, yb, vb, rng, index):
      trainable, opt_state, teacher, center = carry
      def loss_fn(p):
        attribute_term = None
        if uses_attributes:  # The attribute heads' loss on the student's whole-image output.
          attribute_term = lambda out: attributes_loss(p["attribute_heads"], out, yb, vb)
        return self_supervised.objective(model, recipe, p, teacher, center, xb, rng, index,
                                         steps, attribute_term)

      (value, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable)
      updates, opt_state = tx.update(grads, opt_state, trainable)
      trainable = optax.apply_updates(trainable, updates)
      if recipe.distills:
        teacher = self_supervised.ema(teacher, self_supervised.teacher_part(trainable),
                                      self_supervised.teacher_momentum(recipe, index, steps))
      center = self_supervised.updated_centers(center, aux.pop("teacher_scores"),
                                               recipe.center_momentum)
      if "centroids" in aux:  # The cluster term's online k-means, one step on.
        center = {**center, "clusters": aux.pop("centroids")}
      return (trainable, opt_state, teacher, center), value, aux
    backbone_of = lambda carry: (carry[2] if recipe.distills else carry[0])["backbone"]
    heads_of = lambda carry: carry[0].get("attribute_heads") or {}

  rng = np.random.default_rng(seed)
  augment_rng = jax.random.PRNGKey(seed + 1)
  history, evaluations, value, first, earlier_seconds = [], [], float("nan"), 0, 0.0
  arguments = {"steps": steps, "batch_size": batch_size, "learning_rate": learning_rate,
               "images": len(x), "loss": loss, "augment": augment, "seed": seed}
  if recipe is not None:
    arguments.update(objective=objective,
                     self_supervised=json.loads(json.dumps(dataclasses.asdict(recipe))))
  saved = PretrainingState(state_dir, arguments)
  if state_dir:
    restored = saved.restore(carry)
    if restored is not None:
      carry, first, meta = restored
      rng.bit_generator.state = meta["data_rng"]
      history = [tuple(h) for h in meta["loss_history"]]
      evaluations = [tuple(e) for e in meta["evaluations"]]
      value, earlier_seconds = (history[-1][1] if history else value), meta["seconds"]
      logging.info("pretraining: resumed at step %d of %d from %s", first, steps, state_dir)
      if writer is not None:
        writer.trim(first)

  def save(done: int) -> None:
    saved.save(done, carry, {
        "data_rng": rng.bit_generator.state, "loss_history": history,
        "evaluations": evaluations,
        "seconds": earlier_seconds + time.perf_counter() - start})

  meter = None  # the trainer's steps/s and ETA, timed from the step after the compiling one
  for i in range(first, steps):
    idx = rng.integers(0, len(x), batch_size)
    flip = rng.random(batch_size) < 0.5
    xb = np.where(flip[:, None, None, None], x[idx][:, :, ::-1], x[idx])
    carry, value, aux = step(carry, xb, y[idx], valid[idx], jax.random.fold_in(augment_rng, i),
                             i)
    if progress and meter is None:
      jax.block_until_ready(value)
      meter = writers.Progress(steps, LOG_EVERY)
    if meter is not None:
      meter(i + 1)
    if i % LOG_EVERY == 0 or i == steps - 1:
      history.append((i + 1, float(value)))
      if meter is not None:
        console.console(f"pretraining ({objective}) step {i + 1}/{steps} loss {float(value):.4f}"
                        f" | {meter.line(i + 1)}")
      if writer is not None:
        writer.write_scalars(i + 1, {"pretrain/loss": value,
                                     **{f"pretrain/{k}": v for k, v in aux.items()}})
    if evaluate is not None and evaluate_every > 0 and (i + 1) % evaluate_every == 0 \
        and i + 1 < steps:
      with (meter.pause() if meter is not None else contextlib.nullcontext()):
        quality = evaluate(i + 1, backbone_of(carry), jax.device_get(heads_of(carry)))
      evaluations.append((i + 1, quality))
      if writer is not None and isinstance(quality, dict):
        writer.write_scalars(i + 1, {f"pretrain_eval/{k}": v for k, v in quality.items()
                                     if isinstance(v, (int, float)) and v is not None})
    if state_dir and checkpoint_every > 0 and (i + 1) % checkpoint_every == 0 and i + 1 < steps:
      save(i + 1)
  if state_dir and first < steps:
    save(steps)
  seconds = earlier_seconds + time.perf_counter() - start
  logging.info("pretrained the backbone for %d steps in %.0f s, final loss %.4f", steps, seconds,
               float(value))
  return Pretrained(params=backbone_of(carry), heads=jax.device_get(heads_of(carry)),
                    loss_history=history, seconds=seconds, evaluations=evaluations)


class PretrainingState:
  """A pretraining's state in a folder: `state-<step>.msgpack` (weights and optimizer state) and
  `state.json` (the step, the data order's generator, the curves, and the arguments the run was
  started with). state.json is written last and names its msgpack, so a kill mid-save leaves the
  previous state readable."""

  def __init__(self, directory: str, arguments: Dict):
    self.directory, self.arguments = directory, json.loads(json.dumps(arguments))

  def restore(self, target):
    """(state like `target`, step, meta) of the saved state, or None when there is none."""
    meta_path = os.path.join(self.directory, "state.json")
    if not os.path.exists(meta_path):
      return None
    with open(meta_path) as f:
      meta = json.load(f)
    if meta["arguments"] != self.arguments:
      raise ValueError(
          f"{meta_path} was saved by a pretraining with other arguments ({meta['arguments']}), "
          f"not {self.arguments}: resume with the same recipe, or use another folder.")
    with open(os.path.join(self.directory, meta["state_file"]), "rb") as f:
      state = serialization.from_bytes(target, f.read())
    return state, int(meta["step"]), meta

  def save(self, step: int, state, meta: Dict) -> None:
    os.makedirs(self.directory, exist_ok=True)
    name = f"state-{step}.msgpack"
    with open(os.path.join(self.directory, name + ".tmp"), "wb") as f:
      f.write(serialization.to_bytes(jax.device_get(state)))
    os.replace(os.path.join(self.directory, name + ".tmp"), os.path.join(self.directory, name))
    meta = dict(meta, step=step, state_file=name, arguments=self.arguments)
    with open(os.path.join(self.directory, "state.json.tmp"), "w") as f:
      json.dump(meta, f)
    os.replace(os.path.join(self.directory, "state.json.tmp"),
               os.path.join(self.directory, "state.json"))
    for old in os.listdir(self.directory):
      if old.startswith("state-") and old.endswith(".msgpack") and old != name:
        os.remove(os.path.join(self.directory, old))


def head_quality(model, params, heads, source, transforms, *, images: int = 500,
                 batch_size: int = 100) -> Dict[str, Optional[float]]:
  """The pretrained backbone's own attribute mAP per head on (held-out) `source`, beside the
  chance level (a constant score's AP is the attribute's positive rate):
  {"cls/mAP", "parts/mAP", "chance/mAP", "images"}. Attributes without a positive are skipped."""
  x, y, valid = load_examples(source, images, transforms)
  mean_ap = lambda scores: float(np.nanmean(metrics.average_precision(scores, y, valid)))
  attribute_part = tuple(source.info.attribute_part)
  forward = jax.jit(lambda xb: head_logits(model.apply({"params": params}, xb), heads,
                                           attribute_part))
  scores = {h: [] for h in HEADS}
  for i in range(0, len(x), batch_size):
    for h, logits in forward(x[i:i + batch_size]).items():
      scores[h].append(np.asarray(logits))
  result = {f"{h}/mAP": mean_ap(np.concatenate(s)) for h, s in scores.items()}
  result["chance/mAP"] = mean_ap(np.zeros_like(y))
  result["images"] = len(x)
  return result


def part_legibility(model, params, source, transforms, *, images: int = 400,
                    fit_fraction: float = 0.625, batch_size: int = 100, per_block: bool = True,
                    seed: int = 0) -> Optional[Dict[str, float]]:
  """How the backbone's patch tokens hold the parts, on held-out images with a
  `part_segmentation` (the synthetic world); None without one. A diagnostic that nothing trains
  on: it tells whether Stage 1 has parts to find in these features
  (evaluation/token_geometry.py: k-means of the foreground tokens per block against the true
  parts, the position-only k-means beside it, a patch-part probe, attribute probes on the
  frozen CLS token and on the mean patch token)."""
  count = min(images, len(source))
  if not 0 < int(count * fit_fraction) < count or "part_segmentation" not in source[0]:
    return None
  x, y, valid = load_examples(source, count, transforms)
  segmentation = np.stack([source[i]["part_segmentation"] for i in range(count)])
  forward = jax.jit(lambda xb: model.apply({"params": params}, xb,
                                           return_intermediates=per_block))
  result = token_geometry.token_geometry(
      forward, x, segmentation, len(source.info.part_names), model.config.patch_size,
      attributes=y, attribute_valid=valid, fit_fraction=fit_fraction, batch_size=batch_size,
      per_block=per_block, seed=seed)
  result["part_probe/images"] = result.pop("images")
  return result


# ------------------------------------------------------------------------------------------------
# A pretrained stand-in kept as one file pair: PREFIX.npz (backbone and head arrays) and
# PREFIX.json (the architecture, the recipe that made it and what it measured).


def save_stand_in(prefix: str, vit_config, pretrained: Pretrained, record: Dict) -> List[str]:
  """Writes PREFIX.npz and PREFIX.json; returns their paths."""
  arrays = {f"params/{k}": np.asarray(v) for k, v in
            traverse_util.flatten_dict(jax.device_get(pretrained.params), sep="/").items()}
  arrays.update({f"heads/{k}": np.asarray(v) for k, v in
                 traverse_util.flatten_dict(pretrained.heads, sep="/").items()})
  os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
  np.savez_compressed(prefix + ".npz", **arrays)
  meta = dict(record, vit_config=vit_config.to_dict(),
              loss_history=[[int(s), float(v)] for s, v in pretrained.loss_history],
              seconds=float(pretrained.seconds))
  with open(prefix + ".json", "w") as f:
    json.dump(meta, f, indent=2, sort_keys=True)
  return [prefix + ".npz", prefix + ".json"]


def read_stand_in_record(prefix: str) -> Dict:
  """PREFIX.json of a saved stand-in (its recipe, command, quality); the arrays are not read."""
  for path in (prefix + ".npz", prefix + ".json"):
    if not os.path.exists(path):
      raise FileNotFoundError(f"{path} not found: no stand-in backbone saved under {prefix}.")
  with open(prefix + ".json") as f:
    return json.load(f)


def load_stand_in(prefix: str):
  """(vit_config, params, heads, record) of a stand-in saved by `save_stand_in`; the arrays are
  checked against the architecture's shapes, naming any key that does not fit."""
  record = read_stand_in_record(prefix)
  vit_config = vit.ViTConfig.from_dict(record["vit_config"])
  with np.load(prefix + ".npz") as data:
    arrays = {k: data[k] for k in data.files}
  params = traverse_util.unflatten_dict(
      {tuple(k.split("/")[1:]): v for k, v in arrays.items() if k.startswith("params/")})
  heads = traverse_util.unflatten_dict(
      {tuple(k.split("/")[1:]): v for k, v in arrays.items() if k.startswith("heads/")})
  converters.check_against_model(vit_config, params,
                                  f"{prefix}.npz (architecture from {prefix}.json)")
  return vit_config, params, heads, record
