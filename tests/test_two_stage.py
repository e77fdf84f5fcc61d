"""Two-stage model (issue: two-stage): zero leakage of hard and STE streams, STE's exact hard
forward and soft gradient, hard masks' gradient through the selected parts only (Appendix F) or
none, soft's measurable leakage, and 1 vs 8 devices for three training steps."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from metonymy import config_lib
from metonymy import loading
from metonymy.training import losses
from metonymy.training import trainer
from metonymy.models import attention_masks
from metonymy.models import stage1 as stage1_lib
from metonymy.models import two_stage
from metonymy.models import vit
from metonymy.training import run_state
from metonymy.training import sharding
from tests.helpers import compile_cache

compile_cache.enable()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
K, A = 3, 6
# No LayerScale: its 1e-5 init would make random blocks near-identities and hide leakage.
CONFIG = vit.ViTConfig(patch_size=4, width=32, depth=2, num_heads=2, mlp_dim=64,
                       pos_embed_grid=(6, 6), num_registers=1, image_size=24)


def _stage2_setup(mask, seed=0, **options):
  keys = jax.random.split(jax.random.PRNGKey(seed), 4)
  images = jax.random.normal(keys[0], (2, 24, 24, 3))
  logits = 3.0 * jax.nn.one_hot(jax.random.randint(keys[1], (2, 36), 0, K + 1), K + 1)
  probs = jax.nn.softmax(logits + jax.random.normal(keys[2], logits.shape), -1)
  module = two_stage.Stage2(CONFIG, num_parts=K, num_attributes=A, mask=mask, **options)
  params = module.init(keys[3], images, probs)["params"]
  return module, params, images, probs


def _outside(probs, k):
  """Pixels [B, 24, 24, 1] of patches whose argmax part is not k."""
  ids = jnp.argmax(probs, -1).reshape(2, 6, 6)
  return (jnp.repeat(jnp.repeat(ids, 4, 1), 4, 2) != k)[..., None]


@pytest.mark.parametrize("mask,hard_gradient", [("hard", "selected"), ("hard", "none"),
                                               ("ste", "selected")])
@pytest.mark.slow
def test_other_parts_pixels_leave_part_features_and_scores_bit_identical(mask, hard_gradient):
  # train=True: hard masks' "selected" gradient path is the one that runs.
  module, params, images, probs = _stage2_setup(mask, hard_gradient=hard_gradient)
  apply = jax.jit(lambda x: module.apply({"params": params}, x, probs))
  reference = apply(images)
  noise = 5.0 * jax.random.normal(jax.random.PRNGKey(9), images.shape)
  for k in range(K + 1):
    out = apply(jnp.where(_outside(probs, k), images + noise, images))
    np.testing.assert_array_equal(np.asarray(out["part_features"][:, k]),
                                  np.asarray(reference["part_features"][:, k]))
    if k < K:  # Part k's attribute scores (its logits before routing).
      np.testing.assert_array_equal(np.asarray(out["part_scores"][:, :, k]),
                                    np.asarray(reference["part_scores"][:, :, k]))


@pytest.mark.parametrize("mask", ["hard", "ste"])
def test_inference_drops_the_background_without_changing_the_foreground(mask):
  module, params, images, probs = _stage2_setup(mask)
  kept = module.clone(drop_background=False)
  dropped = jax.jit(lambda x: module.apply({"params": params}, x, probs, train=False))(images)
  full = jax.jit(lambda x: kept.apply({"params": params}, x, probs, train=False))(images)
  # The background group is skipped; the foreground's math is unchanged (bit for bit against
  # the full sorted forward: tests/test_block_sparse.py; here against the natural layout).
  assert not np.any(np.asarray(dropped["part_features"][:, K]))
  np.testing.assert_allclose(dropped["part_features"][:, :K], full["part_features"][:, :K],
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(dropped["logits"], full["logits"], rtol=1e-5, atol=1e-5)
  # Zero leakage holds in the dropped path too.
  noise = 5.0 * jax.random.normal(jax.random.PRNGKey(9), images.shape)
  apply = jax.jit(lambda x: module.apply({"params": params}, x, probs, train=False))
  for k in range(K):
    out = apply(jnp.where(_outside(probs, k), images + noise, images))
    np.testing.assert_array_equal(np.asarray(out["part_scores"][:, :, k]),
                                  np.asarray(dropped["part_scores"][:, :, k]))


@pytest.mark.parametrize("scope", ["layer", "stream"])
def test_ste_forward_equals_hard_forward_exactly(scope):
  hard, params, images, probs = _stage2_setup("hard")
  ste = two_stage.Stage2(CONFIG, num_parts=K, num_attributes=A, mask="ste", ste_scope=scope)
  a = hard.apply({"params": params}, images, probs)
  b = ste.apply({"params": params}, images, probs)  # train=True: hard and soft both computed.
  for key in ("part_features", "part_scores", "logits"):
    np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]))


def test_soft_masks_leak_measurably():
  module, params, images, probs = _stage2_setup("soft")
  apply = jax.jit(lambda x: module.apply({"params": params}, x, probs)["part_features"])
  reference = apply(images)
  changed = apply(jnp.where(_outside(probs, 0), images + 5.0, images))
  change = float(jnp.linalg.norm(changed[:, 0] - reference[:, 0]) / jnp.linalg.norm(reference[:, 0]))
  assert change > 1e-3, change


def _two_stage_model(mask, scope="layer", hard_gradient="selected", feedback_scale=1.0):
  backbone = vit.VisionTransformer(CONFIG)
  frozen = backbone.init(jax.random.PRNGKey(1), jnp.zeros((1, 24, 24, 3)))["params"]
  stage1 = stage1_lib.Stage1(backbone, stage1_lib.Stage1Head(num_parts=K, num_attributes=A))
  stage2 = two_stage.Stage2(CONFIG, num_parts=K, num_attributes=A, mask=mask, ste_scope=scope,
                            hard_gradient=hard_gradient, feedback_scale=feedback_scale)
  model = two_stage.TwoStage(stage1, stage2)
  images = jax.random.normal(jax.random.PRNGKey(2), (2, 24, 24, 3))
  return model, model.init(jax.random.PRNGKey(3), images, frozen), frozen, images


def test_hard_selected_gradient_keeps_the_hard_forward_exactly():
  none, params, images, probs = _stage2_setup("hard", hard_gradient="none")
  selected = none.clone(hard_gradient="selected")
  a = none.apply({"params": params}, images, probs)  # train=True: the gated path runs.
  b = selected.apply({"params": params}, images, probs)
  for key in ("part_features", "part_scores", "logits"):
    np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]))
  # Its bias is the hard block bias value for value (0 in a clique, the floor across cliques), so
  # the gated attention whose gradient the backward pass takes is the hard attention too.
  ids = jnp.argmax(probs, -1)
  bias = attention_masks.selected_part_attention_bias(probs, ids, CONFIG.num_prefix)
  block = attention_masks.block_attention_bias(
      attention_masks.early_masking_group_ids(ids, K, CONFIG.num_prefix))
  np.testing.assert_array_equal(np.asarray(bias), np.asarray(block))


def _stage2_map_gradient(module, params, images, probs, labels):
  """d(Stage-2 attribute loss)/d(Stage-1 maps) [B, K+1, 6, 6], maps on Stage 2's grid."""
  maps = jnp.moveaxis(probs, -1, 1).reshape(2, K + 1, 6, 6)

  def loss(maps):
    part_probs = two_stage.maps_to_patch_grid(maps, (6, 6))
    out = module.apply({"params": params}, images, part_probs, train=True)
    return losses.attribute_bce(out["logits"], labels, jnp.ones_like(labels, bool))
  return np.asarray(jax.grad(loss)(maps))


@pytest.mark.parametrize("tiles", [0, 8])
@pytest.mark.slow
def test_hard_gradient_reaches_the_selected_part_of_each_patch_only(tiles):
  """Appendix F: with hard masks the gradient flows through the selected tokens only. The
  attended layout (natural, or sorted and tiled) does not change that."""
  module, params, images, probs = _stage2_setup("hard", attention_tiles=tiles)
  labels = (jax.random.uniform(jax.random.PRNGKey(4), (2, A)) > 0.5).astype(jnp.float32)
  grads = _stage2_map_gradient(module, params, images, probs, labels)
  selected = np.asarray(jax.nn.one_hot(jnp.argmax(probs, -1), K + 1, axis=1)).reshape(grads.shape)
  selected = selected.astype(bool)
  assert not np.any(grads[~selected])  # Exactly zero: no signal to grow another part.
  # Every patch of a foreground part gets a signal. The background's stream never reaches the
  # attribute head, so its patches get none.
  foreground = selected & (np.arange(K + 1) < K)[None, :, None, None]
  assert np.all(grads[foreground] != 0), np.sum(grads[foreground] == 0)
  assert not np.any(grads[selected & ~foreground])
  none = module.clone(hard_gradient="none")
  assert not np.any(_stage2_map_gradient(none, params, images, probs, labels))


@pytest.mark.parametrize("mask,scope,hard_gradient,flows", [
    ("hard", "layer", "none", False), ("hard", "layer", "selected", True),
    ("soft", "layer", "selected", True), ("ste", "layer", "selected", True),
    ("ste", "stream", "selected", True)])
@pytest.mark.slow
def test_stage2_gradient_reaches_stage1_unless_hard_masks_send_none(mask, scope, hard_gradient,
                                                                     flows):
  model, params, frozen, images = _two_stage_model(mask, scope, hard_gradient)
  labels = (jax.random.uniform(jax.random.PRNGKey(4), (2, A)) > 0.5).astype(jnp.float32)

  def stage2_loss(params):
    out = model.apply(params, frozen, images, train=True, rng=jax.random.PRNGKey(5))
    return losses.attribute_bce(out["logits"]["stage2"], labels, jnp.ones_like(labels, bool))

  grads = jax.grad(stage2_loss)(params)
  norm = float(jnp.linalg.norm(grads["stage1"]["prototypes"]))
  assert (norm > 0.0) == flows, norm
  if not flows:  # Every Stage-1 parameter, exactly.
    assert not any(np.any(np.asarray(g)) for g in jax.tree_util.tree_leaves(grads["stage1"]))
  # Stage 2's own ViT always learns; the frozen backbone is not in `params` at all.
  assert float(jnp.linalg.norm(grads["stage2"]["backbone"]["blocks_0"]["mlp"]["fc1"]["kernel"])) > 0


@pytest.mark.parametrize("mask", ["ste", "hard"])
def test_feedback_scale_scales_stage2s_gradient_into_stage1_and_nothing_else(mask):
  """feedback_scale multiplies what Stage 2 sends Stage 1 (the counterfactual that lets it
  compete with the priors); the forward pass and Stage 2's own gradient stay bit-identical, so
  the arms differ in Stage 1's feedback alone. 0 cuts it."""
  labels = (jax.random.uniform(jax.random.PRNGKey(4), (2, A)) > 0.5).astype(jnp.float32)

  def run(scale):
    model, params, frozen, images = _two_stage_model(mask, feedback_scale=scale)

    def stage2_loss(params):
      out = model.apply(params, frozen, images, train=True, rng=jax.random.PRNGKey(5))
      return losses.attribute_bce(out["logits"]["stage2"], labels,
                                  jnp.ones_like(labels, bool)), out["logits"]["stage2"]
    return jax.grad(stage2_loss, has_aux=True)(params)

  grads, logits = run(1.0)
  scaled_grads, scaled_logits = run(30.0)
  np.testing.assert_array_equal(np.asarray(logits), np.asarray(scaled_logits))
  for a, b in zip(jax.tree_util.tree_leaves(grads["stage2"]),
                  jax.tree_util.tree_leaves(scaled_grads["stage2"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  prototypes = np.asarray(grads["stage1"]["prototypes"])
  assert np.linalg.norm(prototypes) > 0
  np.testing.assert_allclose(np.asarray(scaled_grads["stage1"]["prototypes"]), 30.0 * prototypes,
                             rtol=1e-4, atol=1e-9)
  cut, cut_logits = run(0.0)
  np.testing.assert_array_equal(np.asarray(logits), np.asarray(cut_logits))
  assert not any(np.any(np.asarray(g)) for g in jax.tree_util.tree_leaves(cut["stage1"]))


def test_two_stage_outputs_and_param_groups():
  model, params, frozen, images = _two_stage_model("ste")
  out = model.apply(params, frozen, images, train=False)
  assert set(out["logits"]) == {"stage1", "stage2"}
  assert out["stage2_part_features"].shape == (2, K + 1, CONFIG.width)
  assert out["maps"].shape == (2, K + 1, 6, 6)
  groups = set(jax.tree_util.tree_leaves(model.param_groups(params)))
  assert groups == {"prototypes", "heads", "backbone"}
  # Stage 2 starts as a copy of the pretrained weights.
  np.testing.assert_array_equal(np.asarray(params["stage2"]["backbone"]["norm"]["scale"]),
                                np.asarray(frozen["norm"]["scale"]))


def test_maps_are_resized_to_another_patch_grid():
  maps = jax.nn.softmax(jax.random.normal(jax.random.PRNGKey(0), (2, K + 1, 4, 4)), 1)
  probs = two_stage.maps_to_patch_grid(maps, (6, 6))
  assert probs.shape == (2, 36, K + 1)
  np.testing.assert_allclose(np.asarray(probs.sum(-1)), 1.0, atol=1e-6)


STEPS = 3  # Stage-2 training steps compared on 1 and 8 devices.


def _config(mask):
  config = config_lib.load_sibling_config(os.path.join(ROOT, "configs", "x.py"),
                                          f"synthetic_{mask}", "runlocal")
  config.data.options.splits = (("train", 64), ("val", 8))
  config.data.batch_size = config.data.eval_batch_size = 8
  config.trainer.num_steps = STEPS
  config.trainer.eval_every_steps = STEPS
  config.trainer.checkpoint_every_steps = STEPS
  return config


def _step_losses(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return {row["step"]: row["loss"] for row in map(json.loads, f) if "loss" in row}


_EIGHT_DEVICES = r"""
import json, sys
import jax
assert jax.device_count() == 8, jax.devices()
sys.path.insert(0, {root!r})
from tests import test_two_stage as t
from metonymy.training import trainer
out = {{}}
for mask in ("soft", "hard", "ste"):
  trainer.run(t._config(mask), {workdir!r} + "/" + mask)
  out[mask] = t._step_losses({workdir!r} + "/" + mask)
print("RESULT " + json.dumps(out))
"""


def test_hard_configs_send_the_selected_gradient_unless_told_none():
  config = _config("hard")
  assert config.model.stage2.hard_gradient == "selected"
  assert loading.build_model(config, A)[0].stage2.hard_gradient == "selected"
  config.model.stage2.hard_gradient = "none"
  assert loading.build_model(config, A)[0].stage2.hard_gradient == "none"
  # A bad value, from the config helper or a command-line override, fails where the model is built.
  with pytest.raises(ValueError, match="hard_gradient"):
    loading.build_model(config_lib.two_stage(_config("hard"), "hard", hard_gradient="stop"), A)


@pytest.mark.parametrize("option", ["mask", "feature", "ste_scope", "hard_gradient"])
def test_stage2_options_are_checked_where_the_model_is_built(option):
  config = _config("ste")
  config.model.stage2[option] = "bogus"
  with pytest.raises(ValueError, match=f"stage2 {option} must be one of .*'bogus'"):
    loading.build_model(config, A)


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf")])
def test_a_bad_feedback_scale_is_refused_where_the_model_is_built(value):
  config = _config("ste")
  config.model.stage2.feedback_scale = value
  with pytest.raises(ValueError, match="stage2 feedback_scale must be a finite number >= 0"):
    loading.build_model(config, A)


def test_a_model_block_without_the_later_stage2_options_builds_with_their_defaults():
  """A workdir's saved model block from before ste_scope, hard_gradient, drop_background and
  attention_tiles existed still rebuilds (loading.load_trained_part_model)."""
  config = _config("hard")
  config.model.stage2 = {"mask": "hard", "feature": "cls"}
  stage2 = loading.build_model(config, A)[0].stage2
  assert (stage2.ste_scope, stage2.hard_gradient, stage2.drop_background,
          stage2.attention_tiles) == ("layer", "selected", True, 0)


@pytest.mark.slow
def test_training_steps_match_on_one_and_eight_devices(tmp_path, two_stage_one_device_run):
  # The one-device runs: tests/helpers/shared_runs.py (the benchmark test below reads one too).
  one = {mask: _step_losses(os.path.join(two_stage_one_device_run.workdir, mask))
         for mask in ("soft", "hard", "ste")}
  env = compile_cache.process_env(8)
  proc = subprocess.run([sys.executable, "-c", _EIGHT_DEVICES.format(root=ROOT,
                                                                     workdir=str(tmp_path))],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-4000:]
  eight = json.loads([l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1][7:])
  steps = list(range(1, STEPS + 1))
  for mask in ("soft", "hard", "ste"):
    assert list(one[mask]) == steps
    np.testing.assert_allclose([eight[mask][str(s)] for s in steps], [one[mask][s] for s in steps],
                               rtol=2e-5, err_msg=mask)


@pytest.mark.slow
def test_benchmark_backbone_from_a_two_stage_workdir_gives_stage2_features(
    two_stage_one_device_run):
  """A two-stage workdir as `backbone.checkpoint` yields Stage 2's ViT: its early-masked CLS
  with Stage 1's part ids is exactly the model's Stage-2 part feature."""
  config = _config("ste")
  workdir = os.path.join(two_stage_one_device_run.workdir, "ste")
  masks = loading.load_trained_part_model(workdir)
  model, params, _ = loading.build_backbone(
      config_lib.backbone(checkpoint=workdir, image_size=config.data.image_size))
  size = config.data.image_size
  images = jax.random.normal(jax.random.PRNGKey(0), (2, size, size, 3))
  ids = masks.part_ids(images)
  early = model.apply({"params": params}, images, part_ids=ids,
                      num_parts=masks.model.num_parts)["part_tokens"][:, :, 0]
  np.testing.assert_allclose(np.asarray(early), np.asarray(masks.part_features(images)),
                             atol=1e-5, rtol=0)


def _saved_state(workdir):
  """The latest checkpoint's parameters and optimizer state, as saved (both stages)."""
  mngr = run_state.manager(workdir)
  try:
    step = mngr.latest_step()
    restored = mngr.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(), opt_state=ocp.args.StandardRestore()))
  finally:
    mngr.close()
  return step, restored["params"], restored["opt_state"]


@pytest.mark.slow
def test_ste_resume_after_a_kill_is_bit_exact(tmp_path, monkeypatch):
  """Stage 1's kill-and-resume test (tests/test_train.py) for the two-stage STE model."""
  def config():
    config = _config("ste")
    config.trainer.num_steps = 6
    config.trainer.eval_every_steps = 6
    config.trainer.checkpoint_every_steps = 3
    return config
  reference = str(tmp_path / "reference")
  trainer.run(config(), reference)
  workdir = str(tmp_path / "killed")
  real = sharding.global_batch
  calls = {"n": 0}

  def dies_at_batch_5(*args, **kwargs):
    calls["n"] += 1
    if calls["n"] == 5:  # steps 1-4 done, 4 not checkpointed: the resume replays it
      raise KeyboardInterrupt("simulated kill")
    return real(*args, **kwargs)

  monkeypatch.setattr(sharding, "global_batch", dies_at_batch_5)
  with pytest.raises(KeyboardInterrupt):
    trainer.run(config(), workdir)
  monkeypatch.setattr(sharding, "global_batch", real)
  assert run_state.manager(workdir).latest_step() == 3
  trainer.run(config(), workdir)

  assert _step_losses(workdir) == _step_losses(reference)
  (step, params, opt_state), want = _saved_state(workdir), _saved_state(reference)
  assert step == want[0] == 6
  leaves = jax.tree_util.tree_leaves_with_path((params, opt_state))
  expected = jax.tree_util.tree_leaves(want[1:])
  assert len(leaves) == len(expected) and any("stage2" in jax.tree_util.keystr(p) for p, _ in leaves)
  for (path, a), b in zip(leaves, expected):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("mask", two_stage.MASKS)
@pytest.mark.slow
def test_both_arms_start_stage1_from_the_same_parameters(mask):
  """A single- vs two-stage comparison differs in Stage 2 alone: the same `init(rng)` gives both
  models' Stage 1 the same parameters (the configs and builder the trainer uses)."""
  single = config_lib.load_config(os.path.join(ROOT, "configs", "synthetic_single.py"), "runlocal")
  two = config_lib.load_config(os.path.join(ROOT, "configs", f"synthetic_{mask}.py"), "runlocal")
  single_model, frozen = loading.build_model(single, A)
  two_model, _ = loading.build_model(two, A)
  images = jnp.zeros((1, single.data.image_size, single.data.image_size, 3))
  rng = jax.random.PRNGKey(7)
  single_params = single_model.init(rng, images, frozen)
  two_params = two_model.init(rng, images, frozen)
  jax.tree_util.tree_map(np.testing.assert_array_equal, single_params, two_params["stage1"])
  # Another key gives Stage 1 other prototypes: the equality above is not a constant init.
  other = single_model.init(jax.random.PRNGKey(8), images, frozen)
  assert not np.array_equal(other["prototypes"], single_params["prototypes"])


def test_stage1_options_carry_over_into_every_two_stage_variant():
  """A single- vs two-stage comparison must differ in Stage 2 alone, so each of Stage 1's
  options set on the single-stage config reaches the two-stage model's Stage 1."""
  single = config_lib.load_config(os.path.join(ROOT, "configs", "synthetic_single.py"), "runlocal")
  changed = {"embedding_norm": "joint", "part_dropout": 0.1, "evaluation_noise": True,
             "background_prototypes": 2, "prototype_init": "kmeans", "prototype_init_images": 3,
             "trained_tokens": True}
  assert set(changed) == set(config_lib.STAGE1_OPTIONS)
  for key, value in changed.items():
    single.model[key] = value
  backbone = vit.VisionTransformer(CONFIG)
  for mask in two_stage.MASKS:
    two = config_lib.two_stage(single, mask)
    assert {k: two.model[k] for k in changed} == changed
    head = stage1_lib.build(two, backbone, A).head
    assert (head.embedding_norm, head.part_dropout, head.evaluation_noise,
            head.background_prototypes) == ("joint", 0.1, True, 2)
