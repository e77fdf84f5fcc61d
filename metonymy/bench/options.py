"""What a `bench suite` run measures: its `Options` (defaults, the `--quick` preset, checks), and
the random-weight ViTs, images and patch geometry every section builds from them.

Random weights throughout: the numbers are costs, not accuracies.
"""

import dataclasses
from typing import Any, Dict, Optional, Tuple

import jax.numpy as jnp
import numpy as np

from metonymy.models import vit

SECTIONS = ("early", "two_stage", "vit", "data", "attention")


@dataclasses.dataclass
class Options:
  model: str = "vit_s16"
  depth: int = 4  # 0 = the preset's depth
  batch_size: int = 4
  image_size: int = 224
  num_parts: Tuple[int, ...] = (1, 4, 8, 16)  # K of the early-masking section
  two_stage_parts: Optional[int] = None  # None = the synthetic world's parts (5)
  two_stage_masks: Tuple[str, ...] = ("hard", "ste")  # Stage-2 masks next to the single stage
  fg_fractions: Tuple[float, ...] = (0.1, 0.25, 0.5, 0.75, 1.0)
  attention_model: Optional[str] = None  # None = model
  attention_sizes: Tuple[int, ...] = (224, 384, 512)
  attention_parts: Tuple[int, ...] = (4, 8, 16)
  attention_tiles: int = 64
  vit_parts: int = 8  # K of the Flax-vs-PyTorch section
  repeats: int = 5
  train: bool = True  # time the two-stage training steps
  dtype: str = "float32"
  attention_impl: Optional[str] = None  # None/"xla", or "cudnn" on GPUs (with bfloat16)
  peak_tflops: Optional[float] = None
  torch: bool = True
  threads: Optional[int] = None  # torch intra-op threads
  data_batches: int = 8
  data_examples: int = 64
  sections: Tuple[str, ...] = SECTIONS
  seed: int = 0

  def vit_config(self, name: Optional[str] = None,
                 image_size: Optional[int] = None) -> vit.ViTConfig:
    """The preset `name` (default: the model) at `image_size` (default: the image size), cut to
    `depth` blocks."""
    return vit_config(name or self.model, image_size or self.image_size, self.depth)

  def backbone(self, config: vit.ViTConfig, **kwargs) -> vit.VisionTransformer:
    """`config`'s ViT computing in this run's dtype and attention implementation."""
    return vit.VisionTransformer(config, dtype=jnp.dtype(self.dtype),
                                 attention_impl=self.attention_impl, **kwargs)


# Seconds on 2 CPU cores: the tests' preset. Explicit flags still override it.
QUICK = dict(model="vit_tiny_test", depth=1, batch_size=2, image_size=32, num_parts=(1, 4),
             fg_fractions=(0.25, 1.0), attention_sizes=(32, 64), attention_parts=(4,),
             attention_tiles=8, vit_parts=4, repeats=1, data_batches=2, data_examples=8)


def make_options(quick: bool = False, **overrides: Any) -> Options:
  """Options from the defaults, then the QUICK preset (if `quick`), then non-None overrides."""
  values = dict(QUICK) if quick else {}
  values.update({k: v for k, v in overrides.items() if v is not None})
  options = Options(**values)
  unknown = sorted(set(options.sections) - set(SECTIONS))
  if unknown:
    raise ValueError(f"unknown sections {unknown}; known: {SECTIONS}")
  bad = sorted(set(options.two_stage_masks) - {"hard", "ste"})
  if bad:
    raise ValueError(f"two_stage_masks must be hard and/or ste, got {bad}")
  if options.attention_impl == "xla":
    options.attention_impl = None
  if options.attention_impl == "cudnn" and options.dtype == "float32":
    raise ValueError("--attention-impl cudnn needs --dtype bfloat16 (or float16): cuDNN's fused "
                     "attention has no float32 kernel.")
  return options


def vit_config(name: str, image_size: int, depth: Optional[int] = None) -> vit.ViTConfig:
  """The ViT preset `name` at `image_size`, with `depth` blocks (None or 0: the preset's)."""
  config = vit.get_config(name, image_size=image_size)
  return config.replace(depth=depth) if depth else config


def random_images(rng: np.random.Generator, batch: int, size: int) -> jnp.ndarray:
  return jnp.asarray(rng.normal(size=(batch, size, size, 3)), jnp.float32)


def patch_grid(config: vit.ViTConfig, size: int) -> Tuple[int, int]:
  return (size // config.patch_size,) * 2


def sequence_lengths(config: vit.ViTConfig, size: int, num_parts: int) -> Dict[str, int]:
  """Token counts at `size` px: patches N, prefix P, plain P + N, early-masked (K + 1) P + N."""
  h, w = patch_grid(config, size)
  return {"patches": h * w, "prefix": config.num_prefix, "plain": config.num_prefix + h * w,
          "early": (num_parts + 1) * config.num_prefix + h * w}


def tokens(out: Dict[str, jnp.ndarray]) -> Tuple[jnp.ndarray, jnp.ndarray]:
  """The backbone outputs a forward is timed up to (prefix and patch tokens)."""
  return out["prefix_tokens"], out["patch_tokens"]
