"""The self-supervised objectives (metonymy/training/self_supervised.py) and the masked forward
they need (models/vit.py's token_mask)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from metonymy.models import vit
from metonymy.training import self_supervised as ssl


def _tiny():
  config = vit.get_config("vit_tiny_test").replace(image_size=16, patch_size=4,
                                                   pos_embed_grid=(4, 4))
  model, params = vit.init_params(config, jax.random.PRNGKey(0))
  return model, params, config


@pytest.mark.slow
def test_a_masked_patch_s_pixels_never_reach_the_network():
  model, params, config = _tiny()
  images = jax.random.normal(jax.random.PRNGKey(1), (2, 16, 16, 3))
  token_mask = jnp.zeros((2, 16), bool).at[:, 5].set(True)  # patch (1, 1): pixels 4-7, 4-7
  mask_token = jax.random.normal(jax.random.PRNGKey(2), (config.width,))
  forward = jax.jit(lambda x, m: model.apply({"params": params}, x, token_mask=m,
                                             mask_token=mask_token))
  changed = images.at[:, 4:8, 4:8].add(5.0)
  masked, masked_changed = forward(images, token_mask), forward(changed, token_mask)
  for key in ("patch_tokens", "prefix_tokens"):
    np.testing.assert_array_equal(masked[key], masked_changed[key])
  # Unmasked, the same change is seen; and an empty mask is the plain forward.
  plain = forward(images, jnp.zeros_like(token_mask))
  assert not np.allclose(plain["patch_tokens"], forward(changed, jnp.zeros_like(token_mask))[
      "patch_tokens"])
  np.testing.assert_allclose(plain["patch_tokens"],
                             model.apply({"params": params}, images)["patch_tokens"], atol=1e-6)
  with pytest.raises(ValueError, match="plain forward"):
    model.apply({"params": params}, images, part_ids=jnp.zeros((2, 4, 4), jnp.int32),
                num_parts=1, token_mask=token_mask, mask_token=mask_token)


def test_token_masks_mask_the_drawn_share_of_the_chosen_rows():
  mask = np.asarray(ssl.random_token_masks(jax.random.PRNGKey(0), 400, 100, 0.5, (0.2, 0.4)))
  counts = mask.sum(1)
  chosen = counts > 0
  assert 0.4 < chosen.mean() < 0.6
  assert counts[chosen].min() >= 20 and counts[chosen].max() <= 40
  always = np.asarray(ssl.random_token_masks(jax.random.PRNGKey(1), 50, 100, 1.0, (0.3, 0.3)))
  np.testing.assert_array_equal(always.sum(1), 30)


def test_a_full_crop_is_the_image_or_its_mirror():
  image = jax.random.normal(jax.random.PRNGKey(0), (16, 16, 3))
  for seed in range(6):
    view, box = ssl.random_resized_crop(image, jax.random.PRNGKey(seed), 16, (1.0, 1.0),
                                        (1.0, 1.0))
    expected = image[:, ::-1] if box[4] else image
    np.testing.assert_allclose(view, expected, atol=1e-5)
    np.testing.assert_allclose(box[:4], [0, 0, 16, 16], atol=1e-4)
  small, box = ssl.random_resized_crop(image, jax.random.PRNGKey(0), 8, (0.1, 0.2))
  assert small.shape == (8, 8, 3)
  assert 0.1 * 256 - 1e-3 <= float(box[2] * box[3]) <= 0.2 * 256 + 1e-3


def test_corresponding_tokens_follow_the_crops_geometry():
  whole = jnp.array([[0.0, 0.0, 16.0, 16.0, 0.0]])
  mirrored = whole.at[0, 4].set(1.0)
  index, inside = ssl.corresponding_tokens(whole, 4, whole, 4)
  np.testing.assert_array_equal(index[0], np.arange(16))
  assert bool(inside.all())
  index, _ = ssl.corresponding_tokens(whole, 4, mirrored, 4)  # the teacher's view is mirrored
  np.testing.assert_array_equal(index[0].reshape(4, 4), np.arange(16).reshape(4, 4)[:, ::-1])
  # A student crop of the image's top-left quarter at a 2 x 2 grid: its tokens are the
  # teacher's (0, 0), (0, 1), (1, 0), (1, 1) on the whole image's 4 x 4 grid.
  quarter = jnp.array([[0.0, 0.0, 8.0, 8.0, 0.0]])
  index, inside = ssl.corresponding_tokens(quarter, 2, whole, 4)
  np.testing.assert_array_equal(index[0], [0, 1, 4, 5])
  # The teacher's crop is the right half: the quarter's points lie outside it.
  right = jnp.array([[0.0, 8.0, 16.0, 8.0, 0.0]])
  _, inside = ssl.corresponding_tokens(quarter, 2, right, 4)
  assert not bool(inside.any())


def test_dino_loss_pairs_every_student_view_with_the_other_teacher_views_only():
  rng = np.random.default_rng(0)
  student = jnp.asarray(rng.normal(size=(3, 4, 6)), jnp.float32)  # 2 global views + 1 local
  teacher = jax.nn.softmax(jnp.asarray(rng.normal(size=(2, 4, 6)), jnp.float32), -1)
  ce = lambda s, t: float(ssl.distillation_loss(student[s], teacher[t], 0.1))
  expected = (ce(1, 0) + ce(2, 0) + ce(0, 1) + ce(2, 1)) / 4
  assert float(ssl.dino_loss(student, teacher, 0.1)) == pytest.approx(expected, rel=1e-6)
  # The student's own view (s == t) would be a trivial target: it is left out.
  with_own = (ce(0, 0) + ce(1, 0) + ce(2, 0) + ce(0, 1) + ce(1, 1) + ce(2, 1)) / 6
  assert float(ssl.dino_loss(student, teacher, 0.1)) != pytest.approx(with_own, rel=1e-3)


def test_the_teacher_distribution_is_centred_and_sharpened_without_gradient():
  scores = jnp.array([[2.0, 0.0, 0.0], [2.0, 1.0, 0.0]])
  center = jnp.array([2.0, 0.0, 0.0])
  probs = ssl.teacher_distribution(scores, center, 0.5)
  np.testing.assert_allclose(probs[0], [1 / 3] * 3, atol=1e-6)  # centring removes the bias
  sharp = ssl.teacher_distribution(scores, jnp.zeros(3), 0.05)
  assert float(sharp[1, 0]) > 0.99
  grad = jax.grad(lambda s: jnp.sum(ssl.teacher_distribution(s, center, 0.5)[:, 0]))(scores)
  np.testing.assert_array_equal(grad, 0.0)
  new = ssl.updated_centers({"h": jnp.zeros(3)}, {"h": scores}, 0.9)["h"]
  np.testing.assert_allclose(new, 0.1 * jnp.mean(scores, 0), atol=1e-7)


def test_koleo_rewards_spread_features():
  rng = np.random.default_rng(0)
  spread = jnp.asarray(rng.normal(size=(32, 8)), jnp.float32)
  clustered = spread * 0.01 + jnp.ones(8)
  assert float(ssl.koleo_loss(spread)) < float(ssl.koleo_loss(clustered)) - 1.0
  assert np.all(np.isfinite(jax.grad(lambda f: ssl.koleo_loss(f))(spread)))


def test_the_teacher_follows_the_student_by_its_momentum():
  teacher, student = {"w": jnp.zeros(3)}, {"w": jnp.ones(3)}
  np.testing.assert_allclose(ssl.ema(teacher, student, 0.99)["w"], 0.01, atol=1e-7)
  recipe = ssl.Recipe()
  assert float(ssl.teacher_momentum(recipe, 0, 100)) == pytest.approx(0.992)
  assert float(ssl.teacher_momentum(recipe, 99, 100)) == pytest.approx(1.0)
  assert float(ssl.teacher_temperature(recipe, 0, 100)) == pytest.approx(0.04)
  assert float(ssl.teacher_temperature(recipe, 50, 100)) == pytest.approx(0.07)


def test_pixel_targets_keep_or_remove_a_patch_s_tone():
  tone = jnp.full((1, 8, 8, 3), 0.7)
  mask = jnp.ones((1, 4), bool)
  patch = 4
  predicted_tone = jnp.full((1, 4, 48), 0.7)
  assert float(ssl.pixel_loss(predicted_tone, tone, mask, patch, "image")) == pytest.approx(0.0)
  # Standardised per patch, a plain patch is all zeros: its tone is not in the target.
  assert float(ssl.pixel_loss(jnp.zeros((1, 4, 48)), tone, mask, patch, "patch")) == (
      pytest.approx(0.0, abs=1e-6))
  # Only the masked patches count.
  half = jnp.array([[True, False, False, False]])
  wrong_elsewhere = predicted_tone.at[:, 1:].set(0.0)
  assert float(ssl.pixel_loss(wrong_elsewhere, tone, half, patch, "image")) == pytest.approx(0.0)


@pytest.mark.slow
def test_the_ibot_target_is_the_teacher_s_unmasked_view():
  """The mask token changes the student's loss but never the teacher's targets."""
  model, params, config = _tiny()
  recipe = ssl.Recipe(dino=0.0, koleo=0.0, local_crops=0, mask_probability=1.0,
                      prototypes=16, head_hidden=16, head_bottleneck=8)
  trainable = {"backbone": params, **ssl.init_heads(recipe, jax.random.PRNGKey(3), config.width,
                                                    config.patch_size)}
  teacher = ssl.teacher_part(trainable)
  images = jax.random.normal(jax.random.PRNGKey(4), (4, 16, 16, 3))

  def run(mask_token):
    p = dict(trainable, mask_token=mask_token)
    return ssl.objective(model, recipe, p, teacher, ssl.centers(recipe), images,
                         jax.random.PRNGKey(5), 0, 10)

  loss_a, aux_a = run(trainable["mask_token"])
  loss_b, aux_b = run(trainable["mask_token"] + 1.0)
  np.testing.assert_array_equal(aux_a["teacher_scores"]["ibot_head"],
                                aux_b["teacher_scores"]["ibot_head"])
  assert float(loss_a) != float(loss_b)
  grad = jax.grad(lambda token: run(token)[0])(trainable["mask_token"])
  assert float(jnp.linalg.norm(grad)) > 0.0
  # `teacher_centering="sinkhorn"` gives the teacher's patch targets the batch's equal shares:
  # the mean target's entropy is log P's, above the running centre's at its start.
  sinkhorn = dataclasses.replace(recipe, teacher_centering="sinkhorn")
  _, aux_s = ssl.objective(model, sinkhorn, trainable, teacher, ssl.centers(sinkhorn), images,
                           jax.random.PRNGKey(5), 0, 10)
  assert float(aux_s["ibot/teacher_mean_entropy"]) == pytest.approx(np.log(16), abs=0.05)
  assert float(aux_s["ibot/teacher_mean_entropy"]) > float(aux_a["ibot/teacher_mean_entropy"])


def test_recipes_refuse_unknown_options_and_empty_objectives():
  with pytest.raises(ValueError, match="unknown self-supervised option.*'dinno'"):
    ssl.Recipe.from_dict({"dinno": 1.0})
  with pytest.raises(ValueError, match="nothing to train"):
    ssl.Recipe(dino=0, ibot=0, koleo=0)
  with pytest.raises(ValueError, match="pixel_target"):
    ssl.Recipe(pixel_target="tone")
  assert ssl.Recipe.from_dict({"mask_ratio": [0.2, 0.3]}).mask_ratio == (0.2, 0.3)


def _distinct_tokens(batch, tokens, dim, seed):
  return jax.random.normal(jax.random.PRNGKey(seed), (batch, tokens, dim))


def test_the_dense_loss_rewards_picking_the_token_at_the_same_image_point():
  teacher = _distinct_tokens(2, 9, 16, 0)
  order = jnp.tile(jnp.arange(9)[::-1], (2, 1))  # student token i sits where teacher 8 - i is
  student = jnp.take_along_axis(teacher, order[..., None], axis=1)
  inside = jnp.ones((2, 9))
  right = ssl.dense_loss(student, teacher, order, inside, 0.1)
  wrong = ssl.dense_loss(student, teacher, jnp.tile(jnp.arange(9), (2, 1)), inside, 0.1)
  assert float(right) < 0.1 < np.log(9) < float(wrong)
  # Points outside the teacher's view count for nothing.
  half = inside.at[:, 4:].set(0)
  wrong_outside = order.at[:, 4:].set(0)
  np.testing.assert_allclose(ssl.dense_loss(student, teacher, wrong_outside, half, 0.1),
                             ssl.dense_loss(student, teacher, order, half, 0.1), rtol=1e-6)
  # No gradient reaches the teacher.
  grad = jax.grad(lambda t: ssl.dense_loss(student, t, order, inside, 0.1))(teacher)
  assert float(jnp.abs(grad).max()) == 0.0


def test_the_dense_loss_draws_its_negatives_from_the_same_image_only():
  """A token shared by every token of an image, or another image's tokens, change nothing: the
  term is the mean of each image's own term."""
  teacher = _distinct_tokens(2, 9, 16, 1)
  student = teacher + 0.5 * _distinct_tokens(2, 9, 16, 2)
  index, inside = jnp.tile(jnp.arange(9), (2, 1)), jnp.ones((2, 9))
  both = ssl.dense_loss(student, teacher, index, inside, 0.1)
  alone = [ssl.dense_loss(student[b:b + 1], teacher[b:b + 1], index[b:b + 1], inside[b:b + 1],
                          0.1) for b in range(2)]
  np.testing.assert_allclose(both, (alone[0] + alone[1]) / 2, rtol=1e-6)
  # Image 0's gradient is blind to image 1's teacher tokens: with negatives across images it
  # would move when they do.
  grad_of_image_0 = lambda t: jax.grad(
      lambda s: ssl.dense_loss(s, t, index, inside, 0.1))(student)[0]
  np.testing.assert_array_equal(grad_of_image_0(teacher),
                                grad_of_image_0(teacher.at[1].set(student[0])))


def test_the_soft_dense_target_spreads_over_the_tokens_the_teacher_finds_alike():
  teacher = _distinct_tokens(1, 6, 16, 3)
  index, inside = jnp.arange(6)[None], jnp.ones((1, 6))
  student = teacher + 0.3 * _distinct_tokens(1, 6, 16, 4)
  # Sharp enough, the soft target is the hard one.
  np.testing.assert_allclose(ssl.dense_loss(student, teacher, index, inside, 0.1, 1e-4),
                             ssl.dense_loss(student, teacher, index, inside, 0.1), rtol=1e-5)
  # A student that sees what the teacher sees is at the soft target's optimum (at equal
  # temperatures) even where two tokens are alike (a plain region); the hard target would still
  # push it to tell them apart.
  plain = teacher.at[0, 1].set(teacher[0, 0] + 0.01)
  grad = lambda tt: jax.grad(lambda s: ssl.dense_loss(s, plain, index, inside, 0.1, tt))(plain)
  soft, hard = (float(jnp.abs(grad(t)).max()) for t in (0.1, 0.0))
  assert soft < 1e-6 < 1e-4 < hard, (soft, hard)


def test_the_geometric_dense_target_weighs_the_teachers_tokens_by_their_grid_distance():
  grid, radius = 4, 1.5
  teacher = _distinct_tokens(1, grid * grid, 8, 5)
  student = _distinct_tokens(1, grid * grid, 8, 6)
  index = jnp.asarray(np.random.default_rng(0).permutation(grid * grid))[None]
  inside = jnp.ones((1, grid * grid))
  got = ssl.dense_loss(student, teacher, index, inside, 0.1, target_radius=radius)
  # By hand: the target around each student token is centred on the teacher token at its image
  # point (index), not on the student token's own place.
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
  logits = unit(np.asarray(student[0])) @ unit(np.asarray(teacher[0])).T / 0.1
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  cells = np.stack(np.divmod(np.arange(grid * grid), grid), -1)
  d2 = ((cells[np.asarray(index[0])][:, None] - cells[None]) ** 2).sum(-1)
  target = np.exp(-d2 / (2 * radius ** 2))
  target /= target.sum(-1, keepdims=True)
  np.testing.assert_allclose(got, -(target * log_probs).sum(-1).mean(), rtol=1e-5)
  # Narrow enough, it is the hard target.
  np.testing.assert_allclose(ssl.dense_loss(student, teacher, index, inside, 0.1,
                                            target_radius=0.05),
                             ssl.dense_loss(student, teacher, index, inside, 0.1), rtol=1e-5)
  # A fixed target: tokens that are all alike (a collapsed teacher and student) do not meet it.
  alike = jnp.ones_like(teacher)
  collapsed = ssl.dense_loss(alike, alike, index, inside, 0.1, target_radius=radius)
  np.testing.assert_allclose(collapsed, np.log(grid * grid), rtol=1e-5)
  assert float(got) != pytest.approx(float(collapsed))
  with pytest.raises(ValueError, match="one soft target at a time"):
    ssl.Recipe(dense=1.0, dense_target_radius=1.0, dense_target_temperature=0.1)


def test_the_correspondence_loss_targets_the_teacher_s_similarities_to_another_image():
  """By hand: a student token's softmax over the other image's teacher tokens against the
  teacher's own from its token at the same point; at equal temperatures a student that sees what
  the teacher sees is at its optimum; no gradient reaches either teacher input."""
  teacher = _distinct_tokens(1, 6, 8, 7)
  other = _distinct_tokens(1, 5, 8, 8)
  student = _distinct_tokens(1, 6, 8, 9)
  index = jnp.asarray([[3, 0, 5, 1, 4, 2]])
  inside = jnp.ones((1, 6)).at[0, 5].set(0)
  got = ssl.correspondence_loss(student, teacher, other, index, inside, 0.1, 0.05)
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
  log_softmax = lambda z: z - np.log(np.exp(z).sum(-1, keepdims=True))
  others = unit(np.asarray(other[0]))
  target = np.exp(log_softmax(unit(np.asarray(teacher[0]))[np.asarray(index[0])] @ others.T
                              / 0.05))
  log_probs = log_softmax(unit(np.asarray(student[0])) @ others.T / 0.1)
  np.testing.assert_allclose(got, -(target * log_probs).sum(-1)[:5].mean(), rtol=1e-5)
  anchored = jnp.take_along_axis(teacher, index[..., None], axis=1)
  grad = jax.grad(lambda s: ssl.correspondence_loss(s, teacher, other, index, inside, 0.1, 0.1))
  assert float(jnp.abs(grad(anchored)).max()) < 1e-6 < float(jnp.abs(grad(student)).max())
  for position in (1, 2):
    grad = jax.grad(lambda t: ssl.correspondence_loss(
        *[t if i == position else a for i, a in enumerate((student, teacher, other))],
        index, inside, 0.1, 0.05), argnums=0)
    assert float(jnp.abs(grad((student, teacher, other)[position])).max()) == 0.0
  # The target's similarities may come from other tokens of the same two views (an earlier
  # block's): the prediction stays the same, the target is theirs.
  np.testing.assert_allclose(
      ssl.correspondence_loss(student, teacher, other, index, inside, 0.1, 0.05, teacher, other),
      got, rtol=1e-6)
  earlier, earlier_other = _distinct_tokens(1, 6, 4, 13), _distinct_tokens(1, 5, 4, 14)
  target = np.exp(log_softmax(unit(np.asarray(earlier[0]))[np.asarray(index[0])]
                              @ unit(np.asarray(earlier_other[0])).T / 0.05))
  np.testing.assert_allclose(
      ssl.correspondence_loss(student, teacher, other, index, inside, 0.1, 0.05, earlier,
                              earlier_other),
      -(target * log_probs).sum(-1)[:5].mean(), rtol=1e-5)
  with pytest.raises(ValueError, match="correspondence_temperature"):
    ssl.Recipe(correspondence=1.0, correspondence_temperature=0.0)
  with pytest.raises(ValueError, match="correspondence_block"):
    ssl.Recipe(correspondence=1.0, correspondence_block=-1)


@pytest.mark.slow
def test_the_correspondence_term_compares_each_image_with_another_one_of_the_batch():
  """Image 0's term reads the teacher's tokens of another image (b - 1: the last one): its
  gradient moves when that image's teacher tokens do, and not with a third image's. Compared
  with its own image's tokens the term would be a second within-image term."""
  batch, grid, width = 3, 3, 8
  recipe = ssl.Recipe(dino=0.0, ibot=0.0, koleo=0.0, correspondence=1.0, local_crops=0)
  seen = {"global": jnp.zeros((2, batch, grid * 4, grid * 4, 3)),
          "global_boxes": jnp.tile(jnp.asarray([0.0, 0.0, 1.0, 1.0, 0.0]), (2, batch, 1))}
  student = _distinct_tokens(2 * batch, grid * grid, width, 10)
  teacher = _distinct_tokens(2 * batch, grid * grid, width, 11)

  def image_0_gradient(teacher):
    grad = jax.grad(lambda s: ssl._correspondence_term(recipe, s, teacher, seen, batch, 4,
                                                       None))(student)
    return np.asarray(grad.reshape(2, batch, grid * grid, width)[:, 0])

  base = image_0_gradient(teacher)
  moved = lambda image: teacher.reshape(2, batch, grid * grid, width).at[:, image].add(
      _distinct_tokens(2, grid * grid, width, 12)).reshape(teacher.shape)
  assert np.abs(image_0_gradient(moved(batch - 1)) - base).max() > 1e-4
  np.testing.assert_array_equal(image_0_gradient(moved(1)), base)
  with pytest.raises(ValueError, match="2 or more images"):
    ssl._correspondence_term(recipe, student[:2], teacher[:2], {
        "global": seen["global"][:, :1], "global_boxes": seen["global_boxes"][:, :1]}, 1, 4, None)


@pytest.mark.slow
def test_the_correspondence_target_comes_from_the_teacher_s_block_when_asked():
  """`correspondence_block` k: the target's similarities are the teacher's block-k tokens'
  (`correspondence_loss` checks the arithmetic by hand), so on the same networks the term
  differs from the last block's target; the prediction still reads the teacher's last block;
  a block beyond the depth is refused."""
  model, params, config = _tiny()
  images = jax.random.normal(jax.random.PRNGKey(6), (3, 16, 16, 3))
  last = f"blocks_{config.depth - 1}"
  moved = dict(params, **{last: jax.tree.map(lambda w: w * 1.5 + 0.1, params[last])})

  def loss(block, teacher_backbone):
    recipe = ssl.Recipe(dino=0.0, ibot=0.0, koleo=0.0, correspondence=1.0,
                        correspondence_block=block, local_crops=0)
    _, aux = ssl.objective(model, recipe, {"backbone": params}, {"backbone": teacher_backbone},
                           {}, images, jax.random.PRNGKey(7), 0, 10)
    return float(aux["loss/correspondence"])

  assert loss(1, params) != pytest.approx(loss(0, params), rel=1e-3)
  assert loss(1, moved) != pytest.approx(loss(1, params), rel=1e-3)
  with pytest.raises(ValueError, match="beyond the backbone's depth"):
    loss(config.depth + 1, params)


@pytest.mark.slow
def test_an_attribute_term_read_from_an_earlier_block_sends_the_blocks_above_no_gradient():
  """`attribute_block` k: the attribute read-outs see block k's tokens through the final norm,
  so the last block gets no gradient from them; at 0 (the last block) it does."""
  model, params, config = _tiny()
  images = jax.random.normal(jax.random.PRNGKey(1), (2, 16, 16, 3))
  read = lambda out: jnp.sum(out["prefix_tokens"][:, 0] ** 2) + jnp.sum(out["patch_tokens"])

  def last_block_gradient(block):
    recipe = ssl.Recipe(dino=0.0, ibot=0.0, koleo=0.0, attributes=1.0, attribute_block=block,
                        local_crops=0)
    grads = jax.grad(lambda p: ssl.objective(model, recipe, {"backbone": p}, None, {}, images,
                                             jax.random.PRNGKey(2), 0, 10, read)[0])(params)
    last = f"blocks_{config.depth - 1}"
    return max(float(jnp.abs(g).max()) for g in jax.tree_util.tree_leaves(grads[last]))
  assert last_block_gradient(0) > 0
  assert last_block_gradient(config.depth - 1) == 0.0
  with pytest.raises(ValueError, match="below the backbone's depth"):
    last_block_gradient(config.depth)


@pytest.mark.slow
def test_the_dense_head_projects_student_and_teacher_tokens_each_with_its_own_weights():
  """With `dense_head` the term compares the tokens' images under the projection MLP: the
  student's through its own head (which the gradient trains), the teacher's through the teacher's
  (its EMA copy); the other parameters' initial draws are those of the recipe without it."""
  model, params, config = _tiny()
  plain = ssl.Recipe(dino=0.0, ibot=1.0, koleo=0.0, dense=1.0, local_crops=0, prototypes=16,
                     head_hidden=16, head_bottleneck=8)
  recipe = dataclasses.replace(plain, dense_head=8)
  without = ssl.init_heads(plain, jax.random.PRNGKey(3), config.width, config.patch_size)
  trainable = {"backbone": params, **ssl.init_heads(recipe, jax.random.PRNGKey(3), config.width,
                                                    config.patch_size)}
  assert set(trainable) - set(without) == {"backbone", "dense_head"}
  for name in without:
    jax.tree.map(np.testing.assert_array_equal, without[name], trainable[name])
  teacher = ssl.teacher_part(trainable)
  assert "dense_head" in teacher
  images = jax.random.normal(jax.random.PRNGKey(4), (4, 16, 16, 3))

  def dense(p, t):
    _, aux = ssl.objective(model, recipe, p, t, ssl.centers(recipe), images,
                           jax.random.PRNGKey(5), 0, 10)
    return aux["loss/dense"]

  nudged = lambda head: jax.tree.map(lambda w: w + 0.3, head)
  base = float(dense(trainable, teacher))
  assert float(dense(dict(trainable, dense_head=nudged(trainable["dense_head"])), teacher)) != base
  assert float(dense(trainable, dict(teacher, dense_head=nudged(teacher["dense_head"])))) != base
  grad = jax.grad(lambda head: dense(dict(trainable, dense_head=head), teacher))(
      trainable["dense_head"])
  assert float(optax.global_norm(grad)) > 0.0
  with pytest.raises(ValueError, match="dense_head"):
    ssl.Recipe(dense=1.0, dense_head=-1)


def test_sinkhorn_targets_share_the_batch_equally_among_the_prototypes():
  """Every item's target sums to 1, and every prototype gets 1 / P of the batch even when every
  item's scores prefer the same one (where the plain softmax would give it all): a prototype
  cannot be kept by one image's tokens or won by all."""
  scores = 0.3 * jax.random.normal(jax.random.PRNGKey(0), (2, 48, 8))
  scores = scores.at[..., 0].add(1.0)  # every item leans to prototype 0
  targets = ssl.sinkhorn_distribution(scores, 0.1, iterations=10)
  assert targets.shape == scores.shape
  np.testing.assert_allclose(targets.sum(-1), 1.0, rtol=1e-4)
  np.testing.assert_allclose(targets.reshape(-1, 8).mean(0), 1 / 8, rtol=1e-2)
  softmax = jax.nn.softmax(scores / 0.1, -1).reshape(-1, 8).mean(0)
  assert float(softmax[0]) > 0.9
  # Items keep their preferences among what is left: a target is sharp, not the uniform one.
  assert float(targets.max(-1).mean()) > 0.5
  # No gradient reaches the teacher's scores.
  grad = jax.grad(lambda s: jnp.sum(ssl.sinkhorn_distribution(s, 0.1)[..., 1]))(scores)
  assert float(jnp.abs(grad).max()) == 0.0
  with pytest.raises(ValueError, match="teacher_centering"):
    ssl.Recipe(teacher_centering="median")


def _directions(count, dim, seed):
  """count unit vectors [count, dim], far apart (random in a high dimension)."""
  d = jax.random.normal(jax.random.PRNGKey(seed), (count, dim))
  return d / jnp.linalg.norm(d, axis=-1, keepdims=True)


def _around(directions, per, noise, seed):
  """per tokens around each direction, [count * per, dim], in order of direction."""
  jitter = noise * jax.random.normal(jax.random.PRNGKey(seed),
                                     (directions.shape[0], per, directions.shape[1]))
  return (directions[:, None] + jitter).reshape(-1, directions.shape[1])


def test_the_first_batch_places_the_centroids_on_its_clusters():
  directions = _directions(3, 16, 0)
  tokens = _around(directions, 40, 0.05, 1)
  used, following, _ = ssl.cluster_centroids(tokens, jnp.zeros((3, 16)),
                                             jax.random.PRNGKey(2), momentum=0.99)
  # Each direction has a centroid on it, and the used centroids are the placed ones.
  assert float(jnp.min(jnp.max(directions @ used.T, axis=1))) > 0.99
  np.testing.assert_allclose(jnp.linalg.norm(following, axis=-1), 1.0, atol=1e-5)
  # Placed centroids are kept, not placed again: the next batch's targets use them as given.
  again, _, _ = ssl.cluster_centroids(tokens, following, jax.random.PRNGKey(9), momentum=0.99)
  np.testing.assert_array_equal(again, following)


def test_centroids_move_towards_their_tokens_by_the_momentum_and_the_unused_are_redrawn():
  directions = _directions(3, 16, 3)
  tokens = jnp.repeat(directions[:2], 5, axis=0)          # two of the three directions only
  start = jnp.stack([directions[0] + 0.3 * directions[2], directions[1],
                     -directions[0] - directions[1]])     # the third is nearest no token
  start = start / jnp.linalg.norm(start, axis=-1, keepdims=True)
  used, following, _ = ssl.cluster_centroids(tokens, start, jax.random.PRNGKey(4), momentum=0.9)
  np.testing.assert_array_equal(used, start)
  expected = 0.9 * start[0] + 0.1 * directions[0]
  np.testing.assert_allclose(following[0], expected / jnp.linalg.norm(expected), atol=1e-5)
  np.testing.assert_allclose(following[1], directions[1], atol=1e-5)
  # The unused centroid is drawn again from the batch's tokens.
  assert float(jnp.max(tokens @ following[2])) == pytest.approx(1.0, abs=1e-5)


def _full_views(batch, grid, patch):
  """`views`' boxes for two unflipped whole-image crops: token i of one view is token i of the
  other."""
  box = jnp.array([0.0, 0.0, grid * patch, grid * patch, 0.0])
  return {"global": jnp.zeros((2, batch, grid * patch, grid * patch, 3)),
          "global_boxes": jnp.broadcast_to(box, (2, batch, 5))}


def test_the_cluster_target_is_the_centroid_of_the_teacher_s_token_at_the_same_point():
  """Student tokens on their teacher token's centroid score low; on another centroid, high;
  and the target comes from the teacher's tokens, not the student's own."""
  batch, grid, patch = 2, 4, 4
  directions = _directions(4, 16, 5)
  # Both global views whole and unflipped: the other view's token at a point is the same image
  # point's, so each image's labels serve both views.
  labels = jnp.tile(jax.random.randint(jax.random.PRNGKey(6), (batch, grid * grid), 0, 4),
                    (2, 1))
  teacher = directions[labels]
  recipe = ssl.Recipe(dino=0.0, ibot=0.0, koleo=0.0, clusters=1.0, cluster_count=4,
                      local_crops=0, student_temperature=0.05)
  seen = _full_views(batch, grid, patch)
  term = lambda student: ssl._cluster_term(recipe, student, teacher, directions, seen, batch,
                                           patch, None, jax.random.PRNGKey(0))
  right, _, watch = term(teacher)
  wrong, _, _ = term(directions[(labels + 1) % 4])
  assert float(right) < 0.01 < 1.0 < float(wrong)
  shares = np.bincount(np.asarray(labels).ravel(), minlength=4) / labels.size
  assert float(watch["largest_share"]) == pytest.approx(shares.max())
  # No centroid is owed a share: a batch on one centroid keeps it all.
  _, _, one = ssl._cluster_term(recipe, teacher, jnp.broadcast_to(directions[0], teacher.shape),
                                directions, seen, batch, patch, None, jax.random.PRNGKey(0))
  assert float(one["largest_share"]) == 1.0 and float(one["share_entropy"]) == 0.0


@pytest.mark.slow
def test_the_cluster_term_trains_the_student_not_the_centroids():
  """The centroids are state: the loss sends them no gradient, the student's tokens get one,
  and the objective hands the next step's centroids back for the trainer to keep."""
  model, params, config = _tiny()
  recipe = ssl.Recipe(dino=0.0, ibot=0.0, koleo=0.0, clusters=1.0, cluster_count=4,
                      local_crops=2, local_size=8)
  trainable = {"backbone": params, **ssl.init_heads(recipe, jax.random.PRNGKey(3), config.width,
                                                    config.patch_size)}
  teacher = ssl.teacher_part(trainable)
  images = jax.random.normal(jax.random.PRNGKey(4), (4, 16, 16, 3))
  center = ssl.centers(recipe, config.width)
  assert center["clusters"].shape == (4, config.width)
  run = lambda p, c: ssl.objective(model, recipe, p, teacher, c, images,
                                   jax.random.PRNGKey(5), 0, 10)
  (loss, aux), grads = jax.value_and_grad(run, has_aux=True)(trainable, center)
  assert float(optax.global_norm(grads["backbone"])) > 0.0
  centroid_grad = jax.grad(lambda c: run(trainable, {"clusters": c})[0])(aux["centroids"])
  np.testing.assert_array_equal(centroid_grad, 0.0)
  np.testing.assert_allclose(jnp.linalg.norm(aux["centroids"], axis=-1), 1.0, atol=1e-5)
  assert 0.0 < float(aux["clusters/share_entropy"]) <= np.log(4) + 1e-6
  # The trainer's state keeps the centroids beside the heads' centres.
  kept = ssl.updated_centers({"clusters": aux["centroids"]}, {}, 0.9)
  np.testing.assert_array_equal(kept["clusters"], aux["centroids"])
