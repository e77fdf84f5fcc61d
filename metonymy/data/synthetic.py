"""The synthetic parts world: the project's embedded default dataset, and a controlled benchmark.

Each image shows one bird-like object made of G semantic parts (default head, body, wing, tail,
legs) laid out by a pose (translation, scale, rotation, mirror) over a cluttered, textured
background, sometimes occluded by a foreground distractor or cut by the image border. Every part
carries local attributes, as binary one-hot groups like CUB's: a colour (palette of up to 10), a
pattern (solid / striped / spotted) and optionally a shape variant (round / square / pointed).

What makes it a benchmark is that the cross-part attribute correlation is a knob. A species latent
fixes a colour scheme (one colour, pattern and shape per part); each part independently follows its
species' scheme with probability `correlation`, and otherwise draws its attributes uniformly. At
correlation 0 the parts are independent of each other (and of the species), so any power of part
j's feature to predict part k's attributes is leakage rather than real correlation. At correlation
0 the species `label` is therefore not predictable from the image either; train species
classifiers at correlation > 0.

Every example is a pure function of (config, split, index): its generator is seeded from
(seed, split, index), so the source is random-access, deterministic and needs no files. Rendering
is vectorised NumPy over coordinate grids (see `benchmark_examples_per_second`).

Coordinates: x to the right, y down, in pixels; pixel (row i, column j) covers [j, j+1) x [i, i+1),
so its centre is (j + 0.5, i + 0.5) and the pixel holding keypoint (x, y) is (floor(y), floor(x)).
"""

import dataclasses
import math
import time
import zlib
from typing import Dict, Optional, Tuple

import numpy as np

from metonymy.data import base

# name -> RGB. The first `num_colors` are used; chosen far apart so that colour is recoverable.
PALETTE: Tuple[Tuple[str, Tuple[int, int, int]], ...] = (
    ("red", (215, 35, 35)),
    ("blue", (35, 80, 215)),
    ("yellow", (235, 215, 40)),
    ("green", (40, 165, 55)),
    ("black", (22, 22, 22)),
    ("white", (240, 240, 240)),
    ("orange", (245, 135, 25)),
    ("purple", (135, 50, 185)),
    ("brown", (120, 72, 35)),
    ("pink", (245, 140, 190)),
)
PATTERNS = ("solid", "striped", "spotted")
SHAPES = ("round", "square", "pointed")  # unit ball of the L2, L-infinity and L1 norm
PLAIN_TONES = ("shared", "part")

# The canonical object, facing +x, y down, in object units (the pose scales them to pixels).
# One row per drawn shape, in drawing (z) order: part index, centre x, centre y, semi-axis along
# the shape's own x, semi-axis along its y, rotation in degrees. The legs are two shapes.
_CANONICAL_PARTS = ("head", "body", "wing", "tail", "legs")
_SHAPES_TABLE = np.array([
    # part  cx     cy     a     b     angle
    [3, -0.62, -0.12, 0.24, 0.09, -25.0],   # tail, behind everything
    [4, -0.12, 0.42, 0.07, 0.17, 0.0],      # back leg
    [4, 0.14, 0.42, 0.07, 0.17, 0.0],       # front leg
    [1, 0.00, 0.00, 0.46, 0.27, 0.0],       # body
    [2, -0.10, -0.06, 0.30, 0.13, -15.0],   # wing, on the body
    [0, 0.55, -0.22, 0.19, 0.17, 0.0],      # head, on top
], np.float64)
# Keypoint of each part (object units): a point of the part that no other part covers for any
# combination of shape variants (checked in tests), so an unoccluded keypoint is on its part.
_KEYPOINTS = np.array([
    [0.55, -0.22],   # head centre
    [0.02, 0.15],    # belly: below the wing, between the legs' tops
    [-0.10, -0.06],  # wing centre
    [-0.62, -0.12],  # tail centre, behind the body's back end
    [0.14, 0.42],    # front leg centre
], np.float64)
# Framing: the object's reach (object units) that a pose keeps inside the image, unless it is cut.
_OBJECT_RADIUS = 0.8
# Every shape of every variant lies within this radius of the origin (for the render window).
_OBJECT_BOUND = float(np.max(np.hypot(_SHAPES_TABLE[:, 1], _SHAPES_TABLE[:, 2])
                             + np.hypot(_SHAPES_TABLE[:, 3], _SHAPES_TABLE[:, 4])))

_SPLIT_IDS = {"train": 0, "val": 1, "test": 2}


@dataclasses.dataclass(frozen=True)
class SyntheticConfig:
  """Everything an example depends on, together with (split, index). Hashable."""
  image_size: int = 64
  # Which of the five canonical parts the object has, in the order of info.part_names.
  part_names: Tuple[str, ...] = _CANONICAL_PARTS
  num_colors: int = 8
  patterns: Tuple[str, ...] = PATTERNS
  num_shapes: int = 2  # 0 = no shape attribute group; up to 3 (round, square, pointed).
  num_species: int = 10
  # P(a part's attributes follow its species' scheme); otherwise drawn uniformly, independently.
  correlation: float = 0.8
  occlusion_prob: float = 0.25  # P(a foreground distractor is placed over a random part)
  border_cut_prob: float = 0.15  # P(the pose pushes the object partly out of the frame)
  clutter: int = 6  # background shapes
  noise: float = 5.0  # std of additive pixel noise (uint8 units)
  max_rotation: float = 30.0  # degrees, either way (180: the full circle)
  scale_range: Tuple[float, float] = (0.36, 0.50)  # pixels per object unit / image_size
  # The least translation range either way, as a fraction of image_size. The pose keeps the
  # object's reach inside the frame where it can; where that leaves less room than this, the
  # object moves this far regardless (and may touch the border).
  min_translation: float = 0.06
  # The share of each part's area that shows its colour and pattern: a disc at a random place
  # inside each drawn shape. The rest of the part shows an attribute-free plain tone (one muted
  # colour per image, shaded per part), so the part keeps its shape and place in the object while
  # a mask over a fraction of it can miss its attributes. 1: the whole part (no plain region).
  evidence_fraction: float = 1.0
  # The plain tone outside the evidence: "shared", one muted colour per image shaded per part
  # (parts known by shape and place alone); "part", a fixed muted tone per part under a
  # per-image lighting (parts also known by their local appearance, as a bird's head is by its
  # feathers whatever their colour). Neither carries an attribute.
  plain_tone: str = "shared"
  seed: int = 0
  splits: Tuple[Tuple[str, int], ...] = (("train", 10000), ("val", 1000), ("test", 2000))

  def __post_init__(self):
    if self.image_size < 16:
      raise ValueError(f"image_size must be >= 16, got {self.image_size}")
    unknown = [p for p in self.part_names if p not in _CANONICAL_PARTS]
    if unknown or not self.part_names or len(set(self.part_names)) != len(self.part_names):
      raise ValueError(f"part_names must be distinct names from {_CANONICAL_PARTS}, "
                       f"got {self.part_names}")
    if not 2 <= self.num_colors <= len(PALETTE):
      raise ValueError(f"num_colors must be in [2, {len(PALETTE)}], got {self.num_colors}")
    if not self.patterns or any(p not in PATTERNS for p in self.patterns):
      raise ValueError(f"patterns must be a non-empty subset of {PATTERNS}, got {self.patterns}")
    if not 0 <= self.num_shapes <= len(SHAPES) or self.num_shapes == 1:
      raise ValueError(f"num_shapes must be 0, 2 or 3, got {self.num_shapes}")
    if self.num_species < 1:
      raise ValueError(f"num_species must be >= 1, got {self.num_species}")
    for name in ("correlation", "occlusion_prob", "border_cut_prob", "min_translation"):
      value = getattr(self, name)
      if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")
    if not 0.0 < self.evidence_fraction <= 1.0:
      raise ValueError(f"evidence_fraction must be in (0, 1], got {self.evidence_fraction}")
    if self.plain_tone not in PLAIN_TONES:
      raise ValueError(f"plain_tone must be one of {PLAIN_TONES}, got {self.plain_tone!r}")
    if not 0.0 <= self.max_rotation <= 180.0:
      raise ValueError(f"max_rotation must be in [0, 180] degrees, got {self.max_rotation}")
    if self.clutter < 0 or self.noise < 0:
      raise ValueError("clutter and noise must be >= 0")
    if not 0 < self.scale_range[0] <= self.scale_range[1]:
      raise ValueError(f"scale_range must be 0 < lo <= hi, got {self.scale_range}")
    names = [name for name, _ in self.splits]
    if len(set(names)) != len(names) or any(int(n) < 1 for _, n in self.splits):
      raise ValueError(f"splits must be distinct (name, size >= 1) pairs, got {self.splits}")

  @property
  def num_parts(self) -> int:
    return len(self.part_names)

  def split_size(self, split: str) -> int:
    for name, size in self.splits:
      if name == split:
        return int(size)
    raise base.DataError(f"synthetic: unknown split {split!r}; splits are "
                         f"{[name for name, _ in self.splits]}")

  def replace(self, **kwargs) -> "SyntheticConfig":
    return dataclasses.replace(self, **kwargs)

  @classmethod
  def from_options(cls, **options) -> "SyntheticConfig":
    """Config from keyword options (command line, registry); lists become tuples."""
    return cls(**_normalize_options(options))


def _normalize_options(options) -> Dict:
  known = {f.name for f in dataclasses.fields(SyntheticConfig)}
  unknown = sorted(set(options) - known)
  if unknown:
    raise ValueError(f"Unknown synthetic options {unknown}; known options are {sorted(known)}.")
  options = dict(options)
  for key in ("part_names", "patterns", "scale_range"):
    if key in options:
      options[key] = tuple(options[key])
  if "splits" in options:
    # Accept {name: size} as well as ((name, size), ...).
    splits = options["splits"]
    splits = splits.items() if isinstance(splits, dict) else splits
    options["splits"] = tuple((str(name), int(size)) for name, size in splits)
  return options


def attribute_names(config: SyntheticConfig) -> Tuple[str, ...]:
  """CUB-style names, part-major: has_<part>_color::<c>, has_<part>_pattern::<p>, _shape::<s>."""
  names = []
  for part in config.part_names:
    names += [f"has_{part}_color::{name}" for name, _ in PALETTE[:config.num_colors]]
    names += [f"has_{part}_pattern::{p}" for p in config.patterns]
    names += [f"has_{part}_shape::{s}" for s in SHAPES[:config.num_shapes]]
  return tuple(names)


def dataset_info(config: SyntheticConfig) -> base.DatasetInfo:
  per_part = config.num_colors + len(config.patterns) + config.num_shapes
  return base.DatasetInfo(
      name="synthetic",
      attribute_names=attribute_names(config),
      part_names=tuple(config.part_names),
      attribute_part=tuple(g for g in range(config.num_parts) for _ in range(per_part)),
      # One keypoint per part, so keypoint_group_ids is its default, 0..G-1.
      keypoint_groups=tuple(config.part_names))


def _split_id(split: str) -> int:
  # Stable across processes and Python runs (unlike hash()).
  return _SPLIT_IDS.get(split, zlib.crc32(split.encode()) + len(_SPLIT_IDS))


def _species_schemes(config: SyntheticConfig) -> np.ndarray:
  """int64 [num_species, G, 3]: each species' (colour, pattern, shape) per part."""
  rng = np.random.default_rng([config.seed, zlib.crc32(b"species")])
  highs = (config.num_colors, len(config.patterns), max(config.num_shapes, 1))
  return np.stack([rng.integers(0, h, (config.num_species, config.num_parts)) for h in highs], -1)


def _rotation(degrees):
  t = np.deg2rad(degrees)
  return np.cos(t), np.sin(t)


def _fields(coef: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
  """Affine fields over the pixel grid: coef [..., 3] -> f [..., H, W] with
  f[..., i, j] = coef[..., 0] * xs[j] + coef[..., 1] * ys[i] + coef[..., 2].

  Separable, so all fields cost one full-size addition (per-op overhead dominates at 64 px).
  """
  coef = coef.astype(np.float32)
  row = coef[..., 0:1] * xs + coef[..., 2:3]
  col = coef[..., 1:2] * ys
  return col[..., :, None] + row[..., None, :]


def _ellipse_coef(centre, axes, cos, sin):
  """coef [K, 2, 3] of pixel -> (u / a, v / b) in the frame of K rotated ellipses (pixels)."""
  cx, cy = centre[..., 0], centre[..., 1]
  a, b = axes[..., 0], axes[..., 1]
  return np.stack([np.stack([cos / a, sin / a, -(cos * cx + sin * cy) / a], -1),
                   np.stack([-sin / b, cos / b, (sin * cx - cos * cy) / b], -1)], -2)


# Colour codes of the single per-pixel map every layer writes into (np.maximum composites them,
# each layer's codes being above the ones below): background texture levels, then clutter, then
# three per object shape (its plain tone, its colour, its pattern's second tone), then the
# occluder's two checker tones.
_LEVELS = 16
# Patterns, in cycles per object unit (~3-4 px per stripe / spot cell at 64 px).
_STRIPE_FREQ = 9.0
_SPOT_FREQ = 8.0
_CODES_PER_SHAPE = 3
# The plain tone of parts outside their evidence (evidence_fraction < 1): muted, so that it
# carries no palette colour, and shaded per part so that part borders stay visible.
_PLAIN_RANGE = (70.0, 190.0)
_PLAIN_SHADE = 25.0
# plain_tone="part": each canonical part's own muted tone (far from every palette colour), lit by
# one per-image offset within +-_PART_LIGHTING and shaded within +-_PART_SHADE per part.
_PART_TONES = np.array([[165, 145, 120],   # head: tan
                        [120, 135, 150],   # body: slate
                        [140, 155, 120],   # wing: sage
                        [155, 120, 145],   # tail: mauve
                        [95, 95, 95]],     # legs: grey
                       np.float32)
_PART_LIGHTING = 20.0
_PART_SHADE = 8.0


class _Draws:
  """Consecutive slices of one block of U[0, 1) draws: one generator call per example, since
  per-call overhead, not arithmetic, dominates a 64-px render."""

  def __init__(self, u: np.ndarray):
    self._u = u
    self._i = 0

  def uniform(self, low=0.0, high=1.0, size=None):
    if size is None:
      self._i += 1
      return low + (high - low) * float(self._u[self._i - 1])
    k = int(np.prod(size))
    out = self._u[self._i:self._i + k].reshape(size)
    self._i += k
    return low + (high - low) * out

  def integers(self, high, size=None):
    """Uniform integers in [0, high)."""
    if size is None:
      return int(self.uniform(0.0, high))
    return np.floor(self.uniform(0.0, high, size)).astype(np.int64)


class SyntheticParts:
  """Random-access source of synthetic parts-world examples (see base.py for the keys).

  Example `i` of split `split` depends only on (config, split, i). Picklable, so Grain worker
  processes can hold it.
  """

  def __init__(self, config: Optional[SyntheticConfig] = None, split: str = "train"):
    self.config = config if config is not None else SyntheticConfig()
    self.split = split
    self._size = self.config.split_size(split)
    self._split_id = _split_id(split)
    self._info = dataset_info(self.config)
    self._schemes = _species_schemes(self.config)
    cfg = self.config
    n = cfg.image_size
    # Shapes of the selected parts only, relabelled to positions in cfg.part_names.
    keep = [_CANONICAL_PARTS.index(p) for p in cfg.part_names]
    rows = np.array([r for r in _SHAPES_TABLE if int(r[0]) in keep])
    self._shape_part = np.array([keep.index(int(r[0])) for r in rows], np.int64)   # [S]
    cos, sin = _rotation(rows[:, 5])
    # Object frame -> shape frame: l = Rinv (c - centre); [S, 2, 3] acting on (cx, cy, 1).
    rinv = np.stack([np.stack([cos, sin], -1), np.stack([-sin, cos], -1)], -2)      # [S, 2, 2]
    self._shape_frame = np.concatenate(
        [rinv, -np.einsum("sij,sj->si", rinv, rows[:, 1:3])[..., None]], -1)
    # Rows of the per-shape fields: (u / a, v / b) for the inside test, stripe and spot phases.
    zero = np.zeros_like(cos)
    self._shape_scale = np.stack([
        np.stack([1 / rows[:, 3], zero], -1),
        np.stack([zero, 1 / rows[:, 4]], -1),
        np.stack([zero + _STRIPE_FREQ, zero], -1),
        np.stack([zero + _SPOT_FREQ, zero], -1),
        np.stack([zero, zero + _SPOT_FREQ], -1)], 1)                                # [S, 5, 2]
    self._keypoints = _KEYPOINTS[keep].astype(np.float64)                          # [G, 2]
    self._part_tones = _PART_TONES[keep]                                            # [G, 3]
    self._xs = self._ys = np.arange(n, dtype=np.float32) + 0.5  # pixel centres
    self._ramp = np.linspace(0, 1, _LEVELS)[:, None]
    palette = np.array([rgb for _, rgb in PALETTE[:cfg.num_colors]], np.float32)
    # Second tone of a pattern: darker for light colours, lighter for dark ones.
    light = palette.mean(-1, keepdims=True) > 110
    self._palette = np.stack([palette, np.where(light, palette * 0.45, palette * 0.4 + 150)], 1)
    self._pattern_ids = np.array([PATTERNS.index(p) for p in cfg.patterns], np.int64)
    per_part = cfg.num_colors + len(cfg.patterns) + cfg.num_shapes
    self._offsets = (np.arange(cfg.num_parts) * per_part)[:, None] + np.array(
        [0, cfg.num_colors, cfg.num_colors + len(cfg.patterns)])[None, :]         # [G, 3]
    num_shapes = len(rows)
    self._clutter_base = _LEVELS
    self._object_base = _LEVELS + cfg.clutter
    self._occluder_base = self._object_base + _CODES_PER_SHAPE * num_shapes
    self._num_codes = self._occluder_base + 2
    if self._num_codes > 256:  # codes are uint8
      raise ValueError(f"clutter={cfg.clutter} is too large: at most "
                       f"{256 - self._num_codes + cfg.clutter}")
    seg = np.zeros(self._num_codes, np.uint8)
    seg[self._object_base:self._occluder_base] = np.repeat(self._shape_part + 1, _CODES_PER_SHAPE)
    self._segment_of_code = seg
    # Codes that show a part's attributes (its colour and its pattern's second tone).
    evidence = np.zeros(self._num_codes, bool)
    evidence[self._object_base:self._occluder_base] = np.tile(
        np.arange(_CODES_PER_SHAPE) > 0, num_shapes)
    self._evidence_of_code = evidence
    # Code of each shape's plain tone; its colour and its pattern's second tone follow.
    self._shape_codes = (self._object_base
                         + _CODES_PER_SHAPE * np.arange(num_shapes)).astype(np.uint8)
    self._clutter_codes = np.arange(self._clutter_base, self._object_base).astype(np.uint8)
    # Pixel noise: uniform with std `noise`, read at a random offset of one fixed bank (drawing
    # fresh noise would cost more than the whole render).
    amplitude = cfg.noise * math.sqrt(3.0)
    bank_rng = np.random.default_rng([cfg.seed, zlib.crc32(b"noise")])
    self._noise = bank_rng.uniform(-amplitude, amplitude, 2 * n * n * 3).astype(np.float32)
    self._num_draws = (self._num_latent_draws + 8 + 9 + 8 * cfg.clutter + 15 + 1)
    # The evidence discs' and plain tones' draws come after every other draw, so a world with
    # evidence_fraction 1 renders exactly as before the knob existed.
    self._num_evidence_draws = 2 * num_shapes + 3 + 3 * cfg.num_parts

  @property
  def _num_latent_draws(self) -> int:
    return 1 + 4 * self.config.num_parts

  def __len__(self) -> int:
    return self._size

  @property
  def info(self) -> base.DatasetInfo:
    return self._info

  def _rng(self, index: int) -> np.random.Generator:
    return np.random.default_rng([self.config.seed, self._split_id, index])

  def _check_index(self, index) -> int:
    if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)):
      raise TypeError(f"synthetic {self.split}: index must be an integer, got {index!r}")
    index = int(index)
    if not 0 <= index < self._size:
      raise IndexError(f"synthetic {self.split}: index {index} out of range [0, {self._size})")
    return index

  def _draw_latents(self, draws: _Draws) -> Dict[str, np.ndarray]:
    """The attribute latents; always the first draws of an example's generator."""
    cfg = self.config
    g = cfg.num_parts
    species = draws.integers(cfg.num_species)
    follows = draws.uniform(size=g) < cfg.correlation
    own = np.stack([draws.integers(cfg.num_colors, g), draws.integers(len(cfg.patterns), g),
                    draws.integers(max(cfg.num_shapes, 1), g)], -1)
    values = np.where(follows[:, None], self._schemes[species], own)
    return {"species": species, "follows": follows, "color": values[:, 0],
            "pattern": values[:, 1], "shape": values[:, 2]}

  def latents(self, index: int) -> Dict[str, np.ndarray]:
    """species, follows [G] bool, color / pattern / shape [G] int of example `index`, without
    rendering (exactly what `self[index]` shows and encodes in `attributes`)."""
    rng = self._rng(self._check_index(index))
    # A generator's doubles come one per output, so this prefix equals __getitem__'s first draws.
    return self._draw_latents(_Draws(rng.random(self._num_latent_draws)))

  def __getitem__(self, index) -> Dict[str, np.ndarray]:
    index = self._check_index(index)
    block = self._rng(index).random(self._num_draws + self._num_evidence_draws)
    draws, evidence_draws = _Draws(block[:self._num_draws]), _Draws(block[self._num_draws:])
    cfg = self.config
    n = cfg.image_size
    lat = self._draw_latents(draws)
    table = np.zeros((self._num_codes, 3), np.float32)  # colour of every code, filled per layer

    # Pose: object -> pixels is p = t + s * R(theta) * diag(mirror, 1) * c.
    mirror = 1.0 if draws.uniform() < 0.5 else -1.0
    cos, sin = _rotation(draws.uniform(-cfg.max_rotation, cfg.max_rotation))
    scale = n * draws.uniform(*cfg.scale_range)
    # Keep the object's reach inside the frame, unless this example is cut by the border.
    slack = max(0.5 * n - _OBJECT_RADIUS * scale, cfg.min_translation * n)
    t = 0.5 * n + draws.uniform(-slack, slack, 2)
    cut, angle, distance = draws.uniform(size=3)
    if cut < cfg.border_cut_prob:
      angle *= 2 * np.pi
      t += (0.25 + 0.2 * distance) * n * np.array([np.cos(angle), np.sin(angle)])

    code = self._background(draws, table)

    # Parts. Pixel -> object frame: c = diag(mirror, 1) R(-theta) (q - t) / s, as [2, 3].
    a, b, c, d = mirror * cos / scale, mirror * sin / scale, -sin / scale, cos / scale
    pixel_to_object = np.array([[a, b, -(a * t[0] + b * t[1])],
                                [c, d, -(c * t[0] + d * t[1])],
                                [0.0, 0.0, 1.0]])
    frame = self._shape_frame @ pixel_to_object
    # Render the parts only in the object's bounding window (about half the image at 64 px).
    reach = _OBJECT_BOUND * scale
    r0, c0 = max(int(t[1] - reach), 0), max(int(t[0] - reach), 0)
    r1, c1 = max(min(int(t[1] + reach) + 2, n), r0), max(min(int(t[0] + reach) + 2, n), c0)
    f = _fields(self._shape_scale @ frame, self._xs[c0:c1], self._ys[r0:r1])   # [S, 5, h, w]
    au, av = np.abs(f[:, 0]), np.abs(f[:, 1])
    inside = au * au + av * av <= 1
    if cfg.num_shapes:
      shape_of = lat["shape"][self._shape_part][:, None, None]
      inside = np.where(shape_of == 1, np.maximum(au, av) <= 1, inside)
      if cfg.num_shapes == 3:
        inside = np.where(shape_of == 2, au + av <= 1, inside)
    pattern_of = self._pattern_ids[lat["pattern"]][self._shape_part][:, None, None]
    tone = self._shape_codes[:, None, None] + 1  # the part's colour
    if (pattern_of == 1).any():
      stripes = np.floor(f[:, 2]).astype(np.int32) & 1
      tone = np.where(pattern_of == 1, tone + stripes, tone)
    if (pattern_of == 2).any():
      phase = f[:, 3:5] - np.floor(f[:, 3:5]) - 0.5
      spots = (phase * phase).sum(1) < 0.09
      tone = np.where(pattern_of == 2, tone + spots, tone)
    if cfg.evidence_fraction < 1:
      tone = np.where(self._evidence_disc(evidence_draws, f[:, 0], f[:, 1]), tone,
                      self._shape_codes[:, None, None])
    if inside.size:
      window = code[r0:r1, c0:c1]
      np.maximum(window, np.where(inside, tone, 0).max(0).astype(np.uint8), out=window)
    shape_tones = table[self._object_base:self._occluder_base].reshape(-1, _CODES_PER_SHAPE, 3)
    shape_tones[:, 1:] = self._palette[lat["color"]][self._shape_part]
    if cfg.evidence_fraction < 1:
      plain = evidence_draws.uniform(0.0, 1.0, size=3)
      shade = evidence_draws.uniform(-1.0, 1.0, (cfg.num_parts, 3))
      if cfg.plain_tone == "shared":
        tones = _PLAIN_RANGE[0] + (_PLAIN_RANGE[1] - _PLAIN_RANGE[0]) * plain + _PLAIN_SHADE * shade
      else:
        lighting = _PART_LIGHTING * (2 * plain[0] - 1)
        tones = self._part_tones + lighting + _PART_SHADE * shade
      shape_tones[:, 0] = np.clip(tones, 0, 255)[self._shape_part]

    # Keypoints: canonical points through the pose.
    kx, ky = mirror * self._keypoints[:, 0], self._keypoints[:, 1]
    keypoints = np.stack([t[0] + scale * (cos * kx - sin * ky),
                          t[1] + scale * (sin * kx + cos * ky)], -1)

    occlude = draws.uniform() < cfg.occlusion_prob
    target = keypoints[draws.integers(cfg.num_parts)]
    occluder = self._occluder(draws, table, target, render=occlude)
    if occluder is not None:
      np.maximum(code, occluder, out=code)

    image = np.take(table, code, axis=0)
    if cfg.noise:
      offset = draws.integers(image.size)
      image += self._noise[offset:offset + image.size].reshape(image.shape)
    image = np.clip(image, 0, 255, out=image).astype(np.uint8)
    segmentation = np.take(self._segment_of_code, code)

    # A keypoint is visible iff it is in the frame and its pixel shows its own part.
    col, row = np.floor(keypoints).astype(np.int64).T
    in_frame = (col >= 0) & (col < n) & (row >= 0) & (row < n)
    seen = segmentation.ravel()[np.clip(row, 0, n - 1) * n + np.clip(col, 0, n - 1)]
    visible = in_frame & (seen == np.arange(1, cfg.num_parts + 1))

    attributes = np.zeros(self._info.num_attributes, np.float32)
    attributes[self._offsets[:, 0] + lat["color"]] = 1.0
    attributes[self._offsets[:, 1] + lat["pattern"]] = 1.0
    if cfg.num_shapes:
      attributes[self._offsets[:, 2] + lat["shape"]] = 1.0
    example = {
        "image": image,
        "attributes": attributes,
        "attribute_valid": np.ones(self._info.num_attributes, bool),
        "keypoints": keypoints.astype(np.float32),
        "keypoint_visible": visible,
        "part_segmentation": segmentation,
        "label": np.int32(lat["species"]),
        "index": np.int64(index),
    }
    if cfg.evidence_fraction < 1:
      example["part_evidence"] = np.take(self._evidence_of_code, code)
    return example

  def _evidence_disc(self, draws: _Draws, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """bool [S, h, w]: where each shape shows its part's attributes, a disc of evidence_fraction
    of the unit disc (each shape's own frame, u, v [S, h, w]) at a uniform place inside it."""
    radius = math.sqrt(self.config.evidence_fraction)
    reach = (1.0 - radius) * np.sqrt(draws.uniform(size=len(u)))
    angle = draws.uniform(0.0, 2 * np.pi, len(u))
    cu, cv = (reach * np.cos(angle))[:, None, None], (reach * np.sin(angle))[:, None, None]
    return (u - cu) ** 2 + (v - cv) ** 2 <= radius * radius

  def _background(self, draws: _Draws, table: np.ndarray) -> np.ndarray:
    """Codes uint8 [H, W] of a muted plane-wave texture under random ellipses (clutter)."""
    cfg = self.config
    n = cfg.image_size
    c0 = draws.uniform(50, 200, 3)
    c1 = np.clip(c0 + draws.uniform(-60, 60, 3), 0, 255)
    table[:_LEVELS] = c0 + (c1 - c0) * self._ramp
    k = 2 * np.pi / draws.uniform(5, 16)
    direction, phase = draws.uniform(0, 2 * np.pi, 2)
    wave = _fields(np.array([k * np.cos(direction), k * np.sin(direction), phase]),
                   self._xs, self._ys)
    code = ((np.sin(wave) + 1) * np.float32(_LEVELS / 2 - 1e-3)).astype(np.uint8)
    m = cfg.clutter
    if m:
      centre = draws.uniform(0, n, (m, 2))
      axes = draws.uniform(0.03 * n, 0.14 * n, (m, 2))
      cos, sin = _rotation(draws.uniform(0, 180, m))
      uv = _fields(_ellipse_coef(centre, axes, cos, sin), self._xs, self._ys)  # [m, 2, H, W]
      inside = (uv * uv).sum(1) <= 1
      # Muted colours, so clutter is texture rather than a second object.
      table[self._clutter_base:self._object_base] = draws.uniform(40, 215, (m, 3))
      top = np.where(inside, self._clutter_codes[:, None, None], 0).max(0).astype(np.uint8)
      np.maximum(code, top, out=code)
    return code

  def _occluder(self, draws: _Draws, table: np.ndarray, target: np.ndarray,
                render: bool) -> Optional[np.ndarray]:
    """Codes uint8 [H, W] of a checkered foreground distractor (ellipse or box) near `target`.

    Its parameters are drawn even when `render` is False, so later draws do not shift."""
    n = self.config.image_size
    centre = target + draws.uniform(-0.08 * n, 0.08 * n, 2)
    cos, sin = _rotation(draws.uniform(0, 180))
    axes = draws.uniform(0.10 * n, 0.20 * n, 2)
    box = draws.uniform() < 0.5
    colors = draws.uniform(0, 255, (2, 3))
    cell = draws.uniform(2.5, 5.0)
    if not render:
      return None
    table[self._occluder_base:] = colors
    uv = np.abs(_fields(_ellipse_coef(centre, axes, np.float64(cos), np.float64(sin)),
                        self._xs, self._ys))                                  # [2, H, W]
    inside = (uv.max(0) <= 1) if box else ((uv * uv).sum(0) <= 1)
    checker = ((np.floor((self._ys - centre[1]) / cell)[:, None]
                + np.floor((self._xs - centre[0]) / cell)[None, :]) % 2).astype(np.uint8)
    return np.where(inside, np.uint8(self._occluder_base) + checker, 0).astype(np.uint8)


def make_source(root=None, split: str = "train", config: Optional[SyntheticConfig] = None,
                **options) -> SyntheticParts:
  """Registry entry point; `root` is ignored (no files), `options` are SyntheticConfig fields."""
  del root
  if config is None:
    config = SyntheticConfig.from_options(**options)
  elif options:
    config = config.replace(**_normalize_options(options))
  return SyntheticParts(config, split)


def check(root=None, config: Optional[SyntheticConfig] = None, **options) -> base.CheckReport:
  """Render a few examples of every split, validate them against the data contract, report the
  world's tables. `root` is ignored; `options` are SyntheticConfig fields."""
  del root
  config = config if config is not None else SyntheticConfig.from_options(**options)
  info = dataset_info(config)
  n, g, a = config.image_size, config.num_parts, info.num_attributes
  expected = {"image": (np.uint8, (n, n, 3)), "attributes": (np.float32, (a,)),
              "attribute_valid": (np.bool_, (a,)), "keypoints": (np.float32, (g, 2)),
              "keypoint_visible": (np.bool_, (g,)), "part_segmentation": (np.uint8, (n, n)),
              "label": (np.int32, ()), "index": (np.int64, ())}
  splits = {}
  for split, size in config.splits:
    source = SyntheticParts(config, split)
    splits[split] = len(source)
    for i in range(min(4, size)):
      example = source[i]
      for key, (dtype, shape) in expected.items():
        if key not in example or example[key].dtype != dtype or example[key].shape != shape:
          raise base.DataError(f"synthetic {split}[{i}]: {key} is not {np.dtype(dtype)} {shape}")
  return base.CheckReport(dataset="synthetic", splits=splits, num_attributes=a,
                          attribute_groups=info.attribute_groups(),
                          keypoint_groups=list(info.keypoint_groups), masks=0, warnings=[])


def benchmark_examples_per_second(config: Optional[SyntheticConfig] = None,
                                  num_examples: int = 500, split: str = "train",
                                  clock: str = "process") -> float:
  """Single-core generation throughput (examples/s) of `SyntheticParts.__getitem__`.

  clock="process" counts this process's CPU time, which is what one core delivers even when
  other jobs share the machine; clock="wall" counts elapsed time.
  """
  timer = {"process": time.process_time, "wall": time.perf_counter}[clock]
  source = SyntheticParts(config, split)
  num_examples = min(num_examples, len(source))
  source[0]  # warm-up: first-call allocations
  start = timer()
  for i in range(num_examples):
    source[i]
  return num_examples / (timer() - start)
