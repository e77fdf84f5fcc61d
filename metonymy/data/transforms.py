"""Augmentations that move an example's image, keypoints, part segmentation and masks together.

Every transform is a picklable callable `t(example, rng) -> example` (Grain's random_map calling
convention; deterministic transforms ignore `rng`) over the dicts of base.py:

  image              uint8 [H, W, C] (or float32, e.g. after Normalize; geometry wants uint8 first)
  keypoints          float32 [M, 2] (x, y) pixels, keypoint_visible bool [M] (any number of
                     keypoints: each moves on its own; their group labels live in DatasetInfo)
  part_segmentation  uint8 [H, W], 0 = background
  masks              bool [T, H, W]

Coordinates are continuous: pixel (row i, column j) covers [j, j+1) x [i, i+1), the convention of
PIL's resize/transform, so a keypoint and the pixel under it move together exactly. Images are
resampled bilinearly (resizes antialiased), label maps and masks by nearest neighbour; a visible
keypoint that lands outside the output becomes invisible. Keys the geometry does not know
(attributes, label, index, ...) pass through untouched.
"""

import math
from typing import Dict, Optional, Sequence, Tuple, Union

import numpy as np
from PIL import Image

Example = Dict[str, np.ndarray]
Size = Union[int, Tuple[int, int]]


def _hw(size: Size) -> Tuple[int, int]:
  if isinstance(size, (int, np.integer)):
    return int(size), int(size)
  h, w = size
  return int(h), int(w)


def _image_hw(example: Example) -> Tuple[int, int]:
  for key in ("image", "part_segmentation"):
    if key in example:
      return tuple(np.shape(example[key])[:2])
  if "masks" in example:
    return tuple(np.shape(example["masks"])[1:3])
  raise KeyError("example has no image, part_segmentation or masks to take a size from")


# ------------------------------------------------------------------------------------------------
# Geometry core. `forward` is a 3x3 matrix mapping input pixel coordinates (x, y, 1) to output ones.


def _map_image(image: np.ndarray, pil_op) -> np.ndarray:
  """Apply `pil_op(PIL.Image) -> PIL.Image` to a uint8 [H, W(, C)] or float [H, W(, C)] image."""
  image = np.asarray(image)
  if image.dtype == np.uint8 and (image.ndim == 2 or image.shape[-1] in (1, 3, 4)):
    squeeze = image.ndim == 3 and image.shape[-1] == 1
    out = np.asarray(pil_op(Image.fromarray(image[..., 0] if squeeze else image)))
    return out[..., None] if squeeze else out
  # Float (or odd channel counts): one 32-bit float PIL image per channel.
  planes = image[..., None] if image.ndim == 2 else image
  out = np.stack([np.asarray(pil_op(Image.fromarray(planes[..., c].astype(np.float32), "F")))
                  for c in range(planes.shape[-1])], -1)
  return (out[..., 0] if image.ndim == 2 else out).astype(image.dtype, copy=False)


def _sample_nearest(maps: np.ndarray, inverse: np.ndarray, out_hw: Tuple[int, int]) -> np.ndarray:
  """Nearest-neighbour resample of label maps [..., H, W] through an output->input affine; pixels
  from outside the input read 0."""
  h, w = maps.shape[-2:]
  oh, ow = out_hw
  xs = np.arange(ow, dtype=np.float64) + 0.5
  ys = np.arange(oh, dtype=np.float64) + 0.5
  if inverse[0, 1] == 0 and inverse[1, 0] == 0:
    # Axis-aligned (resize, crop, flip): separable row/column lookups.
    cols = np.floor(inverse[0, 0] * xs + inverse[0, 2]).astype(np.int64)
    rows = np.floor(inverse[1, 1] * ys + inverse[1, 2]).astype(np.int64)
    valid = ((rows >= 0) & (rows < h))[:, None] & ((cols >= 0) & (cols < w))[None, :]
    out = maps[..., np.clip(rows, 0, h - 1)[:, None], np.clip(cols, 0, w - 1)[None, :]]
  else:
    sx = inverse[0, 0] * xs[None, :] + inverse[0, 1] * ys[:, None] + inverse[0, 2]
    sy = inverse[1, 0] * xs[None, :] + inverse[1, 1] * ys[:, None] + inverse[1, 2]
    cols, rows = np.floor(sx).astype(np.int64), np.floor(sy).astype(np.int64)
    valid = (rows >= 0) & (rows < h) & (cols >= 0) & (cols < w)
    out = maps[..., np.clip(rows, 0, h - 1), np.clip(cols, 0, w - 1)]
  return np.where(valid, out, np.zeros((), maps.dtype))


def _move_keypoints(example: Example, out: Example, forward: np.ndarray,
                    out_hw: Tuple[int, int]):
  if "keypoints" not in example:
    return
  points = np.asarray(example["keypoints"], np.float64)
  moved = points @ forward[:2, :2].T + forward[:2, 2]
  out["keypoints"] = moved.astype(np.float32)
  if "keypoint_visible" in example:
    oh, ow = out_hw
    inside = ((moved[:, 0] >= 0) & (moved[:, 0] < ow) & (moved[:, 1] >= 0) & (moved[:, 1] < oh))
    out["keypoint_visible"] = np.asarray(example["keypoint_visible"], bool) & inside


def _apply(example: Example, forward: np.ndarray, out_hw: Tuple[int, int], pil_op) -> Example:
  """Warp every spatial key of `example`; `pil_op` resamples the image consistently with
  `forward` (PIL resize for antialiased scaling, PIL transform for general affines)."""
  inverse = np.linalg.inv(forward)
  out = dict(example)
  if "image" in example:
    out["image"] = _map_image(example["image"], pil_op)
  for key in ("part_segmentation", "masks"):
    if key in example:
      out[key] = _sample_nearest(np.asarray(example[key]), inverse, out_hw)
  _move_keypoints(example, out, forward, out_hw)
  return out


def crop_resize(example: Example, box: Tuple[float, float, float, float],
                out_hw: Tuple[int, int]) -> Example:
  """Crop `box` = (x0, y0, x1, y1) (pixels, inside the image), resize to out_hw (antialiased)."""
  x0, y0, x1, y1 = (float(v) for v in box)
  oh, ow = out_hw
  sx, sy = ow / (x1 - x0), oh / (y1 - y0)
  forward = np.array([[sx, 0, -x0 * sx], [0, sy, -y0 * sy], [0, 0, 1]], np.float64)
  if sx == 1 and sy == 1 and x0.is_integer() and y0.is_integer():
    return crop(example, int(y0), int(x0), oh, ow)
  op = lambda im: im.resize((ow, oh), Image.Resampling.BILINEAR, box=(x0, y0, x1, y1))
  return _apply(example, forward, out_hw, op)


def crop(example: Example, top: int, left: int, height: int, width: int, fill: int = 0) -> Example:
  """Integer crop; parts of the window outside the image are padded (image `fill`, labels 0)."""
  h, w = _image_hw(example)
  forward = np.array([[1, 0, -left], [0, 1, -top], [0, 0, 1]], np.float64)
  r0, r1 = max(top, 0), min(top + height, h)
  c0, c1 = max(left, 0), min(left + width, w)
  out = dict(example)

  def window(array, fill_value, lead=0):
    array = np.asarray(array)
    shape = array.shape[:lead] + (height, width) + array.shape[lead + 2:]
    result = np.full(shape, fill_value, array.dtype)
    if r1 > r0 and c1 > c0:
      index = (slice(None),) * lead
      result[index + (slice(r0 - top, r1 - top), slice(c0 - left, c1 - left))] = (
          array[index + (slice(r0, r1), slice(c0, c1))])
    return result

  if "image" in example:
    out["image"] = window(example["image"], fill)
  if "part_segmentation" in example:
    out["part_segmentation"] = window(example["part_segmentation"], 0)
  if "masks" in example:
    out["masks"] = window(example["masks"], 0, lead=1)
  _move_keypoints(example, out, forward, (height, width))
  return out


def affine(example: Example, forward: np.ndarray, out_hw: Optional[Tuple[int, int]] = None,
           fill: int = 0) -> Example:
  """General affine warp (forward = input->output pixel coordinates, 2x3 or 3x3), bilinear."""
  forward = np.asarray(forward, np.float64)
  if forward.shape == (2, 3):
    forward = np.vstack([forward, [0, 0, 1]])
  out_hw = out_hw or _image_hw(example)
  inverse = np.linalg.inv(forward)
  coeffs = tuple(inverse[:2].ravel())
  image = example.get("image")
  channels = 1 if image is None or np.ndim(image) == 2 else np.shape(image)[-1]
  fillcolor = fill if channels == 1 or np.asarray(image).dtype != np.uint8 else (fill,) * channels
  op = lambda im: im.transform((out_hw[1], out_hw[0]), Image.Transform.AFFINE, coeffs,
                               resample=Image.Resampling.BILINEAR,
                               fillcolor=fillcolor if im.mode != "F" else float(fill))
  return _apply(example, forward, out_hw, op)


def hflip(example: Example, flip_pairs: Sequence[Tuple[int, int]] = ()) -> Example:
  """Mirror left-right; keypoints (a, b) of `flip_pairs` swap (e.g. CUB's left and right wing,
  `groupings.CUB_KEYPOINT_FLIP_PAIRS`), and so do the segmentation labels (a + 1, b + 1), which
  assumes keypoint g is part g (the synthetic world's one keypoint per part)."""
  h, w = _image_hw(example)
  out = dict(example)
  if "image" in example:
    out["image"] = np.ascontiguousarray(np.asarray(example["image"])[:, ::-1])
  if "masks" in example:
    out["masks"] = np.ascontiguousarray(np.asarray(example["masks"])[..., ::-1])
  if "part_segmentation" in example:
    seg = np.asarray(example["part_segmentation"])[:, ::-1]
    if flip_pairs:
      lut = np.arange(max(256, int(seg.max()) + 1), dtype=seg.dtype)
      for a, b in flip_pairs:
        lut[a + 1], lut[b + 1] = b + 1, a + 1
      seg = lut[seg]
    out["part_segmentation"] = np.ascontiguousarray(seg)
  if "keypoints" in example:
    points = np.array(example["keypoints"], np.float32)
    points[:, 0] = w - points[:, 0]
    order = np.arange(points.shape[0])
    for a, b in flip_pairs:
      order[a], order[b] = b, a
    out["keypoints"] = points[order]
    if "keypoint_visible" in example:
      out["keypoint_visible"] = np.asarray(example["keypoint_visible"], bool)[order]
  return out


# ------------------------------------------------------------------------------------------------
# Transforms: picklable callables (example, rng) -> example.


class Compose:
  """Apply transforms in order, each with the same generator (so the chain stays seeded)."""

  def __init__(self, transforms: Sequence):
    self.transforms = tuple(transforms)

  def __call__(self, example: Example, rng: Optional[np.random.Generator] = None) -> Example:
    for transform in self.transforms:
      example = transform(example, rng)
    return example

  def __repr__(self):
    return f"Compose({list(self.transforms)!r})"


class ResizeShorter:
  """Resize so the shorter side is `size` (aspect kept; the longer side capped by `max_size`)."""

  def __init__(self, size: int, max_size: Optional[int] = None):
    self.size, self.max_size = int(size), max_size

  def __call__(self, example, rng=None):
    h, w = _image_hw(example)
    scale = self.size / min(h, w)
    if self.max_size is not None and max(h, w) * scale > self.max_size:
      scale = self.max_size / max(h, w)
    out_hw = (max(1, round(h * scale)), max(1, round(w * scale)))
    if out_hw == (h, w):
      return example
    return crop_resize(example, (0, 0, w, h), out_hw)

  def __repr__(self):
    return f"ResizeShorter({self.size}, max_size={self.max_size})"


class Resize:
  """Resize to exactly `size` (int or (height, width)), ignoring the aspect ratio."""

  def __init__(self, size: Size):
    self.size = _hw(size)

  def __call__(self, example, rng=None):
    h, w = _image_hw(example)
    if (h, w) == self.size:
      return example
    return crop_resize(example, (0, 0, w, h), self.size)

  def __repr__(self):
    return f"Resize({self.size})"


class CenterCrop:
  """Crop the central `size` window (padding with `fill` if the image is smaller)."""

  def __init__(self, size: Size, fill: int = 0):
    self.size, self.fill = _hw(size), fill

  def __call__(self, example, rng=None):
    h, w = _image_hw(example)
    ch, cw = self.size
    return crop(example, (h - ch) // 2, (w - cw) // 2, ch, cw, self.fill)

  def __repr__(self):
    return f"CenterCrop({self.size})"


class RandomCrop:
  """Crop a uniformly placed `size` window (padding with `fill` if the image is smaller)."""

  def __init__(self, size: Size, fill: int = 0):
    self.size, self.fill = _hw(size), fill

  def __call__(self, example, rng):
    h, w = _image_hw(example)
    ch, cw = self.size
    top = int(rng.integers(0, h - ch + 1)) if h > ch else (h - ch) // 2
    left = int(rng.integers(0, w - cw + 1)) if w > cw else (w - cw) // 2
    return crop(example, top, left, ch, cw, self.fill)

  def __repr__(self):
    return f"RandomCrop({self.size})"


class RandomResizedCrop:
  """Inception-style crop: a box of `scale` x area and log-uniform aspect `ratio`, resized to
  `size`; falls back to the central largest box of allowed aspect after 10 tries."""

  def __init__(self, size: Size, scale: Tuple[float, float] = (0.35, 1.0),
               ratio: Tuple[float, float] = (3 / 4, 4 / 3)):
    self.size, self.scale, self.ratio = _hw(size), tuple(scale), tuple(ratio)

  def box(self, h: int, w: int, rng) -> Tuple[float, float, float, float]:
    area = h * w
    log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
    for _ in range(10):
      target = area * rng.uniform(*self.scale)
      aspect = math.exp(rng.uniform(*log_ratio))
      bw, bh = math.sqrt(target * aspect), math.sqrt(target / aspect)
      if bw <= w and bh <= h:
        x0, y0 = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
        return x0, y0, x0 + bw, y0 + bh
    aspect = min(max(w / h, self.ratio[0]), self.ratio[1])
    bw, bh = (w, w / aspect) if w / h < aspect else (h * aspect, h)
    bw, bh = min(bw, w), min(bh, h)
    return (w - bw) / 2, (h - bh) / 2, (w + bw) / 2, (h + bh) / 2

  def __call__(self, example, rng):
    h, w = _image_hw(example)
    return crop_resize(example, self.box(h, w, rng), self.size)

  def __repr__(self):
    return f"RandomResizedCrop({self.size}, scale={self.scale}, ratio={self.ratio})"


class RandomAffine:
  """Rotation (degrees, uniform in +-degrees), isotropic scale and translation (fractions of the
  size) about the image centre; the output keeps the input size, uncovered pixels get `fill`."""

  def __init__(self, degrees: float = 15.0, scale: Tuple[float, float] = (0.9, 1.1),
               translate: Tuple[float, float] = (0.1, 0.1), fill: int = 0):
    self.degrees, self.scale, self.translate = degrees, tuple(scale), tuple(translate)
    self.fill = fill

  def matrix(self, h: int, w: int, rng) -> np.ndarray:
    theta = math.radians(rng.uniform(-self.degrees, self.degrees))
    s = rng.uniform(*self.scale)
    tx = rng.uniform(-self.translate[0], self.translate[0]) * w
    ty = rng.uniform(-self.translate[1], self.translate[1]) * h
    cx, cy = w / 2, h / 2
    c, si = math.cos(theta) * s, math.sin(theta) * s
    # p' = centre + t + s R (p - centre); y points down, so positive angles turn clockwise.
    return np.array([[c, -si, cx + tx - c * cx + si * cy],
                     [si, c, cy + ty - si * cx - c * cy],
                     [0, 0, 1]], np.float64)

  def __call__(self, example, rng):
    h, w = _image_hw(example)
    return affine(example, self.matrix(h, w, rng), (h, w), self.fill)

  def __repr__(self):
    return (f"RandomAffine(degrees={self.degrees}, scale={self.scale}, "
            f"translate={self.translate})")


class RandomHorizontalFlip:
  """Mirror with probability p, swapping the keypoints of `flip_pairs` (index pairs)."""

  def __init__(self, p: float = 0.5, flip_pairs: Sequence[Tuple[int, int]] = ()):
    self.p = p
    self.flip_pairs = tuple((int(a), int(b)) for a, b in flip_pairs)

  def __call__(self, example, rng):
    if rng.random() < self.p:
      return hflip(example, self.flip_pairs)
    return example

  def __repr__(self):
    return f"RandomHorizontalFlip(p={self.p}, flip_pairs={self.flip_pairs})"


class Normalize:
  """uint8 image -> float32 (image / 255 - mean) / std, mean and std in [0, 1] units per channel
  (the backbone's ViTConfig.image_mean / image_std: use `Normalize.from_config`)."""

  def __init__(self, mean: Sequence[float], std: Sequence[float]):
    self.mean = np.asarray(mean, np.float32)
    self.std = np.asarray(std, np.float32)

  @classmethod
  def from_config(cls, config) -> "Normalize":
    return cls(config.image_mean, config.image_std)

  def __call__(self, example, rng=None):
    out = dict(example)
    image = np.asarray(example["image"], np.float32)
    out["image"] = (image * np.float32(1 / 255) - self.mean) / self.std
    return out

  def __repr__(self):
    return f"Normalize(mean={self.mean.tolist()}, std={self.std.tolist()})"


def flip_pairs_by_name(names: Sequence[str], pairs: Sequence[Tuple[str, str]]):
  """[(name_a, name_b)] -> [(index_a, index_b)] for the pairs whose names both occur in `names`."""
  index = {name: i for i, name in enumerate(names)}
  return tuple((index[a], index[b]) for a, b in pairs if a in index and b in index)


def standard(image_size: Size, *, train: bool, mean: Sequence[float], std: Sequence[float],
             flip_pairs: Sequence[Tuple[int, int]] = (),
             crop_scale: Tuple[float, float] = (0.5, 1.0), resize: Optional[int] = None,
             affine_degrees: float = 0.0) -> Compose:
  """The usual recipes. train: random resized crop (+ optional random affine) + flip; eval:
  resize the shorter side to `resize` (default image_size) + centre crop. Both normalize."""
  hw = _hw(image_size)
  if train:
    steps = [RandomResizedCrop(hw, scale=crop_scale)]
    if affine_degrees:
      steps.append(RandomAffine(degrees=affine_degrees, scale=(1.0, 1.0), translate=(0.0, 0.0)))
    steps.append(RandomHorizontalFlip(0.5, flip_pairs))
  else:
    steps = [ResizeShorter(resize or min(hw)), CenterCrop(hw)]
  steps.append(Normalize(mean, std))
  return Compose(steps)
