"""The contract every part-discovery model keeps (Stage 1, two-stage); the trainer, the
objective and `loading.load_trained_part_model` are typed against it, not against a class."""

from typing import Any, Dict, Optional, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from metonymy.models import vit


@runtime_checkable
class PartModel(Protocol):
  """A frozen backbone plus trainable parameters that make part maps and attribute logits.

  Frozen backbone parameters are never in the trainable tree: `init` returns the trainable
  parameters only and every call takes the backbone's as `frozen`, so the optimizer never sees
  them (the one way to freeze). Made by `metonymy.loading.build_model(config, num_attributes)`.
  """

  backbone: vit.VisionTransformer  # Frozen; its config gives image_mean/std and the patch grid.

  @property
  def num_parts(self) -> int:
    """K, the foreground parts (the maps have K + 1 channels, background last)."""

  def init(self, rng: jax.Array, images: jnp.ndarray, frozen: Any = None) -> Any:
    """Trainable parameters for images shaped like `images` [B, H, W, 3]."""

  def apply(self, params: Any, frozen: Any, images: jnp.ndarray, *, train: bool,
            rng: Optional[jax.Array] = None) -> Dict[str, Any]:
    """The forward pass on normalized images [B, H, W, 3]:

      maps [B, K+1, h, w]            Stage-1 maps, summing to 1 over parts: the priors act on them
      logits {head: [B, A]}          each head gets an attribute BCE ("stage1"; "stage2" too)
      part_embeddings, modulated_embeddings [B, K+1, D]: what the orthogonality loss reads

    `train` turns the Gumbel noise on (it needs `rng`)."""

  def part_maps(self, params: Any, frozen: Any, images: jnp.ndarray, *, train: bool,
                rng: Optional[jax.Array] = None) -> jnp.ndarray:
    """`apply(...)["maps"]` alone (the equivariance loss's second pass)."""

  def param_groups(self, params: Any) -> Any:
    """A tree like `params` naming each leaf's optimizer group, a key of
    config.optimizer.learning_rates."""
