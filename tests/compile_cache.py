"""A persistent XLA compilation cache for tests that compile the same programs many times.

XLA's CPU compiles dominate the trainer tests (a tiny ViT's random init alone takes ~10 s to
compile on a loaded 2-core machine). The cache is keyed by the program, the compile options and
the JAX version, so a hit is the same executable and results stay bit-identical.
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


def enable() -> None:
  """Turns the cache on for this process (JAX reads the directory at the next compile)."""
  jax.config.update("jax_compilation_cache_dir", DIRECTORY)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
