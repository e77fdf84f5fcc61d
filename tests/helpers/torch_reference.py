"""Shared helpers for parity tests against PyTorch references built offline with random weights."""

import os

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")

# Parity bound: max |flax - torch| <= REL_TOL * max |torch| (issue: foundation).
REL_TOL = 1e-4


def randomize_(module, seed: int = 0, scale: float = 0.1) -> None:
  """Adds noise to every parameter so LayerScale, biases and position tables all matter."""
  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for _, p in module.named_parameters():
      p.add_(scale * torch.randn(p.shape, generator=generator))


def save_state_dict(state_dict, path: str) -> str:
  """Saves a state dict as .safetensors or as a torch pickle, by the path's suffix."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  state_dict = {k: v.detach().contiguous().clone() for k, v in state_dict.items()}
  if path.endswith(".safetensors"):
    from safetensors.torch import save_file
    save_file(state_dict, path)
  else:
    torch.save(state_dict, path)
  return path


def nchw_to_nhwc(x) -> jnp.ndarray:
  return jnp.asarray(x.permute(0, 2, 3, 1).numpy())


def random_images(batch: int, height: int, width: int, seed: int = 0):
  return torch.randn(batch, 3, height, width, generator=torch.Generator().manual_seed(seed))


def random_part_ids(batch: int, grid, num_parts: int, seed: int = 0) -> np.ndarray:
  """int [B, h, w] in [0, num_parts], every group present in every example."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, num_parts + 1, size=(batch,) + tuple(grid))
  flat = ids.reshape(batch, -1)
  flat[:, : num_parts + 1] = np.arange(num_parts + 1)  # No empty group.
  return flat.reshape(ids.shape)


def early_float_mask(part_ids: np.ndarray, num_parts: int, num_prefix: int):
  """Float [B, 1, L, L] mask (0 allowed, -inf blocked) for [prefix copies][patches] sequences.

  A float mask, because Hugging Face's eager attention *adds* whatever mask it is given.
  """
  batch = part_ids.shape[0]
  groups = np.concatenate([np.repeat(np.arange(num_parts + 1), num_prefix)[None].repeat(batch, 0),
                           part_ids.reshape(batch, -1)], axis=1)
  allowed = groups[:, None, :, None] == groups[:, None, None, :]
  mask = np.where(allowed, 0.0, -np.inf).astype(np.float32)
  return torch.from_numpy(mask)


def early_sequence(embedded, num_prefix: int, num_parts: int):
  """[prefix, patches] -> [prefix copy 0 ... copy K, patches] (torch)."""
  prefix, patches = embedded[:, :num_prefix], embedded[:, num_prefix:]
  return torch.cat([prefix.repeat(1, num_parts + 1, 1), patches], dim=1)


def assert_close_to_reference(got, reference, what: str = "") -> float:
  """Asserts the parity bound; returns the relative error for reporting."""
  got = np.asarray(got, np.float64)
  reference = np.asarray(reference.detach().numpy() if hasattr(reference, "detach") else reference,
                         np.float64)
  assert got.shape == reference.shape, f"{what}: shape {got.shape} vs reference {reference.shape}"
  scale = float(np.abs(reference).max())
  error = float(np.abs(got - reference).max())
  assert error <= REL_TOL * scale, f"{what}: max abs diff {error:.3g} > {REL_TOL} x scale {scale:.3g}"
  return error / scale


def flax_tokens(out) -> np.ndarray:
  """[prefix, patches] of a plain forward, as one array."""
  return np.concatenate([np.asarray(out["prefix_tokens"]), np.asarray(out["patch_tokens"])], axis=1)
