"""The host allocator of a run: jemalloc that keeps its pages, where it is installed.

XLA's CPU backend takes each step's large temporaries (the stand-in's attention maps and
activations at batch 32 are tens of MB) from malloc and frees them when the step ends. glibc's
malloc serves blocks that large with mmap and returns them with munmap, so every step faults
its working set in again, page by page: on the demo's stand-in pretraining, one process per
core of a 2-core machine, ~140,000 page faults a second and 40-50% of the CPU time in the
kernel (docs/benchmarks.md, "The host allocator"). jemalloc told never to purge (MALLOC_CONF
below) keeps those pages mapped for the next step: no faults, about twice the steps a second.
The numbers do not change: where a buffer lives does not change what XLA computes in it.

`python -m metonymy.main` (and `python -m metonymy.bench allocator`) re-executes itself with
jemalloc preloaded when the library is installed (Debian and Ubuntu: `apt install
libjemalloc2`; conda: `conda install jemalloc`), the system is Linux and the process does not
already preload an allocator. METONYMY_ALLOCATOR=system keeps the system's malloc. Processes a
run starts (runs/workers.py) inherit the environment, so they run on it too.
"""

import os
import sys
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

SWITCH = "METONYMY_ALLOCATOR"  # "system": never re-execute; "jemalloc": set by the re-execution
# Never purge dirty or muzzy pages, and keep the address space: a job's host memory stays at
# its peak, which each step reuses instead of faulting it in again.
MALLOC_CONF = "dirty_decay_ms:-1,muzzy_decay_ms:-1,retain:true"
# Where distributions install the library (the conda environment's first).
LIBRARY_PATHS = ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
                 "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
                 "/usr/lib64/libjemalloc.so.2", "/usr/lib/libjemalloc.so.2",
                 "/usr/local/lib/libjemalloc.so.2")
# A preloaded library with one of these in its name is an allocator already chosen.
ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")


def find_jemalloc(env: Mapping[str, str], paths: Sequence[str] = LIBRARY_PATHS) -> str:
  """The path of libjemalloc.so.2 (the conda environment's, then the system's), or ""."""
  conda = env.get("CONDA_PREFIX", "")
  candidates = ([os.path.join(conda, "lib", "libjemalloc.so.2")] if conda else []) + list(paths)
  return next((path for path in candidates if os.path.isfile(path)), "")


def reexec_command(argv: Sequence[str], env: Mapping[str, str], module: str,
                   platform: str = sys.platform,
                   paths: Sequence[str] = LIBRARY_PATHS) -> Optional[Tuple[List[str], Dict]]:
  """(argv, environment) that run `python -m module argv` again on jemalloc, or None when this
  process should go on as it is: not Linux, METONYMY_ALLOCATOR set (to "system", or by an
  earlier re-execution), an allocator already preloaded, or no jemalloc installed."""
  if not platform.startswith("linux") or env.get(SWITCH):
    return None
  preloaded = env.get("LD_PRELOAD", "")
  if any(name in preloaded for name in ALLOCATORS):
    return None
  library = find_jemalloc(env, paths)
  if not library:
    return None
  return [sys.executable, "-m", module, *argv], jemalloc_env(env, library)


def jemalloc_env(env: Mapping[str, str], library: str) -> Dict[str, str]:
  """`env` with `library` preloaded first, MALLOC_CONF (unless `env` has its own) and the switch
  saying the process runs on jemalloc (so it does not re-execute again)."""
  preloaded = env.get("LD_PRELOAD", "")
  child = dict(env, LD_PRELOAD=" ".join(filter(None, (library, preloaded))), **{SWITCH: "jemalloc"})
  child.setdefault("MALLOC_CONF", MALLOC_CONF)
  return child


def use_jemalloc(module: str) -> None:
  """Replaces this process by `python -m module` with the same arguments on jemalloc, when
  reexec_command says so; returns (doing nothing) otherwise. Only for a command's __main__: it
  never returns when it re-executes."""
  command = reexec_command(sys.argv[1:], os.environ, module)
  if command is not None:
    argv, env = command
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)


def name(env: Mapping[str, str] = os.environ) -> str:
  """The host allocator this process runs on ("jemalloc", "tcmalloc", "mimalloc" or "system
  malloc"): what its memory map holds (Linux), else what LD_PRELOAD names."""
  try:
    with open("/proc/self/maps") as f:
      mapped = f.read()
  except OSError:
    mapped = env.get("LD_PRELOAD", "")
  return next((name for name in ALLOCATORS if name in mapped), "system malloc")


def describe(env: Mapping[str, str] = os.environ) -> str:
  """One line on the host allocator this process runs on."""
  allocator = name(env)
  if allocator == "jemalloc":
    return f"jemalloc (MALLOC_CONF={env.get('MALLOC_CONF', '')})"
  return "the system's malloc" if allocator == "system malloc" else allocator


if __name__ == "__main__":  # `python -m metonymy.allocator`: the allocator a run here gets.
  use_jemalloc("metonymy.allocator")
  print(describe())
