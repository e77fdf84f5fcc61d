"""The training job (`job = "train"`): one loop for the single-stage and two-stage models.

  python -m metonymy.main --config=configs/synthetic_single.py:runlocal --workdir=/tmp/w

What a model must provide is models/part_model.py's PartModel (init / apply / part_maps /
param_groups); `config.model.name` picks it in loading.build_model. The objective is
objective.loss_fn, which sums the attribute loss of every logits head the model returns.

The run, in order:
  1. mesh over all devices (data parallel, optional FSDP), set with jax.set_mesh;
  2. data sources and Grain pipelines (this process's share of every global batch);
  3. model + frozen backbone; the trainable state is initialized directly into its shardings;
  4. resume from WORKDIR/checkpoints if a checkpoint exists (parameters, optimizer, step, RNG and
     the data iterator's position), so a killed run continues bit-identically;
  5. the loop: step, then logging (JSONL, TensorBoard, console with clu's steps/s and ETA; the
     parameter tables in WORKDIR/parameters.txt; config.trainer.profile_steps > 0 traces that
     many steps with clu's Profile),
     checkpoints and evaluation at their intervals, checkpoints also every
     config.trainer.checkpoint_every_minutes; on SIGTERM / SIGUSR1 every process saves at the
     same next step and the run exits with status 75, "requeue me" (training/preemption.py).
     A non-finite loss, gradient norm, or updated parameter / optimizer state stops the run
     before that state is saved or evaluated (the train step returns an all-finite reduction of
     what it updated, checked on the host before every save); on resume, a checkpoint holding
     a NaN/Inf, or one that does not read while an older one does, is refused in favour of the
     newest usable one, and metrics.jsonl is trimmed to the restored step.

Collapse is reported, not hidden: every step measures the share of the training batch's patches
that each part wins (`train/part_share/<k>`, `train/part_share/max`, `train/part_mass/<k>`; k = K
is the background), every evaluation the same over the whole evaluation set plus `eval/collapsed`
(training/evaluate.py), and an evaluation where one part holds more than 90% of the patches or a
foreground part wins none logs a warning and writes it into WORKDIR/report.md, which each
evaluation rewrites with its numbers.
"""

import functools
import os
from typing import Any, Dict, Tuple

from absl import logging
from clu import parameter_overview
import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.experimental import multihost_utils

from metonymy import console
from metonymy import loading
from metonymy.converters import store
from metonymy.data import pipeline
from metonymy.models import part_model
from metonymy.training import evaluate
from metonymy.training import inputs
from metonymy.training import objective
from metonymy.training import optimizer
from metonymy.training import preemption
from metonymy.training import prototype_init
from metonymy.training import run_state
from metonymy.training import sharding
from metonymy.workdir import Workdir
from metonymy.workdir import writers


@flax.struct.dataclass
class TrainState:
  step: jax.Array       # int32 []: optimizer steps taken
  params: Any           # trainable parameters only
  opt_state: Any
  rng: jax.Array        # uint32 [2]: the run's key; step s uses fold_in(rng, s)


class NonFiniteError(FloatingPointError):
  """The loss, the gradients or the updated state became NaN/Inf; the message names the step and
  the last good checkpoint."""


def run(config, workdir) -> Dict[str, float]:
  """Trains (or resumes) in `workdir` (a path or a layout.Workdir); returns the last
  evaluation's scalars."""
  console.quiet_library_logs()
  mesh = sharding.make_mesh(config.mesh)
  with jax.set_mesh(mesh):
    return _train(config, Workdir(workdir).make(), mesh)


def _batch_sizes(config, mesh) -> int:
  global_batch = config.data.batch_size
  devices, processes = mesh.size, jax.process_count()
  for key, size in (("batch_size", global_batch), ("eval_batch_size", config.data.eval_batch_size)):
    if size % devices or size % processes:
      raise ValueError(f"config.data.{key}={size} must be divisible by the {devices} devices and "
                       f"{processes} processes.")
  return global_batch


def _load_model(config, workdir: Workdir,
                num_attributes: int) -> Tuple[part_model.PartModel, Any]:
  """(model, frozen params); a random-init backbone is saved once and reloaded on resume.
  model.json keeps config.backbone.checkpoint as given (a sub-run's "workdir:../backbone");
  it is read here against the workdir (its existence was checked before the run started, by
  the launcher's preflight)."""
  checkpoint = workdir.resolve(config.backbone.checkpoint)
  saved = workdir.backbone
  exists = store.is_converted(saved)
  if jax.process_count() > 1:  # One decision for all: saving and loading are collective.
    exists = bool(multihost_utils.broadcast_one_to_all(np.asarray(exists)))
  if not checkpoint and exists:
    # Resuming a random-init run: the saved backbone, not a re-draw (immune to RNG changes).
    checkpoint = os.fspath(saved)
  config = ml_collections.ConfigDict(config.to_dict())
  config.backbone.checkpoint = checkpoint
  model, frozen = loading.build_model(config, num_attributes)
  if not checkpoint:  # Every process: Orbax saves collectively.
    store.save_converted(saved, model.backbone.config, frozen,
                         source=f"random init of {config.backbone.preset}, seed {config.seed}")
  return model, frozen


def _write_model_file(config, workdir: Workdir, info) -> None:
  """What loading.load_trained_part_model needs to rebuild the model without the data."""
  if jax.process_index() != 0:
    return
  meta = {"model": config.model.to_dict(), "backbone": config.backbone.to_dict(),
          "seed": config.seed, "image_size": config.data.image_size,
          "dataset": config.data.dataset, "num_attributes": info.num_attributes,
          "attribute_names": list(info.attribute_names), "part_names": list(info.part_names)}
  workdir.write_model_info(meta)


def _finite_or_raise(step: int, metrics, mngr, writer, learning_rates) -> Dict[str, float]:
  """Host copy of a step's metrics (without `state_finite`); raises NonFiniteError if the loss,
  the grad norm or the updated parameters / optimizer state are not finite. The message says
  what to change (`learning_rates`: config.optimizer.learning_rates, as a dict) before resuming."""
  values = {k: float(v) for k, v in jax.device_get(metrics).items()}
  state_finite = values.pop("state_finite") == 1.0
  if np.isfinite(values["loss"]) and np.isfinite(values["grad_norm"]) and state_finite:
    return values
  writer.write_scalars(step, values)
  mngr.wait_until_finished()
  last = mngr.latest_step()
  where = (f"the last good checkpoint is step {last} in {writer.files.checkpoints}, "
           f"which a rerun resumes from" if last is not None
           else "no checkpoint was saved before it")
  bad = {k: v for k, v in values.items() if not np.isfinite(v)}
  if not state_finite:
    bad["updated params/opt_state"] = "NaN/Inf"
  # Rerunning unchanged diverges again: name the largest learning rate and a 10x smaller one.
  group, lr = max(learning_rates.items(), key=lambda item: item[1], default=("heads", 1.0))
  raise NonFiniteError(
      f"Non-finite training values at step {step}: {bad}. The run stopped without saving this "
      f"state; {where}. Rerunning unchanged will diverge again: lower the learning rates "
      f"(config.optimizer.learning_rates = {learning_rates}; e.g. "
      f"--config.optimizer.learning_rates.{group}={lr / 10:g}), add warm-up "
      f"(config.optimizer.warmup_steps) or gradient clipping (config.optimizer.clip_norm), or "
      f"check the inputs.")


def _train(config, workdir: Workdir, mesh) -> Dict[str, float]:
  objective.check_config(config.loss)
  prototype_init.check(config.model)
  batch_size = _batch_sizes(config, mesh)
  per_process = batch_size // jax.process_count()

  # Data.
  train_source, eval_source = inputs.sources(config.data)
  info = train_source.info
  steps_per_epoch = pipeline.num_batches(len(train_source), per_process, train=True,
                                         shard_count=jax.process_count())
  total_steps = config.trainer.num_steps or config.trainer.num_epochs * steps_per_epoch
  if total_steps < 1:
    raise ValueError(f"The run has no steps: config.trainer.num_steps={config.trainer.num_steps}, "
                     f"num_epochs={config.trainer.num_epochs}, {steps_per_epoch} steps per epoch.")
  every = lambda value: value or steps_per_epoch  # 0 = once per epoch.
  log_every = config.trainer.log_every_steps
  checkpoint_every = every(config.trainer.checkpoint_every_steps)
  eval_every = every(config.trainer.eval_every_steps)

  # Model, optimizer, sharded state.
  model, frozen = _load_model(config, workdir, info.num_attributes)
  _write_model_file(config, workdir, info)
  vit_config = model.backbone.config
  train_ds = inputs.train_pipeline(train_source, config.data, vit_config.image_mean,
                                   vit_config.image_std, per_process, config.seed)
  eval_ds = inputs.eval_pipeline(eval_source, config.data, vit_config.image_mean,
                                 vit_config.image_std, config.data.eval_batch_size // jax.process_count())
  # The chance row of the part metrics: where a keypoint lies, without the image. Fit at the
  # first evaluation, so a run that never evaluates (killed, refused) never loads scikit-learn.
  position_baseline = functools.cache(lambda: inputs.position_baseline(
      train_source, config.data, model.num_parts,
      config.trainer.get("position_baseline_examples", 0), seed=config.seed))
  size = config.data.image_size
  images = jnp.zeros((1, size, size, 3), jnp.float32)
  rng_init, rng_train = jax.random.split(jax.random.PRNGKey(config.seed))
  # Stage 1's start: None (the model's own init) or k-means centroids.
  prototypes = prototype_init.initial_prototypes(model, frozen, train_source, config)

  def initial_params(rng, frozen):
    params = model.init(rng, images, frozen)
    return params if prototypes is None else prototype_init.with_prototypes(params, prototypes)

  abstract_params = jax.eval_shape(model.init, rng_init, images, frozen)
  tx, schedules = optimizer.make(config.optimizer, model.param_groups(abstract_params),
                                 total_steps, batch_size)
  decays = jax.tree_util.tree_leaves(optimizer.decay_mask(abstract_params))
  num_decayed = sum(int(np.prod(leaf.shape)) for leaf, decayed
                    in zip(jax.tree_util.tree_leaves(abstract_params), decays) if decayed)
  console.console(
      f"Weight decay {optimizer.effective_weight_decay(config.optimizer, total_steps):.3g} "
      f"(config.optimizer.weight_decay {config.optimizer.weight_decay}, normalized: "
      f"{bool(config.optimizer.get('weight_decay_normalized', False))}, {total_steps} steps) on "
      f"{num_decayed:,} of {parameter_overview.count_parameters(abstract_params):,} trainable "
      f"parameters (2-D weights; no prototypes, norms, biases, prefix or position tokens).")

  def init_state(rng, frozen):
    params = initial_params(rng, frozen)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                      rng=rng_train)

  abstract_state = jax.eval_shape(init_state, rng_init, frozen)
  state_sh = sharding.state_shardings(mesh, abstract_state, config.mesh.fsdp_min_size)
  frozen_sh = sharding.state_shardings(mesh, frozen, config.mesh.fsdp_min_size)
  frozen = jax.device_put(frozen, frozen_sh)
  batch_sh = sharding.batch_sharding(mesh)
  replicated = sharding.replicated(mesh)

  def train_step(state: TrainState, frozen, batch, wishes):
    rng = jax.random.fold_in(state.rng, state.step)
    prior_factor = objective.prior_scale(config.loss, state.step, total_steps)
    (loss, metrics), grads = jax.value_and_grad(objective.loss_fn, argnums=1, has_aux=True)(
        model, state.params, frozen, batch, rng, config.loss, prior_factor)
    if prior_factor is not None:
      metrics = dict(metrics, **{"train/prior_scale": prior_factor})
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(metrics, loss=loss, grad_norm=optax.tree_utils.tree_norm(grads),
                   param_norm=optax.tree_utils.tree_norm(params),
                   # What a checkpoint would save: checked on the host before any save.
                   state_finite=run_state.all_finite((params, opt_state)).astype(jnp.float32))
    return (state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics,
            preemption.Watch.agree(wishes))  # Every process's stop / save wishes, or-ed.

  def term_gradients(params, frozen, batch, rng, step):
    # The priors weighed as the step after `step` will weigh them (prior_scale).
    return objective.term_gradient_norms(
        model, params, frozen, batch, rng, config.loss,
        prior_factor=objective.prior_scale(config.loss, step, total_steps))

  def relative_change(params, start):
    """{group: |theta - theta_0| / |theta_0|} over each optimizer group's parameters."""
    groups = jax.tree_util.tree_leaves(model.param_groups(params))
    pairs = list(zip(groups, jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(start)))
    out = {}
    for group in sorted(set(groups)):
      moved = sum(jnp.sum(jnp.square(p - p0)) for g, p, p0 in pairs if g == group)
      norm = sum(jnp.sum(jnp.square(p0)) for g, _, p0 in pairs if g == group)
      out[f"train/relative_change/{group}"] = jnp.sqrt(moved / jnp.maximum(norm, 1e-30))
    return out

  def eval_step(params, frozen, batch):
    out = model.apply(params, frozen, batch["image"], train=False)
    result = {k: v for k, v in batch.items() if k != "image"}
    result.update(maps=out["maps"], logits=out["logits"])
    return result

  train_step = jax.jit(train_step, in_shardings=(state_sh, frozen_sh, batch_sh, batch_sh),
                       out_shardings=(state_sh, replicated, replicated), donate_argnums=(0,))
  eval_step = jax.jit(eval_step, in_shardings=(state_sh.params, frozen_sh, batch_sh),
                      out_shardings=replicated)
  term_gradients = jax.jit(term_gradients, in_shardings=(state_sh.params, frozen_sh, batch_sh,
                                                         replicated), out_shardings=replicated,
                           static_argnums=(4,))  # the step: two values, step 0 and the last
  relative_change = jax.jit(relative_change, in_shardings=(state_sh.params, state_sh.params),
                            out_shardings=replicated)

  # Resume or start.
  mngr = run_state.manager(workdir, config.trainer.keep_checkpoints)
  writer = writers.MetricWriter(workdir, enabled=jax.process_index() == 0)
  writer.write_config_to_tensorboard(config)
  finite_or_raise = functools.partial(_finite_or_raise, mngr=mngr, writer=writer,
                                      learning_rates=config.optimizer.learning_rates.to_dict())
  train_iter = iter(train_ds)
  state = None
  if mngr.latest_step() is not None:
    target = jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract_state, state_sh)
    state, latest, refused = run_state.restore_newest_finite(mngr, target, train_iter)
    for bad_step, reason in refused:
      moved = workdir.refused_checkpoint(bad_step)
      console.console(f"Warning: refused checkpoint step {bad_step}: {reason}; moved to {moved}.")
    if state is not None:
      console.console(f"Resumed from step {latest} ({workdir.checkpoints}).")
    else:  # Every checkpoint was refused: start afresh, from a rewound data iterator.
      train_iter = iter(train_ds)
  if state is None:
    state = jax.jit(init_state, in_shardings=(replicated, frozen_sh),
                    out_shardings=state_sh)(rng_init, frozen)
  # The parameters at step 0 (recomputed on resume: the init is a function of the seed), kept
  # for each group's relative change over the run: one more copy of the trainable parameters,
  # sharded like them.
  start_params = jax.jit(initial_params,
                         in_shardings=(replicated, frozen_sh),
                         out_shardings=state_sh.params)(rng_init, frozen)
  step = int(jax.device_get(state.step))
  writer.trim(step)  # The killed run's records after the restored step would appear twice.
  count = parameter_overview.count_parameters
  console.console(
      f"Training {config.model.name}: {count(state.params):,} trainable parameters, "
      f"{count(frozen):,} frozen; {total_steps} steps ({steps_per_epoch}/epoch) at batch "
      f"{batch_size} on {mesh.size} device(s) {dict(mesh.shape)}.")
  tables = writers.write_parameter_tables(workdir, {"Trainable parameters": state.params,
                                                    "Frozen parameters": frozen})
  if tables:
    logging.info("Parameter tables: %s", tables)

  def predict(host_batch):
    batch = sharding.global_batch(inputs.device_keys(host_batch, inputs.EVAL_KEYS), batch_sh)
    return jax.device_get(eval_step(state.params, frozen, batch))

  def run_eval(step: int) -> Dict[str, float]:
    result = evaluate.evaluate(predict, iter(eval_ds), image_mean=vit_config.image_mean,
                               image_std=vit_config.image_std,
                               num_images=config.trainer.eval_images,
                               keypoint_group=info.keypoint_group_ids or None,
                               keypoint_group_names=info.keypoint_groups or None,
                               position_baseline=position_baseline(),
                               num_true_parts=len(info.part_names))
    scalars = {f"eval/{k}": v for k, v in result["scalars"].items()}
    writer.write_scalars(step, scalars)
    if result["image"] is not None:
      writer.write_image(step, "eval/part_maps", result["image"])
    # The per-part values go on one short line of their own, in channel order (background last).
    per_part = lambda prefix: " ".join(f"{v:.2f}" for k, v in scalars.items()
                                       if k.startswith(prefix) and k.rsplit("/", 1)[1].isdigit())
    console.console(f"eval @ {step}: " + ", ".join(
        f"{k} {v:.4g}" for k, v in scalars.items()
        if not k.startswith(("eval/part_share/", "eval/part_mass/", "eval/parts/coverage/",
                             "eval/parts/area_ratio/", "eval/parts/best_part/",
                             "eval/parts/in_background/"))))
    if "eval/part_share/max" in scalars:
      console.console(f"eval @ {step}: part shares {per_part('eval/part_share/')} (background "
                      f"last), max {scalars['eval/part_share/max']:.2f}, empty parts "
                      f"{scalars['eval/part_share/num_empty']:g}")
    if "eval/parts/coverage" in scalars:
      console.console(f"eval @ {step}: coverage per true part {per_part('eval/parts/coverage/')}, "
                      f"area ratio {per_part('eval/parts/area_ratio/')}, in the background "
                      f"channel {per_part('eval/parts/in_background/')}")
    warnings = evaluate.collapse_warnings(result["scalars"])
    if jax.process_index() == 0:
      for warning in warnings:
        logging.warning("eval @ %d: %s", step, warning)
    writer.write_text("report.md", evaluate.report_markdown(
        result["scalars"], warnings, step=step, total_steps=total_steps,
        title=f"Training report: {config.model.name} on {config.data.dataset} "
              f"({workdir.path.name})", true_part_names=info.part_names))
    return scalars

  def run_mechanism(step: int) -> None:
    """mechanism/grad_norm/<term> at `step`: mean over the first term_gradient_batches
    unaugmented training batches (the training stream itself is not touched)."""
    num = config.trainer.term_gradient_batches
    batches = iter(inputs.eval_pipeline(train_source, config.data, vit_config.image_mean,
                                        vit_config.image_std, per_process))
    rng = jax.random.fold_in(rng_train, 2 ** 31 - 1)
    sums: Dict[str, float] = {}
    for i in range(num):
      host = next(batches)
      batch = sharding.global_batch(inputs.device_keys(host, inputs.TRAIN_KEYS), batch_sh)
      norms = jax.device_get(term_gradients(state.params, frozen, batch,
                                            jax.random.fold_in(rng, i), min(step, total_steps - 1)))
      for name, value in norms.items():
        sums[name] = sums.get(name, 0.0) + float(value) / num
    writer.write_scalars(step, {f"mechanism/grad_norm/{k}": v for k, v in sums.items()})
    console.console(f"gradient norms at Stage 1's prototypes @ {step}: " + ", ".join(
        f"{k} {v:.3g}" for k, v in sorted(sums.items())))

  last_eval: Dict[str, float] = {}
  if step >= total_steps:
    console.console(f"Nothing to do: the run in {workdir} already reached step {step}.")
  if step == 0 and config.trainer.get("term_gradient_batches", 0):
    run_mechanism(0)
  if step == 0 and config.trainer.get("eval_at_start", False):
    last_eval = run_eval(0)
  progress = profile = None  # Made after the first step, which includes compilation.
  pending = None  # The previous step's metrics, checked one step late to keep the device busy.
  # SIGTERM / SIGUSR1 and checkpoint_every_minutes: saves agreed by every process (preemption.py).
  watch = preemption.Watch(config.trainer.checkpoint_every_minutes, start_step=step)
  try:
    with watch:
      while step < total_steps:
        host_batch = next(train_iter)
        batch = sharding.global_batch(inputs.device_keys(host_batch, inputs.TRAIN_KEYS), batch_sh)
        state, metrics, agreed = train_step(state, frozen, batch, watch.wishes(batch_sh))
        if pending is not None:
          finite_or_raise(*pending[:2])
        step += 1
        stop, timed = watch.decide(step, pending[2] if pending is not None else None)
        pending = (step, metrics, agreed)
        if progress is None:  # Time from here: the first step includes compilation.
          jax.block_until_ready(metrics)
          progress = writers.Progress(total_steps, log_every)
          profile = writers.profiler(workdir, config.trainer.profile_steps, step + 1)
        progress(step)
        if profile is not None:
          profile(step)
        last = step == total_steps
        if step % log_every == 0 or last:
          values = finite_or_raise(step, metrics)
          values.update({f"lr/{g}": float(fn(step - 1)) for g, fn in schedules.items()})
          values["epoch"] = step / steps_per_epoch
          if np.isfinite(progress.steps_per_second):
            values["steps_per_second"] = progress.steps_per_second
          writer.write_scalars(step, values)
          console.console(f"step {step}/{total_steps} (epoch {values['epoch']:.2f}) "
                          f"loss {values['loss']:.4f}, max part share "
                          f"{values['train/part_share/max']:.2f} | {progress.line(step)}")
        if step % checkpoint_every == 0 or last or stop or timed:
          finite_or_raise(step, metrics)
          run_state.save(mngr, state, train_iter)
          watch.saved(step)
        if stop and not last:  # A finished run just ends; an unfinished one asks for a requeue.
          watch.exit_after_save(step, mngr)
        if step % eval_every == 0 or last:
          finite_or_raise(step, metrics)
          with progress.pause():
            last_eval = run_eval(step)
            writer.write_scalars(step, {k: float(v) for k, v in jax.device_get(
                relative_change(state.params, start_params)).items()})
            if last and config.trainer.get("term_gradient_batches", 0):
              run_mechanism(step)
  finally:
    if profile is not None:
      writers.stop_profiler()
    mngr.wait_until_finished()
    mngr.close()
    writer.close()
  return last_eval
