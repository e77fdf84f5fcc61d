"""Self-supervised pretraining objectives of a ViT, as DINOv2 trains one, scaled to a tiny ViT.

A student ViT and an exponential-moving-average (EMA) teacher see different views of each image:

  views      two global crops (scale `global_scale` of the image, resized to the image size) and
             `local_crops` small ones (`local_scale`, resized to `local_size`; the position table
             is resized to their grid), each randomly flipped;
  dino       the student's CLS token of every view predicts the teacher's of the *other* global
             views: cross-entropy between the teacher's centred, sharpened softmax over the
             prototypes of a projection head and the student's (Caron et al. 2021);
  ibot       on a share of the global views (`mask_probability`), a random `mask_ratio` of the
             patches enters the student as a learned mask token; the student's token there
             predicts the teacher's (unmasked) token through a projection head of its own
             (Zhou et al. 2022; DINOv2's separate heads);
  koleo      the Kozachenko-Leonenko entropy estimator on the student's global CLS tokens
             spreads them over the sphere (Sablayrolles et al. 2019; DINOv2's weight 0.1);
  pixels     masked patches' pixels, read from the student's token by a linear decoder
             (SimMIM-style: the encoder sees the mask token). `pixel_target` "image": the
             normalised image's own values, so a part's tone is in the target; "patch": every
             target patch normalised to zero mean and unit variance, as MAE's default, which
             removes a plain patch's tone;
  dense      every patch token of every student view must pick, among all the teacher's tokens
             of the other global view of the same image, the one at its own image point
             (InfoNCE on the unit-normalised backbone tokens, or with `dense_head` on their
             images under a projection MLP, `dense_temperature`; the crops' boxes give the
             pairs). Its negatives are the same image's other tokens only, so a
             component every token of an image shares earns nothing and what tells one point of
             the image from another is what the tokens keep (a dense contrastive loss in the
             spirit of VADeR / PixPro, within the image);
  correspondence  across images: a student token of image b says which tokens of another image
             of the batch (b - 1) are like its point, as the teacher says: its softmax over that
             image's teacher tokens against the teacher's own (sharper) one from its token at the
             same point. What recurs from image to image (a part) is what two images' tokens
             share, so the term draws a part's tokens together across images as the dense term
             cannot (STEGO's correspondence distillation, Hamilton et al. 2022, as a term on the
             backbone; the within-image dense term keeps tokens that are all alike from meeting
             it); with `correspondence_block` the target's similarities are an earlier block's;
  clusters   across images, by online spherical k-means: `cluster_count` centroids follow the
             teacher's last-block patch tokens of every global view (each step a centroid becomes
             m itself + (1 - m) the mean of the tokens nearest it, m `cluster_momentum`, back on
             the sphere; a centroid no token chose is drawn again from the batch), and every
             student token predicts, as a softmax over its cosines with the centroids, the
             centroid of the other global view's teacher token at its image point: PiCIE's
             cluster targets across photometric and geometric views (Cho et al. 2021), online.
             Unlike Sinkhorn's targets no centroid is owed a share of the tokens, so the
             background (most of the patches) may keep a few; unlike the dense term, two points
             of one part may share a target, and a part's tokens in two images must;
  attributes the image-level attribute losses of the supervised recipe (training/pretraining.py's
             heads), on the whole image, for the arms that combine both.

No term sees a part mask or a keypoint. Colour jitter, part of DINO's augmentations, is left out:
the world marks a part's plain region by its tone, and a jitter that recolours the view would
teach the backbone to ignore exactly that (docs/experiments.md has the measurement).

Shapes: images [B, H, W, 3] normalised; views [V, B, h, w, 3]; tokens [B, N, D].
"""

import math
from typing import Dict, Optional, Tuple

import jax
import jax.numpy as jnp

from metonymy.models import projection_head
from metonymy.training import self_supervised_options as options

OBJECTIVES = options.OBJECTIVES
Recipe = options.Recipe


# ------------------------------------------------------------------------------------------------
# Views and masks.


def random_resized_crop(image: jnp.ndarray, rng: jax.Array, size: int,
                        scale: Tuple[float, float],
                        ratio: Tuple[float, float] = (3 / 4, 4 / 3),
                        brightness: float = 0.0) -> Tuple[jnp.ndarray, jnp.ndarray]:
  """image [H, W, 3] -> (view [size, size, 3], box [5]): a random crop of `scale` of the area and
  aspect `ratio` (log-uniform), inside the image, resized bilinearly (antialiased when
  shrinking), then flipped left-right with probability 1/2 (torchvision's RandomResizedCrop +
  RandomHorizontalFlip), its brightness moved by one offset ~ U(-brightness, brightness).
  box: (top, left, height, width, flipped) of the crop in the image's pixels."""
  height, width = image.shape[:2]
  r_area, r_ratio, r_y, r_x, r_flip, r_light = jax.random.split(rng, 6)
  area = jax.random.uniform(r_area, (), minval=scale[0], maxval=scale[1]) * height * width
  aspect = jnp.exp(jax.random.uniform(r_ratio, (), minval=math.log(ratio[0]),
                                      maxval=math.log(ratio[1])))
  crop_w = jnp.clip(jnp.sqrt(area * aspect), 1.0, width)
  crop_h = jnp.clip(jnp.sqrt(area / aspect), 1.0, height)
  top = jax.random.uniform(r_y, ()) * (height - crop_h)
  left = jax.random.uniform(r_x, ()) * (width - crop_w)
  scales = jnp.stack([size / crop_h, size / crop_w])
  view = jax.image.scale_and_translate(image, (size, size, image.shape[2]), (0, 1), scales,
                                       -jnp.stack([top, left]) * scales, method="linear",
                                       antialias=True)
  flipped = jax.random.bernoulli(r_flip)
  view = jnp.where(flipped, view[:, ::-1], view)
  box = jnp.stack([top, left, crop_h, crop_w, flipped.astype(jnp.float32)])
  return view + jax.random.uniform(r_light, (), minval=-brightness, maxval=brightness), box


def corresponding_tokens(student_boxes: jnp.ndarray, student_grid: int,
                         teacher_boxes: jnp.ndarray, teacher_grid: int
                         ) -> Tuple[jnp.ndarray, jnp.ndarray]:
  """For every token of a student view, the teacher view's token at the same image point.

  Args:
    student_boxes, teacher_boxes: [B, 5] crop boxes (`random_resized_crop`).
    student_grid, teacher_grid: the views' patch grids (square).

  Returns:
    (int32 teacher token index [B, n*n] in raster order, bool [B, n*n]: the point is inside the
    teacher's crop).
  """
  cells = jnp.arange(student_grid, dtype=jnp.float32) + 0.5

  def one(sb, tb):
    rows = sb[0] + cells * sb[2] / student_grid                       # image y of each row
    cols_in_view = jnp.where(sb[4] > 0, student_grid - cells, cells)  # undo the flip
    cols = sb[1] + cols_in_view * sb[3] / student_grid
    t_rows = (rows - tb[0]) / tb[2] * teacher_grid
    t_cols = (cols - tb[1]) / tb[3] * teacher_grid
    t_cols = jnp.where(tb[4] > 0, teacher_grid - t_cols, t_cols)
    r = jnp.floor(t_rows).astype(jnp.int32)[:, None]
    c = jnp.floor(t_cols).astype(jnp.int32)[None, :]
    inside = (r >= 0) & (r < teacher_grid) & (c >= 0) & (c < teacher_grid)
    index = jnp.clip(r, 0, teacher_grid - 1) * teacher_grid + jnp.clip(c, 0, teacher_grid - 1)
    return index.reshape(-1), inside.reshape(-1)

  return jax.vmap(one)(student_boxes, teacher_boxes)


def views(images: jnp.ndarray, rng: jax.Array, recipe: Recipe) -> Dict[str, jnp.ndarray]:
  """{"global": the student's global views [2, B, H, W, 3], "teacher": the teacher's (the
  same, or relit: `relight_teacher`), "local": [L, B, s, s, 3] (absent without local crops),
  "global_boxes" [2, B, 5], "local_boxes" [L, B, 5]: the crops (`random_resized_crop`)}."""
  size = images.shape[1]
  r_global, r_local, r_light = jax.random.split(rng, 3)

  def crops(key, count, crop_size, scale):
    keys = jax.random.split(key, count * images.shape[0]).reshape(count, images.shape[0], -1)
    crop = lambda k, im: random_resized_crop(im, k, crop_size, scale,
                                             brightness=recipe.brightness)
    return jax.vmap(lambda ks: jax.vmap(crop)(ks, images))(keys)  # ([n, B, s, s, 3], [n, B, 5])

  out = {}
  out["global"], out["global_boxes"] = crops(r_global, 2, size, recipe.global_scale)
  if recipe.local_crops:
    out["local"], out["local_boxes"] = crops(r_local, recipe.local_crops, recipe.local_size,
                                             recipe.local_scale)
  out["teacher"] = out["global"]
  if recipe.relight_teacher:  # A second offset on top of the student's: another lighting.
    offsets = jax.random.uniform(r_light, (2, images.shape[0], 1, 1, 1),
                                 minval=-recipe.brightness, maxval=recipe.brightness)
    out["teacher"] = out["global"] + offsets
  return out


def random_token_masks(rng: jax.Array, batch: int, num_patches: int, probability: float,
                       ratio: Tuple[float, float]) -> jnp.ndarray:
  """bool [batch, N]: each row, with `probability`, masks round(r N) random patches,
  r ~ U(ratio); the other rows mask none."""
  r_which, r_ratio, r_order = jax.random.split(rng, 3)
  chosen = jax.random.bernoulli(r_which, probability, (batch,))
  counts = jnp.round(jax.random.uniform(r_ratio, (batch,), minval=ratio[0], maxval=ratio[1])
                     * num_patches)
  ranks = jnp.argsort(jnp.argsort(jax.random.uniform(r_order, (batch, num_patches)), axis=1),
                      axis=1)
  return (ranks < counts[:, None]) & chosen[:, None]


def patchify(images: jnp.ndarray, patch: int) -> jnp.ndarray:
  """[B, H, W, C] -> [B, N, patch * patch * C], patches in raster order (the tokens')."""
  b, h, w, c = images.shape
  x = images.reshape(b, h // patch, patch, w // patch, patch, c)
  return x.transpose(0, 1, 3, 2, 4, 5).reshape(b, (h // patch) * (w // patch), patch * patch * c)


# ------------------------------------------------------------------------------------------------
# Losses.


def distillation_loss(student_scores: jnp.ndarray, teacher_probs: jnp.ndarray,
                      temperature: float, weights: Optional[jnp.ndarray] = None) -> jnp.ndarray:
  """Mean cross-entropy H(teacher, softmax(student / temperature)) over the leading axes, or
  weighted by `weights` (broadcast to them) and normalised by their sum."""
  log_student = jax.nn.log_softmax(student_scores / temperature, axis=-1)
  per_item = -jnp.sum(jax.lax.stop_gradient(teacher_probs) * log_student, axis=-1)
  if weights is None:
    return jnp.mean(per_item)
  weights = jnp.broadcast_to(weights, per_item.shape)
  return jnp.sum(per_item * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def teacher_distribution(teacher_scores: jnp.ndarray, center: jnp.ndarray,
                         temperature) -> jnp.ndarray:
  """softmax((scores - center) / temperature): DINO's centring (against one prototype winning
  everything) and sharpening (against the uniform distribution); no gradient."""
  return jax.nn.softmax(jax.lax.stop_gradient(teacher_scores - center) / temperature, axis=-1)


def sinkhorn_distribution(teacher_scores: jnp.ndarray, temperature,
                          iterations: int = 3) -> jnp.ndarray:
  """DINOv2's Sinkhorn-Knopp teacher targets: teacher_scores [..., P] -> distributions [..., P]
  (no gradient), each item's summing to 1 and, as the iterations converge, every prototype
  holding 1 / P of the items' mass: softmax(scores / temperature) with every item's and every
  prototype's share rescaled in turn, over all the items at once. In log space, so a sharp
  temperature cannot overflow."""
  shape = teacher_scores.shape
  log_q = jax.lax.stop_gradient(teacher_scores).reshape(-1, shape[-1]) / temperature
  items, prototypes = log_q.shape
  for _ in range(iterations):
    log_q = log_q - jax.nn.logsumexp(log_q, axis=0, keepdims=True) - jnp.log(prototypes)
    log_q = log_q - jax.nn.logsumexp(log_q, axis=1, keepdims=True) - jnp.log(items)
  return jnp.exp(log_q + jnp.log(items)).reshape(shape)


def _teacher_targets(recipe: Recipe, teacher_scores: jnp.ndarray, center: jnp.ndarray,
                     temperature) -> jnp.ndarray:
  """The teacher's distributions by the recipe's centring (`teacher_centering`)."""
  if recipe.teacher_centering == "sinkhorn":
    return sinkhorn_distribution(teacher_scores, temperature)
  return teacher_distribution(teacher_scores, center, temperature)


def dino_loss(student_scores: jnp.ndarray, teacher_probs: jnp.ndarray,
              temperature: float) -> jnp.ndarray:
  """student_scores [Vs, B, P] (the two global views first), teacher_probs [2, B, P]: every
  student view against every teacher view but its own, averaged over the pairs."""
  total, pairs = 0.0, 0
  for t in range(teacher_probs.shape[0]):
    for s in range(student_scores.shape[0]):
      if s != t:
        total += distillation_loss(student_scores[s], teacher_probs[t], temperature)
        pairs += 1
  return total / pairs


def _unit(x: jnp.ndarray) -> jnp.ndarray:
  """x [..., D] scaled to unit length along its last axis."""
  return x * jax.lax.rsqrt(jnp.sum(jnp.square(x), -1, keepdims=True) + 1e-12)


def koleo_loss(features: jnp.ndarray, eps: float = 1e-8) -> jnp.ndarray:
  """features [B, D]: -mean log(distance to the nearest other feature), on unit vectors."""
  unit = _unit(features)
  similarity = unit @ unit.T - 2.0 * jnp.eye(unit.shape[0])  # itself never the nearest
  nearest = jnp.argmax(similarity, axis=1)
  distance = jnp.sqrt(jnp.sum(jnp.square(unit - unit[nearest]), -1) + eps)
  return -jnp.mean(jnp.log(distance + eps))


def pixel_loss(predicted: jnp.ndarray, images: jnp.ndarray, token_mask: jnp.ndarray,
               patch: int, target: str) -> jnp.ndarray:
  """Mean squared error on the masked patches. predicted [B, N, p*p*3], images [B, H, W, 3],
  token_mask bool [B, N]; target "image" (the values) or "patch" (each patch standardised)."""
  goal = patchify(images, patch)
  if target == "patch":
    mean = jnp.mean(goal, -1, keepdims=True)
    goal = (goal - mean) * jax.lax.rsqrt(jnp.var(goal, -1, keepdims=True) + 1e-6)
  per_patch = jnp.mean(jnp.square(predicted - goal), -1)
  weights = token_mask.astype(per_patch.dtype)
  return jnp.sum(per_patch * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def dense_loss(student_tokens: jnp.ndarray, teacher_tokens: jnp.ndarray, index: jnp.ndarray,
               inside: jnp.ndarray, temperature: float,
               target_temperature: float = 0.0, target_radius: float = 0.0) -> jnp.ndarray:
  """Within-image InfoNCE. student_tokens [B, n, D], teacher_tokens [B, N, D] (no gradient),
  index int [B, n]: the teacher token at each student token's image point, inside bool [B, n]:
  that point is in the teacher's view. Mean cross-entropy over the inside tokens of
  softmax_j(cos(student_i, teacher_j) / temperature) against a target over j, each image
  weighted equally. The target: j = index_i (`target_temperature` 0), or the teacher's own
  view of its token there, softmax_j(cos(teacher_index_i, teacher_j) / target_temperature),
  which spreads the target over the tokens the teacher finds alike (a plain region's tokens
  need not then be told apart); or, with `target_radius` > 0, the teacher's tokens weighted by
  exp(-d^2 / 2 r^2), d their distance from token index_i on the teacher's (square) grid in
  patches: a fixed target, so it cannot be met by tokens that are all alike."""
  keys = _unit(jax.lax.stop_gradient(teacher_tokens))
  logits = jnp.einsum("bnd,bmd->bnm", _unit(student_tokens), keys) / temperature
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  if target_radius > 0:
    grid = math.isqrt(keys.shape[1])
    cell = jnp.stack(jnp.divmod(jnp.arange(keys.shape[1]), grid), -1).astype(keys.dtype)
    offsets = cell[index][..., None, :] - cell                           # [B, n, N, 2]
    target = jax.nn.softmax(-jnp.sum(offsets ** 2, -1) / (2 * target_radius ** 2), -1)
    picked = jnp.sum(target * log_probs, -1)
  elif target_temperature > 0:
    anchors = jnp.take_along_axis(keys, index[..., None], axis=1)
    target = jax.nn.softmax(jnp.einsum("bnd,bmd->bnm", anchors, keys) / target_temperature, -1)
    picked = jnp.sum(target * log_probs, -1)
  else:
    picked = jnp.take_along_axis(log_probs, index[..., None], axis=-1)[..., 0]
  return _mean_inside(-picked, inside)


def correspondence_loss(student_tokens: jnp.ndarray, teacher_tokens: jnp.ndarray,
                        other_tokens: jnp.ndarray, index: jnp.ndarray, inside: jnp.ndarray,
                        temperature: float, target_temperature: float,
                        target_tokens: Optional[jnp.ndarray] = None,
                        target_other_tokens: Optional[jnp.ndarray] = None) -> jnp.ndarray:
  """Cross-image relational distillation. student_tokens [B, n, D] (a view of image b),
  teacher_tokens [B, N, D] (the teacher's view of the same image b), other_tokens [B, N, D] (the
  teacher's tokens of another image for each b), no gradient through either; index, inside as in
  `dense_loss`. Mean cross-entropy over the inside tokens of
  softmax_j(cos(student_i, other_j) / temperature) against the teacher's
  softmax_j(cos(teacher_index_i, other_j) / target_temperature), each image weighted equally.
  With target_tokens / target_other_tokens [B, N, E] (the same two views' tokens in another
  feature space, e.g. an earlier block's), the target's similarities are theirs."""
  if target_tokens is None:
    target_tokens, target_other_tokens = teacher_tokens, other_tokens
  others = _unit(jax.lax.stop_gradient(other_tokens))
  anchors = jnp.take_along_axis(_unit(jax.lax.stop_gradient(target_tokens)), index[..., None],
                                axis=1)
  target = jax.nn.softmax(jnp.einsum("bnd,bmd->bnm", anchors,
                                     _unit(jax.lax.stop_gradient(target_other_tokens)))
                          / target_temperature, -1)
  log_probs = jax.nn.log_softmax(
      jnp.einsum("bnd,bmd->bnm", _unit(student_tokens), others) / temperature, -1)
  return _mean_inside(-jnp.sum(target * log_probs, -1), inside)


def _mean_inside(per_token: jnp.ndarray, inside: jnp.ndarray) -> jnp.ndarray:
  """per_token [B, n] averaged over each image's inside tokens, then over the images with any."""
  weights = inside / jnp.maximum(jnp.sum(inside, 1, keepdims=True), 1)
  return jnp.sum(per_token * weights) / jnp.maximum(jnp.sum(jnp.any(inside, 1)), 1)


# ------------------------------------------------------------------------------------------------
# Schedules and the teacher.


def teacher_temperature(recipe: Recipe, step, total_steps: int):
  """Linear from the first to the second over `teacher_temperature_warmup` of the steps."""
  low, high = recipe.teacher_temperature
  warm = max(1.0, recipe.teacher_temperature_warmup * total_steps)
  return low + (high - low) * jnp.clip(step / warm, 0.0, 1.0)


def teacher_momentum(recipe: Recipe, step, total_steps: int):
  """Cosine from the first momentum at step 0 to the second at the last step."""
  low, high = recipe.teacher_momentum
  progress = jnp.clip(step / max(1, total_steps - 1), 0.0, 1.0)
  return high - (high - low) * (jnp.cos(jnp.pi * progress) + 1.0) / 2.0


def ema(teacher, student, momentum):
  """teacher <- momentum teacher + (1 - momentum) student, leaf by leaf."""
  return jax.tree.map(lambda t, s: momentum * t + (1.0 - momentum) * s, teacher, student)


def teacher_part(params: Dict) -> Dict:
  """The student parameters that the teacher follows: the backbone and the projection heads."""
  return {k: params[k] for k in ("backbone", "dino_head", "ibot_head", "dense_head")
          if k in params}


def heads(recipe: Recipe) -> Dict[str, projection_head.ProjectionHead]:
  """The projection heads this recipe trains."""
  make = lambda: projection_head.ProjectionHead(recipe.head_hidden, recipe.head_bottleneck,
                                                recipe.prototypes)
  out = {}
  if recipe.dino > 0:
    out["dino_head"] = make()
  if recipe.ibot > 0:
    out["ibot_head"] = make()
  if recipe.dense > 0 and recipe.dense_head:
    # One hidden layer, as PixPro's and VADeR's projectors; no prototypes: tokens meet tokens.
    out["dense_head"] = projection_head.ProjectionHead(recipe.head_hidden, recipe.dense_head,
                                                      prototypes=0, layers=2)
  return out


def init_heads(recipe: Recipe, rng: jax.Array, width: int, patch: int) -> Dict:
  """Parameters beside the backbone: the projection heads, the mask token and the pixel decoder."""
  keys = jax.random.split(rng, 4)
  made = heads(recipe)
  params = {name: made[name].init(key, jnp.zeros((1, width)))["params"]
            for name, key in zip([n for n in made if n != "dense_head"], keys[:2])}
  if "dense_head" in made:  # Its own key: the other parameters' draws stay as they were.
    params["dense_head"] = made["dense_head"].init(jax.random.fold_in(rng, 4),
                                                   jnp.zeros((1, width)))["params"]
  if recipe.masks:
    params["mask_token"] = 0.02 * jax.random.normal(keys[2], (width,))
  if recipe.pixels > 0:
    params["pixel_decoder"] = {
        "w": 0.02 * jax.random.normal(keys[3], (width, patch * patch * 3)),
        "b": jnp.zeros((patch * patch * 3,))}
  return params


def centers(recipe: Recipe, width: int = 0) -> Dict[str, jnp.ndarray]:
  """The running state beside the teacher: its score means (DINO's centre), one per
  distillation head, and with the cluster term its centroids ("clusters" [cluster_count, width],
  zeros until the first batch places them: `cluster_centroids`)."""
  out = {name: jnp.zeros((recipe.prototypes,)) for name in heads(recipe)
         if name != "dense_head"}
  if recipe.clusters > 0:
    if width <= 0:
      raise ValueError("the cluster term's centroids need the backbone's width")
    out["clusters"] = jnp.zeros((recipe.cluster_count, width))
  return out


def _assigned(tokens: jnp.ndarray, centroids: jnp.ndarray
              ) -> Tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
  """tokens [M, D], centroids [C, D], both unit -> (nearest centroid int [M], the sum of each
  centroid's tokens [C, D], their count [C])."""
  nearest = jnp.argmax(tokens @ centroids.T, -1)
  members = jax.nn.one_hot(nearest, centroids.shape[0], dtype=tokens.dtype)
  return nearest, members.T @ tokens, jnp.sum(members, 0)


def cluster_centroids(tokens: jnp.ndarray, centroids: jnp.ndarray, rng: jax.Array,
                      momentum: float, iterations: int = 10
                      ) -> Tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
  """One step of online spherical k-means. tokens [M, D] (the teacher's, no gradient),
  centroids [C, D] (all zeros before the first step) -> (the centroids the batch's targets use
  [C, D]: the given ones, or on the first step `iterations` of Lloyd's on the batch from C of
  its tokens drawn at random; the centroids for the next step [C, D]: each moved towards the
  mean of its tokens, momentum m ... + (1 - m) ..., back on the sphere, and one that no token
  chose drawn again from the batch's tokens; each token's nearest of the used centroids, int
  [M])."""
  tokens = _unit(jax.lax.stop_gradient(tokens))
  r_start, r_dead = jax.random.split(rng)
  count = centroids.shape[0]

  def lloyd(centroids):
    def one(_, c):
      _, sums, counts = _assigned(tokens, c)
      return jnp.where(counts[:, None] > 0, _unit(sums), c)
    start = tokens[jax.random.choice(r_start, tokens.shape[0], (count,), replace=False)]
    return jax.lax.fori_loop(0, iterations, one, start)

  used = jax.lax.cond(jnp.all(centroids == 0), lloyd, lambda c: c, centroids)
  nearest, sums, counts = _assigned(tokens, used)
  moved = _unit(momentum * used + (1.0 - momentum) * _unit(sums))
  redrawn = tokens[jax.random.randint(r_dead, (count,), 0, tokens.shape[0])]
  return used, jnp.where(counts[:, None] > 0, moved, redrawn), nearest


def statistics_of(probs: jnp.ndarray) -> Dict[str, jnp.ndarray]:
  """Collapse watch of a teacher distribution [..., P]: the entropy of one item's distribution
  (0: one-hot; log P: uniform) and of the batch mean (low: every item picks the same
  prototype), in nats."""
  flat = probs.reshape(-1, probs.shape[-1])
  entropy = lambda p: -jnp.sum(p * jnp.log(p + 1e-12), -1)
  return {"entropy": jnp.mean(entropy(flat)), "mean_entropy": entropy(jnp.mean(flat, 0))}


def objective(model, recipe: Recipe, params: Dict, teacher: Optional[Dict],
              center: Dict[str, jnp.ndarray], images: jnp.ndarray, rng: jax.Array, step,
              total_steps: int, attribute_loss_fn=None
              ) -> Tuple[jnp.ndarray, Dict[str, jnp.ndarray]]:
  """(the weighted loss, aux) for one batch of images [B, H, W, 3]. aux: every term's value,
  the teacher's statistics and `teacher_scores` {head: [..., P]} for the centre update.

  `attribute_loss_fn(student_output)` gives the attribute loss on the whole image (a backbone
  output dict), needed when recipe.attributes > 0."""
  r_views, r_mask = jax.random.split(rng)
  seen = views(images, r_views, recipe)
  global_views, teacher_views = seen["global"], seen["teacher"]
  batch = images.shape[0]
  global_flat = global_views.reshape((-1,) + global_views.shape[2:])
  num_patches = (images.shape[1] // model.config.patch_size) ** 2
  token_mask = None
  if recipe.masks:
    token_mask = random_token_masks(r_mask, global_flat.shape[0], num_patches,
                                    recipe.mask_probability, recipe.mask_ratio)
  backbone = lambda p, x, **kw: model.apply({"params": p}, x, **kw)
  student = backbone(params["backbone"], global_flat, token_mask=token_mask,
                     mask_token=params.get("mask_token"))
  terms, aux = {}, {"teacher_scores": {}}
  projection = heads(recipe)
  if recipe.distills:
    teacher_out = backbone(teacher["backbone"],
                           teacher_views.reshape((-1,) + teacher_views.shape[2:]),
                           return_intermediates=recipe.correspondence_block > 0)
  local_out = None
  if "local" in seen and (recipe.dino > 0 or recipe.dense > 0 or recipe.correspondence > 0
                          or recipe.clusters > 0 or recipe.patch_views == "cross"):
    local_out = backbone(params["backbone"],
                         seen["local"].reshape((-1,) + seen["local"].shape[2:]))
  if recipe.dino > 0:
    cls = [student["prefix_tokens"][:, 0].reshape(2, batch, -1)]
    if local_out is not None:
      cls.append(local_out["prefix_tokens"][:, 0].reshape(recipe.local_crops, batch, -1))
    head = projection["dino_head"]
    student_scores = head.apply({"params": params["dino_head"]}, jnp.concatenate(cls, 0))
    teacher_scores = head.apply({"params": teacher["dino_head"]},
                                teacher_out["prefix_tokens"][:, 0]).reshape(2, batch, -1)
    temperature = teacher_temperature(recipe, step, total_steps)
    probs = _teacher_targets(recipe, teacher_scores, center["dino_head"], temperature)
    terms["dino"] = dino_loss(student_scores, probs, recipe.student_temperature)
    aux["teacher_scores"]["dino_head"] = teacher_scores
    aux.update({f"dino/teacher_{k}": v for k, v in statistics_of(probs).items()})
  if recipe.ibot > 0:
    head = projection["ibot_head"]
    student_scores = head.apply({"params": params["ibot_head"]}, student["patch_tokens"])
    teacher_scores = head.apply({"params": teacher["ibot_head"]}, teacher_out["patch_tokens"])
    temperature = teacher_temperature(recipe, step, total_steps)
    probs = _teacher_targets(recipe, teacher_scores, center["ibot_head"], temperature)
    if recipe.patch_views == "same":
      # Each masked view counts once whatever its number of masked patches (DINOv2's
      # weighting): a view's weights sum to 1, so the normalisation is by the views that count.
      counted = token_mask if recipe.patch_loss == "masked" else jnp.ones_like(token_mask)
      weights = counted / jnp.maximum(jnp.sum(counted, 1, keepdims=True), 1)
      terms["ibot"] = distillation_loss(student_scores, probs, recipe.student_temperature,
                                        weights)
    else:
      terms["ibot"] = _cross_view_patch_loss(
          recipe, student_scores, probs, seen, batch, model.config.patch_size,
          None if local_out is None else head.apply({"params": params["ibot_head"]},
                                                    local_out["patch_tokens"]))
    aux["teacher_scores"]["ibot_head"] = teacher_scores
    aux.update({f"ibot/teacher_{k}": v for k, v in statistics_of(probs).items()})
  if recipe.dense > 0 or recipe.correspondence > 0:
    student_tokens, teacher_tokens = student["patch_tokens"], teacher_out["patch_tokens"]
    local_tokens = None if local_out is None else local_out["patch_tokens"]
    if recipe.dense > 0 and recipe.dense_head:  # The head is the dense term's (`heads`).
      head = projection["dense_head"]
      project = lambda tokens: head.apply({"params": params["dense_head"]}, tokens)
      student_tokens = project(student_tokens)
      teacher_tokens = head.apply({"params": teacher["dense_head"]}, teacher_tokens)
      local_tokens = None if local_tokens is None else project(local_tokens)
    if recipe.dense > 0:
      terms["dense"] = _dense_term(recipe, student_tokens, teacher_tokens, seen, batch,
                                   model.config.patch_size, local_tokens)
    if recipe.correspondence > 0:
      target_tokens = None
      if recipe.correspondence_block:
        if recipe.correspondence_block > model.config.depth:
          raise ValueError(f"correspondence_block={recipe.correspondence_block} is beyond the "
                           f"backbone's depth {model.config.depth}")
        target_tokens = teacher_out["intermediates"][recipe.correspondence_block - 1][
            :, model.config.num_prefix:]
      terms["correspondence"] = _correspondence_term(recipe, student_tokens, teacher_tokens,
                                                     seen, batch, model.config.patch_size,
                                                     local_tokens, target_tokens)
  if recipe.clusters > 0:
    terms["clusters"], aux["centroids"], watch = _cluster_term(
        recipe, student["patch_tokens"], teacher_out["patch_tokens"], center["clusters"], seen,
        batch, model.config.patch_size,
        None if local_out is None else local_out["patch_tokens"], jax.random.fold_in(rng, 7))
    aux.update({f"clusters/{k}": v for k, v in watch.items()})
  if recipe.koleo > 0:
    cls = student["prefix_tokens"][:, 0].reshape(2, batch, -1)
    terms["koleo"] = (koleo_loss(cls[0]) + koleo_loss(cls[1])) / 2.0
  if recipe.pixels > 0:
    decoder = params["pixel_decoder"]
    predicted = student["patch_tokens"] @ decoder["w"] + decoder["b"]
    terms["pixels"] = pixel_loss(predicted, global_flat, token_mask, model.config.patch_size,
                                 recipe.pixel_target)
  if recipe.attributes > 0:
    terms["attributes"] = attribute_loss_fn(_attribute_output(model, recipe, params["backbone"],
                                                              images))
  loss = sum(getattr(recipe, name) * value for name, value in terms.items())
  aux.update({f"loss/{name}": value for name, value in terms.items()})
  return loss, aux


def _attribute_output(model, recipe: Recipe, backbone_params: Dict,
                      images: jnp.ndarray) -> Dict[str, jnp.ndarray]:
  """What the attribute read-outs see of the whole image: the backbone's output, or with
  `attribute_block` k > 0 block k's tokens through the final norm (`prefix_tokens` [B, P, D],
  `patch_tokens` [B, N, D])."""
  if not recipe.attribute_block:
    return model.apply({"params": backbone_params}, images)
  depth = model.config.depth
  if recipe.attribute_block >= depth:
    raise ValueError(f"attribute_block={recipe.attribute_block} must be below the backbone's "
                     f"depth {depth} (0 is the last block)")
  out = model.apply({"params": backbone_params}, images, return_intermediates=True)
  block_tokens = out["intermediates"][recipe.attribute_block - 1]
  tokens = model.apply({"params": backbone_params}, block_tokens,
                       method=lambda module, x: module.norm(x))
  prefix = model.config.num_prefix
  return {"prefix_tokens": tokens[:, :prefix], "patch_tokens": tokens[:, prefix:]}


def _cross_view_pairs(recipe: Recipe, global_student: jnp.ndarray, teacher: jnp.ndarray,
                      seen: Dict[str, jnp.ndarray], batch: int, patch: int,
                      local_student: Optional[jnp.ndarray], term) -> jnp.ndarray:
  """term(student [B, n, X], teacher [B, N, Y], index [B, n], inside [B, n] float) averaged over
  every pair of a student view (global [2B, N, X], local [L B, n, X] or None) and a teacher
  global view [2B, N, Y] other than itself; index / inside: `corresponding_tokens`."""
  grid = seen["global"].shape[2] // patch
  teacher = teacher.reshape((2, batch) + teacher.shape[1:])
  students = [(global_student.reshape((2, batch) + global_student.shape[1:]),
               seen["global_boxes"], grid, True)]
  if local_student is not None:
    students.append((local_student.reshape((recipe.local_crops, batch)
                                           + local_student.shape[1:]),
                     seen["local_boxes"], seen["local"].shape[2] // patch, False))
  total, pairs = 0.0, 0
  for views_of, boxes, student_grid, is_global in students:
    for v in range(views_of.shape[0]):
      for t in range(2):
        if is_global and v == t:
          continue
        index, inside = corresponding_tokens(boxes[v], student_grid, seen["global_boxes"][t],
                                             grid)
        total += term(views_of[v], teacher[t], index, inside.astype(views_of.dtype))
        pairs += 1
  return total / pairs


def _cross_view_patch_loss(recipe: Recipe, global_scores: jnp.ndarray,
                           teacher_probs: jnp.ndarray, seen: Dict[str, jnp.ndarray], batch: int,
                           patch: int, local_scores: Optional[jnp.ndarray]) -> jnp.ndarray:
  """Every student view's patch scores against the other global view's teacher distribution at
  the same image point, over the points both views see; averaged over the view pairs.
  global_scores [2B, N, P], teacher_probs [2B, N, P], local_scores [L B, n, P] or None."""
  def term(scores, probs, index, inside):
    target = jnp.take_along_axis(probs, index[..., None], axis=1)
    weights = inside / jnp.maximum(jnp.sum(inside, 1, keepdims=True), 1)
    return distillation_loss(scores, target, recipe.student_temperature, weights)
  return _cross_view_pairs(recipe, global_scores, teacher_probs, seen, batch, patch,
                           local_scores, term)


def _dense_term(recipe: Recipe, global_tokens: jnp.ndarray, teacher_tokens: jnp.ndarray,
                seen: Dict[str, jnp.ndarray], batch: int, patch: int,
                local_tokens: Optional[jnp.ndarray]) -> jnp.ndarray:
  """`dense_loss` of every student view (global [2B, N, D], local [L B, n, D] or None) against
  the teacher's tokens [2B, N, D] of each other global view, averaged over the view pairs."""
  term = lambda tokens, teacher, index, inside: dense_loss(
      tokens, teacher, index, inside, recipe.dense_temperature, recipe.dense_target_temperature,
      recipe.dense_target_radius)
  return _cross_view_pairs(recipe, global_tokens, teacher_tokens, seen, batch, patch,
                           local_tokens, term)


def _correspondence_term(recipe: Recipe, global_tokens: jnp.ndarray,
                         teacher_tokens: jnp.ndarray, seen: Dict[str, jnp.ndarray], batch: int,
                         patch: int, local_tokens: Optional[jnp.ndarray],
                         target_tokens: Optional[jnp.ndarray] = None) -> jnp.ndarray:
  """`correspondence_loss` of every student view of image b against the teacher's tokens of each
  other global view of image b - 1 (the batch rolled by one: another image for every b when
  B > 1), the target anchored in that view of image b; averaged over the view pairs.
  target_tokens [2B, N, E]: the teacher views' tokens the target's similarities come from (an
  earlier block's), or None for teacher_tokens themselves."""
  if batch < 2:
    raise ValueError(f"the correspondence term needs 2 or more images per batch, got {batch}")
  # `_cross_view_pairs` hands each view pair one teacher array: the target's tokens ride along in
  # it, on extra channels split off again below.
  paired = teacher_tokens if target_tokens is None else jnp.concatenate(
      [teacher_tokens, target_tokens], -1)
  width = teacher_tokens.shape[-1]

  def term(tokens, teacher, index, inside):
    teacher, target = teacher[..., :width], teacher[..., width:]
    if target_tokens is None:
      target = teacher
    return correspondence_loss(tokens, teacher, jnp.roll(teacher, 1, axis=0), index, inside,
                               recipe.dense_temperature, recipe.correspondence_temperature,
                               target, jnp.roll(target, 1, axis=0))
  return _cross_view_pairs(recipe, global_tokens, paired, seen, batch, patch, local_tokens, term)


def _cluster_term(recipe: Recipe, global_tokens: jnp.ndarray, teacher_tokens: jnp.ndarray,
                  centroids: jnp.ndarray, seen: Dict[str, jnp.ndarray], batch: int, patch: int,
                  local_tokens: Optional[jnp.ndarray], rng: jax.Array
                  ) -> Tuple[jnp.ndarray, jnp.ndarray, Dict[str, jnp.ndarray]]:
  """(the cluster term, the next step's centroids [C, D], its collapse watch). Student tokens
  (global [2B, N, D], local [L B, n, D] or None) score their cosines with the centroids; the
  target is the centroid nearest the other global view's teacher token [2B, N, D] at the same
  image point, one-hot. Watch: the entropy of the batch's centroid shares (log C: all used
  alike; 0: one centroid holds every token) and the largest share."""
  width = teacher_tokens.shape[-1]
  flat = teacher_tokens.reshape(-1, width)
  used, following, nearest = cluster_centroids(flat, centroids, rng, recipe.cluster_momentum)
  counts = jnp.bincount(nearest, length=used.shape[0])
  targets = jax.nn.one_hot(nearest, used.shape[0]).reshape(teacher_tokens.shape[:-1] + (-1,))
  score = lambda tokens: _unit(tokens) @ jax.lax.stop_gradient(used).T
  term = _cross_view_patch_loss(recipe, score(global_tokens), targets, seen, batch, patch,
                                None if local_tokens is None else score(local_tokens))
  shares = counts / jnp.sum(counts)
  watch = {"share_entropy": -jnp.sum(shares * jnp.log(shares + 1e-12)),
           "largest_share": jnp.max(shares)}
  return term, following, watch


def updated_centers(center: Dict[str, jnp.ndarray], teacher_scores: Dict[str, jnp.ndarray],
                    momentum: float) -> Dict[str, jnp.ndarray]:
  """center <- momentum center + (1 - momentum) mean(teacher scores over every item), for each
  head in teacher_scores; the other entries (the cluster term's centroids) as they were."""
  return {**center, **{name: momentum * center[name] + (1.0 - momentum)
                       * jnp.mean(scores.reshape(-1, scores.shape[-1]), 0)
                       for name, scores in teacher_scores.items()}}
