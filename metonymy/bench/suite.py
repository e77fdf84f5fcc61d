"""The whole cost picture in one run: throughput, XLA-counted FLOPs and peak memory.

  python -m metonymy.bench suite                     # vit_s16, 4 blocks, batch 4 @ 224 px (CPU)
  python -m metonymy.bench suite --quick             # tiny model, seconds (the tests' preset)
  python -m metonymy.bench suite --model vit_b16 --depth 12 --batch-size 1 \
      --dtype bfloat16 --attention-impl cudnn        # paper Table S5 setting, on a GPU
  python -m metonymy.bench suite --sections two_stage,attention --json /tmp/suite.json

Sections (`--sections`, all by default), each measured where it is defined:
  early      plain vs early-masked forward for several K    early_masking.plain_vs_early
  two_stage  single- vs two-stage, paper Table S5           two_stage.table_s5
  vit        the Flax ViT vs its PyTorch (timm) reference   vit.from_options
  data       the training input pipeline                    pipeline.throughput
  attention  dense vs sorted vs tiled early-masked attention early_masking.attention_scaling

How times, FLOPs and memory are taken: bench/cost.py. The options: bench/options.py. The printed
tables: bench/tables.py.
"""

import dataclasses
import time
from typing import Any, Dict, List, Optional

import jax

from metonymy.bench import cost
from metonymy.bench import early_masking
from metonymy.bench import pipeline
from metonymy.bench import two_stage
from metonymy.bench import vit as vit_bench
from metonymy.bench.options import SECTIONS, Options


def run(options: Optional[Options] = None) -> Dict[str, Any]:
  """Runs the selected sections in SECTIONS order; returns a JSON-able dict: the options, the
  device, notes, and one entry per section that ran (`tables.format_tables` prints it)."""
  options = options or Options()
  device = jax.devices()[0]
  peak = cost.peak_tflops(device.device_kind, options.peak_tflops)
  notes: List[str] = []
  if options.attention_impl == "cudnn":
    notes.append("FLOPs: XLA's cost analysis may not count the fused cuDNN attention (a custom "
                 "call), so FLOPs and MFU can be low; --attention-impl xla counts every product.")
  if peak is None:
    notes.append(f"MFU: no peak FLOP/s known for {device.device_kind!r}; pass --peak-tflops.")
  results: Dict[str, Any] = {
      "options": dataclasses.asdict(options), "device": str(device),
      "device_kind": device.device_kind, "jax": jax.__version__, "peak_tflops": peak,
      "notes": notes}
  sections = {"early": lambda: early_masking.plain_vs_early(options, peak),
              "two_stage": lambda: two_stage.table_s5(options, peak, notes),
              "vit": lambda: vit_bench.from_options(options, notes),
              "data": lambda: pipeline.throughput(options),
              "attention": lambda: early_masking.attention_scaling(options, peak, notes)}
  for name in SECTIONS:
    if name in options.sections:
      start = time.perf_counter()
      results[name] = sections[name]()
      results[name]["wall_seconds"] = time.perf_counter() - start
  return results
