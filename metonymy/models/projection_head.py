"""The projection head of DINO and iBOT: an MLP, an L2-normalised bottleneck and weight-normalised
prototypes, whose scores a softmax turns into a distribution over the prototypes.

  scores = normalize(mlp(x)) @ (V / ||V||_columns)          x [..., D] -> scores [..., prototypes]

With `prototypes` 0 the head stops at the L2-normalised bottleneck [..., bottleneck]: a projector
for a loss that compares tokens with one another (the dense term) rather than with prototypes.

The prototypes' norm is fixed at 1 (DINO's weight normalisation with its gain frozen), so every
score is a cosine in [-1, 1] and the temperature alone sets how sharp the distribution is.
"""

import flax.linen as nn
import jax.numpy as jnp


def _unit(x: jnp.ndarray, axis: int) -> jnp.ndarray:
  # The epsilon keeps the gradient finite at a zero vector (jnp.linalg.norm's is NaN there).
  return x * jnp.reciprocal(jnp.sqrt(jnp.sum(jnp.square(x), axis=axis, keepdims=True) + 1e-12))


class ProjectionHead(nn.Module):
  """x [..., D] -> prototype scores [..., prototypes] (cosines), or with `prototypes` 0 the unit
  bottleneck vector [..., bottleneck]."""
  hidden: int = 128
  bottleneck: int = 64
  prototypes: int = 256
  layers: int = 3

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    for i in range(self.layers - 1):
      x = nn.gelu(nn.Dense(self.hidden, name=f"mlp_{i}")(x), approximate=False)
    x = _unit(nn.Dense(self.bottleneck, name=f"mlp_{self.layers - 1}")(x), axis=-1)
    if not self.prototypes:
      return x
    prototypes = self.param("prototypes", nn.initializers.lecun_normal(),
                            (self.bottleneck, self.prototypes))
    return x @ _unit(prototypes, axis=0)
