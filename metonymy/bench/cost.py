"""What a program costs: wall time, XLA-counted FLOPs and XLA's buffer memory, shared by every
benchmark here.

Times are minima over interleaved repetitions in one process, so ratios between variants are
taken under the same machine load. FLOPs are XLA's count for the compiled program
(`compiled.cost_analysis()["flops"]`). XLA counts a conditional's costliest branch, so for a
program that picks a capacity bucket or attention window at run time, `Variant` also compiles it
with the part ids baked in, where XLA folds the choice to the branch taken; loops around matrix
products are flagged (their body counts once). Memory is XLA's buffer assignment (arguments +
outputs + temporaries - aliased) and, on GPUs, also the allocator's process peak so far. MFU =
XLA FLOPs per second / the accelerator's peak (bf16 dense, `PEAK_TFLOPS` by `device_kind`).
"""

import dataclasses
import re
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import jax

# Peak dense bf16 TFLOP/s per chip, by a lower-case substring of jax.devices()[0].device_kind;
# the first match wins (so "h100 pcie" before "h100", "v5 lite" before "v5"). Vendor datasheets:
# H100/H200 SXM 989 (PCIe 756), A100 312; TPU v4 275, v5e 197, v5p 459, v6e 918.
PEAK_TFLOPS: Tuple[Tuple[str, float], ...] = (
    ("h100 pcie", 756.0),
    ("h100", 989.0),
    ("h200", 989.0),
    ("a100", 312.0),
    ("tpu v4", 275.0),
    ("tpu v5 lite", 197.0),
    ("tpu v5e", 197.0),
    ("tpu v5p", 459.0),
    ("tpu v5", 459.0),  # v5p reports itself as "TPU v5"
    ("tpu v6 lite", 918.0),
    ("tpu v6e", 918.0),
)


def peak_tflops(device_kind: str, override: Optional[float] = None) -> Optional[float]:
  """Peak bf16 dense TFLOP/s of `device_kind` (None if unknown, e.g. CPUs), or `override`."""
  if override:
    return float(override)
  kind = device_kind.lower()
  for key, value in PEAK_TFLOPS:
    if key in kind:
      return value
  return None


def seconds(fn: Callable[[], Any]) -> float:
  """Wall seconds of one call; `fn` must block until its work is done."""
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def interleaved_minima(fns: Dict[str, Callable[[], Any]], repeats: int) -> Dict[str, float]:
  """Best seconds per call of each of `fns` (already compiled and warm) over `repeats` rounds.

  Interleaved, so slow drifts of machine load hit every variant; the minimum, because load from
  other processes only ever adds time."""
  samples = {name: [] for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      samples[name].append(seconds(fn))
  return {name: min(s) for name, s in samples.items()}


def xla_flops(compiled) -> Optional[float]:
  """XLA's FLOP count of a compiled program (a dict in current JAX, a list of dicts in older)."""
  try:
    cost = compiled.cost_analysis()
  except NotImplementedError:
    return None
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  if not cost or "flops" not in cost:
    return None
  return float(cost["flops"])


def xla_memory_bytes(compiled) -> Optional[int]:
  """Arguments + outputs + temporaries - aliased bytes of XLA's buffer assignment."""
  try:
    stats = compiled.memory_analysis()
  except NotImplementedError:
    return None
  if stats is None:
    return None
  return int(stats.argument_size_in_bytes + stats.output_size_in_bytes
             + stats.temp_size_in_bytes - stats.alias_size_in_bytes)


def control_flow(compiled) -> List[str]:
  """Control flow that makes XLA's FLOP count differ from the executed one: "conditional" (XLA
  counts the costliest branch) and "while" around matrix products (the body counts once).
  Loops without products (the PRNG's) are left out."""
  try:
    text = compiled.as_text()
  except Exception:  # Some backends cannot print the optimized HLO.
    return []
  found = ["conditional"] if " conditional(" in text else []
  # A product traced inside a loop body carries "while/body" in its op name (fusions included).
  if re.search(r" (dot|convolution)\([^\n]*op_name=\"[^\"]*while/body", text):
    found.append("while")
  return found


def device_peak_bytes() -> Optional[int]:
  """The allocator's peak bytes in use so far in this process (GPUs; None where unreported)."""
  stats = jax.devices()[0].memory_stats()
  return int(stats["peak_bytes_in_use"]) if stats and "peak_bytes_in_use" in stats else None


@dataclasses.dataclass
class Variant:
  """One program to measure: `fn(*args)`, processing `batch` images per call.

  `control`: positions of the arguments (part ids, part maps) that pick branches at run time
  (capacity buckets, attention windows). XLA counts a conditional's costliest branch, so when
  the program has one, its executed FLOPs are counted on a second compile with those arguments
  baked in as constants: XLA then folds the branch choice and keeps only the branch taken.
  """
  fn: Callable
  args: Tuple
  batch: int
  control: Tuple[int, ...] = ()
  compiled: Any = None
  stats: Dict[str, Any] = dataclasses.field(default_factory=dict)

  def compile(self, cache: Optional[Dict] = None) -> None:
    """`cache`: compiled programs by (fn, argument shapes), shared between variants that run
    one program on other data (the foreground sweep)."""
    start = time.perf_counter()
    key = (self.fn, str(jax.tree_util.tree_map(lambda a: (a.shape, a.dtype), self.args)))
    if cache is not None and key in cache:
      self.compiled = cache[key]
    else:
      self.compiled = jax.jit(self.fn).lower(*self.args).compile()
      if cache is not None:
        cache[key] = self.compiled
    flops = xla_flops(self.compiled)
    self.stats = {"flops": flops, "flops_static": flops,
                  "memory_bytes": xla_memory_bytes(self.compiled),
                  "control_flow": control_flow(self.compiled),
                  "compile_seconds": time.perf_counter() - start}
    if "conditional" in self.stats["control_flow"] and self.control:
      start = time.perf_counter()
      constants = {i: self.args[i] for i in self.control}
      dynamic = [a for i, a in enumerate(self.args) if i not in constants]

      def folded(*dynamic_args):
        it = iter(dynamic_args)
        return self.fn(*[constants[i] if i in constants else next(it)
                         for i in range(len(self.args))])
      taken = jax.jit(folded).lower(*dynamic).compile()
      self.stats["flops"] = xla_flops(taken)
      self.stats["control_flow"] = control_flow(taken)  # What is left unresolved.
      self.stats["control_flow_resolved"] = True
      self.stats["compile_seconds"] += time.perf_counter() - start

  def __call__(self):
    return jax.block_until_ready(self.compiled(*self.args))


def measure(variants: Dict[str, Variant], repeats: int,
            peak: Optional[float]) -> Dict[str, Dict[str, Any]]:
  """Compiles every variant, then times them interleaved; per variant a JSON-able dict of time,
  throughput, FLOPs, memory and MFU (`peak`: TFLOP/s, None for no MFU)."""
  cache = {}
  for v in variants.values():
    v.compile(cache)
  for v in variants.values():  # Warm-up: first-run allocations, thread pools.
    v()
    v.stats["device_peak_bytes_so_far"] = device_peak_bytes()
  best = interleaved_minima(variants, repeats)
  out = {}
  for name, v in variants.items():
    t, flops = best[name], v.stats["flops"]
    out[name] = {
        "seconds": t,
        "images_per_second": v.batch / t,
        "gflops_per_image": flops / v.batch / 1e9 if flops else None,
        "memory_mib": v.stats["memory_bytes"] / 2**20 if v.stats["memory_bytes"] else None,
        "device_peak_mib_so_far": (v.stats["device_peak_bytes_so_far"] / 2**20
                                   if v.stats["device_peak_bytes_so_far"] else None),
        "tflops_per_second": flops / t / 1e12 if flops else None,
        "mfu": flops / t / (peak * 1e12) if flops and peak else None,
        "gflops_per_image_static": (v.stats["flops_static"] / v.batch / 1e9
                                    if v.stats["flops_static"] else None),
        "control_flow": v.stats["control_flow"],
        "compile_seconds": v.stats["compile_seconds"],
    }
  return out


def flag_control_flow(section: str, measured: Dict[str, Dict[str, Any]], notes: List[str]):
  """Appends to `notes` which of `measured` have XLA FLOPs that are not the executed ones."""
  flagged = {n: m["control_flow"] for n, m in measured.items() if m["control_flow"]}
  if flagged:
    notes.append(f"{section}: XLA FLOPs of {flagged} are not the executed ones (a loop body "
                 "counts once, a conditional its costliest branch).")
