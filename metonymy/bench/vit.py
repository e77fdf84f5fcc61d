"""Backbone throughput: the Flax ViT next to its PyTorch reference, plain and early-masked.

  python -m metonymy.bench vit --model vit_b16 --batch-size 8 --image-size 224 --num-parts 8

Both sides compute the same function: the PyTorch reference is a timm model with random weights,
imported into Flax through `metonymy.converters` (and the outputs are compared before timing).
Times are minima over interleaved repetitions in one process, so the ratios are measured under
the same machine load. The early-masked reference runs timm's blocks on the `[prefix copies,
patches]` sequence with the same block mask. `from_options` is the `bench suite` section "vit".
"""

import dataclasses
import os
import tempfile
from typing import Dict, List, Optional

import jax
import jax.numpy as jnp
import numpy as np

from metonymy import converters
from metonymy.bench import cost
from metonymy.bench.options import Options, patch_grid, sequence_lengths, vit_config
from metonymy.models import attention_masks
from metonymy.models import vit

# Our preset -> the timm architecture that is its PyTorch reference.
TIMM_REFERENCES = {
    "vit_b16": "vit_base_patch16_224.dino",
    "vit_s16": "vit_small_patch16_224.dino",
    "vit_b14_reg4": "vit_base_patch14_reg4_dinov2",
    "vit_b16_dinov3": "vit_base_patch16_dinov3",
}


@dataclasses.dataclass
class Timing:
  seconds: float  # best seconds per batch over the repetitions
  images_per_second: float


def _timm_reference(model_name: str, image_size: int, depth: Optional[int]):
  import timm
  import torch
  kwargs = {"depth": depth} if depth else {}
  model = timm.create_model(TIMM_REFERENCES[model_name], pretrained=False, img_size=image_size,
                            **kwargs).eval()
  generator = torch.Generator().manual_seed(0)
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.02 * torch.randn(p.shape, generator=generator))
  return model


def _torch_early_forward(model, num_parts: int):
  import torch

  def forward(x, float_mask):
    tokens = model._pos_embed(model.patch_embed(x))
    num_prefix = model.num_prefix_tokens
    prefix, patches = tokens[:, :num_prefix], tokens[:, num_prefix:]
    h = torch.cat([prefix.repeat(1, num_parts + 1, 1), patches], 1)
    rope = model.rope.get_embed(shape=model.patch_embed.grid_size) if hasattr(model, "rope") else None
    for block in model.blocks:
      h = block(h, rope=rope, attn_mask=float_mask) if rope is not None else block(h, attn_mask=float_mask)
    return model.norm(h)
  return forward


def run(model_name: str = "vit_b16", batch_size: int = 8, image_size: int = 224,
        num_parts: int = 8, repeats: int = 5, depth: Optional[int] = None,
        with_torch: bool = True, threads: Optional[int] = None) -> Dict[str, object]:
  """Measures img/s of plain and early-masked forwards; returns a JSON-able dict."""
  results: Dict[str, object] = {"model": model_name, "batch_size": batch_size,
                                "image_size": image_size, "num_parts": num_parts,
                                "device": str(jax.devices()[0]), "jax": jax.__version__}
  rng = np.random.default_rng(0)
  images = rng.normal(size=(batch_size, image_size, image_size, 3)).astype(np.float32)
  torch_model = None
  if with_torch:
    try:
      import torch
    except ImportError:
      with_torch = False
      results["torch"] = "not installed"
  if with_torch:
    if threads:
      torch.set_num_threads(threads)
    results["torch"] = torch.__version__
    results["torch_threads"] = torch.get_num_threads()
    torch_model = _timm_reference(model_name, image_size, depth)
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, "model.safetensors")
      from safetensors.torch import save_file
      save_file({k: v.contiguous() for k, v in torch_model.state_dict().items()}, path)
      model, params = converters.load_backbone(path)
  else:
    model, params = vit.init_params(vit_config(model_name, image_size, depth))
  config = model.config
  results["depth"] = config.depth
  part_ids = rng.integers(0, num_parts + 1, size=(batch_size,) + patch_grid(config, image_size))
  lengths = sequence_lengths(config, image_size, num_parts)
  plain_len, early_len = lengths["plain"], lengths["early"]
  results["sequence_length"] = {"plain": plain_len, "early": early_len}

  x = jnp.asarray(images)
  ids = jnp.asarray(part_ids)
  plain = jax.jit(lambda p, x: model.apply({"params": p}, x)["patch_tokens"])
  early = jax.jit(lambda p, x, i: model.apply({"params": p}, x, part_ids=i,
                                               num_parts=num_parts)["part_tokens"])
  fns = {
      "flax_plain": lambda: jax.block_until_ready(plain(params, x)),
      "flax_early": lambda: jax.block_until_ready(early(params, x, ids)),
  }
  if torch_model is not None:
    import torch
    x_torch = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()
    groups = np.asarray(attention_masks.early_masking_group_ids(ids.reshape(batch_size, -1),
                                                                num_parts, config.num_prefix))
    float_mask = torch.from_numpy(np.where(groups[:, None, :, None] == groups[:, None, None, :],
                                           0.0, -np.inf).astype(np.float32))
    early_torch = _torch_early_forward(torch_model, num_parts)
    with torch.no_grad():
      reference = torch_model.forward_features(x_torch).numpy()
    got = np.concatenate([np.asarray(model.apply({"params": params}, x)[k])
                          for k in ("prefix_tokens", "patch_tokens")], 1)
    results["max_rel_diff_vs_torch"] = float(np.abs(got - reference).max() / np.abs(reference).max())

    def torch_plain():
      with torch.inference_mode():
        torch_model.forward_features(x_torch)

    def torch_early():
      with torch.inference_mode():
        early_torch(x_torch, float_mask)
    fns["torch_plain"] = torch_plain
    fns["torch_early"] = torch_early
  for fn in fns.values():  # Compile / warm up.
    fn()
  timings = {name: Timing(s, batch_size / s)
             for name, s in cost.interleaved_minima(fns, repeats).items()}
  results["timings"] = {k: dataclasses.asdict(v) for k, v in timings.items()}
  ratios = {"early_over_plain_time_flax": timings["flax_early"].seconds / timings["flax_plain"].seconds,
            "length_ratio": early_len / plain_len}
  ratios["early_overhead_vs_length"] = ratios["early_over_plain_time_flax"] / ratios["length_ratio"]
  if "torch_plain" in timings:
    ratios["flax_over_torch_throughput_plain"] = (timings["flax_plain"].images_per_second /
                                                  timings["torch_plain"].images_per_second)
    ratios["flax_over_torch_throughput_early"] = (timings["flax_early"].images_per_second /
                                                  timings["torch_early"].images_per_second)
  results["ratios"] = ratios
  return results


def from_options(options: Options, notes: List[str]) -> Dict[str, object]:
  """`run` on the suite's model, batch and image size with K = `options.vit_parts`; PyTorch only
  where timm and torch import and know the model (else a note says why not)."""
  with_torch = options.torch
  if with_torch:
    try:
      import timm  # noqa: F401
      import torch  # noqa: F401
    except ImportError as e:
      with_torch = False
      notes.append(f"vit: PyTorch reference skipped ({e}).")
  if with_torch and options.model not in TIMM_REFERENCES:
    with_torch = False
    notes.append(f"vit: no timm reference for {options.model} "
                 f"(known: {sorted(TIMM_REFERENCES)}); Flax only.")
  if options.dtype != "float32" or options.attention_impl:
    notes.append("vit: bench/vit.py compares float32 with XLA attention on both sides, whatever "
                 "--dtype / --attention-impl say.")
  return run(options.model, options.batch_size, options.image_size, options.vit_parts,
             max(options.repeats, 1), options.depth, with_torch, options.threads)


def format_table(results: Dict[str, object]) -> str:
  lines = [f"{results['model']} ({results['depth']} blocks) batch {results['batch_size']} @ {results['image_size']}px, "
           f"K={results['num_parts']} (L plain {results['sequence_length']['plain']}, "
           f"early {results['sequence_length']['early']}) on {results['device']}"]
  lines.append(f"{'variant':14s} {'s/batch':>9s} {'img/s':>9s}")
  for name, t in results["timings"].items():
    lines.append(f"{name:14s} {t['seconds']:9.4f} {t['images_per_second']:9.2f}")
  for name, value in results["ratios"].items():
    lines.append(f"{name:34s} {value:.3f}")
  goals = []
  r = results["ratios"]
  if "flax_over_torch_throughput_plain" in r:
    goals.append(f"Flax/PyTorch throughput >= 1.0: plain {r['flax_over_torch_throughput_plain']:.2f}, "
                 f"early {r['flax_over_torch_throughput_early']:.2f}")
  goals.append(f"time(early)/time(plain) <= 1.05 x L_early/L_plain: "
               f"{r['early_over_plain_time_flax']:.3f} vs {1.05 * r['length_ratio']:.3f}")
  lines.extend(goals)
  return "\n".join(lines)


def markdown_rows(results: Dict[str, object]) -> str:
  """One markdown table row per run, for the bench:vit block of docs/benchmarks.md."""
  t, r = results["timings"], results["ratios"]
  torch_plain = t.get("torch_plain", {}).get("images_per_second", float("nan"))
  torch_early = t.get("torch_early", {}).get("images_per_second", float("nan"))
  name = results["model"] + (f" ({results['depth']} blocks)" if results.get("depth") else "")
  return (f"| {name} | {results['batch_size']} | {results['image_size']} | "
          f"{results['num_parts']} | {results['sequence_length']['plain']} -> "
          f"{results['sequence_length']['early']} | {t['flax_plain']['images_per_second']:.2f} | "
          f"{torch_plain:.2f} | {r.get('flax_over_torch_throughput_plain', float('nan')):.2f} | "
          f"{t['flax_early']['images_per_second']:.2f} | {torch_early:.2f} | "
          f"{r['early_over_plain_time_flax']:.3f} (goal <= {1.05 * r['length_ratio']:.3f}) |")


MARKDOWN_HEADER = (
    "| model | batch | px | K | tokens plain -> early | Flax img/s | PyTorch img/s | Flax/PyTorch "
    "| Flax early img/s | PyTorch early img/s | Flax t(early)/t(plain) |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|")
