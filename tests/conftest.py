"""Test setup. Nothing here may touch a JAX backend before the test modules configure it."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

# Parity tests compare float32 against PyTorch: on GPUs JAX would otherwise use TF32 matmuls.
import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
