"""XLA compile settings for tests: a persistent compilation cache, and compiles with less LLVM
optimisation, here and in every process a test starts.

XLA's CPU compiles dominate the trainer tests (a tiny ViT's random init alone takes ~10 s to
compile on a loaded 2-core machine). The cache is keyed by the program, the compile options and
the JAX version, so a hit is the same executable and results stay bit-identical.

A fresh clone (and CI) starts with the cache empty, so most programs are still compiled once per
pytest command, and LLVM's optimisation of XLA's CPU kernels is most of that compile time.
XLA_FLAGS below runs LLVM at level 1 without its expensive passes: the same HLO programs become
less optimised machine code (its floats can differ in the last bits from an optimised build's).
Measured cold on 2 cores (a 4-step two-stage STE run of configs/demo.py, as the Colab notebook
trains it): CPU time 70 s at XLA's default level 3, 34 s at level 1. Not level 0 (what
`jax_disable_most_optimizations` sets, 60 s): that run's gradients turn NaN at step 2 there, the
one failure level 0 gave in the whole suite. The suite's bit-for-bit comparisons (resumed vs
uninterrupted, 1 vs 8 devices, in-process vs subprocess) compare runs made under the same flags.
"""

import getpass
import os
import tempfile

import jax

# METONYMY_TEST_JAX_CACHE names another folder: an empty one measures the suite as a fresh clone
# (or CI) runs it, cold, without touching the cache other runs on this machine share.
DIRECTORY = os.environ.get(
    "METONYMY_TEST_JAX_CACHE",
    os.path.join(tempfile.gettempdir(), f"metonymy-test-jax-cache-{getpass.getuser()}"))
ENV = {"JAX_COMPILATION_CACHE_DIR": DIRECTORY,
       "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
# Read when JAX first starts its backend: tests/conftest.py adds them to XLA_FLAGS before that,
# for itself and every process a test starts (process_env for processes with devices of their
# own).
XLA_FLAGS = "--xla_backend_optimization_level=1 --xla_llvm_disable_expensive_passes=true"


def process_env(num_cpu_devices: int, **extra: str) -> dict:
  """The environment of a process a test starts with `num_cpu_devices` CPU devices of its own:
  this one's (the cache included), with XLA_FLAGS exactly XLA_FLAGS, so no device flag of the
  caller's reaches it."""
  return dict(os.environ, JAX_NUM_CPU_DEVICES=str(num_cpu_devices), **extra,
              XLA_FLAGS=XLA_FLAGS)


def enable() -> None:
  """Turns the cache on for this process (JAX reads the directory at the next compile)."""
  jax.config.update("jax_compilation_cache_dir", DIRECTORY)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
