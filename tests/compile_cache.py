"""XLA compile settings for tests: a persistent compilation cache, and compiles without LLVM's
expensive optimisations, here and in every process a test starts.

XLA's CPU compiles dominate the trainer tests (a tiny ViT's random init alone takes ~10 s to
compile on a loaded 2-core machine). The cache is keyed by the program, the compile options and
the JAX version, so a hit is the same executable and results stay bit-identical.

A fresh clone (and CI) starts with the cache empty, so most programs are still compiled once per
pytest command. JAX's `jax_disable_most_optimizations` (added for smoke tests, jax PR 3208) sets
XLA's LLVM backend to optimisation level 0 without its expensive passes: the same HLO programs
become less optimised machine code (its floats can differ in the last bits from an optimised
build's, e.g. without fused multiply-adds). Measured cold on 2 cores: a 40-step
`python -m metonymy.main` run's CPU time 33 s -> 22 s, tests/test_objective.py's compiles
57 s -> 23 s. The suite's bit-for-bit comparisons (resumed vs uninterrupted, 1 vs 8 devices,
in-process vs subprocess) compare runs made under the same setting.
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
# Read by JAX at import in a process a test starts (tests/conftest.py exports it); not XLA_FLAGS,
# which tests of multi-process runs clear.
ENV = {"JAX_COMPILATION_CACHE_DIR": DIRECTORY,
       "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
       "JAX_DISABLE_MOST_OPTIMIZATIONS": "1"}


def enable() -> None:
  """Turns the settings on for this process (JAX reads them at the next compile)."""
  jax.config.update("jax_compilation_cache_dir", DIRECTORY)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_disable_most_optimizations", True)
