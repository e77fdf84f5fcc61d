"""The text tables of `bench suite`: one block per section of `suite.run`'s results, under a
header naming the device, dtype and how times were taken. `python -m metonymy.bench suite` prints
them and, with `--readme PATH`, writes them into the bench:suite block of PATH
(docs/benchmarks.md). (The `vit` and `two_stage` commands format their own results, in
bench/vit.py and bench/two_stage.py.)"""

from typing import Any, Dict, List, Optional

from metonymy.bench import vit as vit_bench
from metonymy.bench.early_masking import ATTENTION_VARIANTS


def _f(value, spec: str = ".2f", width: int = 0) -> str:
  if value is not None and spec == "gflops":
    spec = ".3f" if abs(value) >= 0.01 else ".2e"
  text = "n/a" if value is None else format(value, spec)
  return text.rjust(width) if width else text


def _mib(m: Dict[str, Any]) -> Optional[float]:
  return m.get("memory_mib")  # The allocator's process peak (GPUs) is in the JSON.


TWO_STAGE_ROWS = (("single", "Single-Stage"), ("hard", "Two-Stage hard"),
                  ("ste", "Two-Stage STE"), ("hard_drop_bg", "Two-Stage hard, bg dropped"),
                  ("ste_drop_bg", "Two-Stage STE, bg dropped"))


def format_two_stage(r: Dict[str, Any]) -> List[str]:
  v, goal = r["variants"], r["goal_inference_ratio"]
  lines = [f"Table S5 (inference): {r['model']} ({r['depth']} blocks), batch {r['batch_size']} @ "
           f"{r['image_size']}px, K={r['num_parts']}, synthetic-world part maps "
           f"(foreground {100 * r['synthetic_foreground_fraction']:.0f}% of patches)",
           f"{'variant':28s} {'img/s':>9s} {'GFLOPs/img':>11s} {'MiB':>9s} {'x single':>9s} "
           f"{'FLOPs x':>8s} {'MFU':>7s}"]
  for key, label in TWO_STAGE_ROWS:
    m = v.get(f"{key}/inference")
    if m is None:  # A mask left out by --two-stage-masks.
      continue
    lines.append(f"{label:28s} {_f(m['images_per_second'], '.2f', 9)} "
                 f"{_f(m['gflops_per_image'], 'gflops', 11)} {_f(_mib(m), '.1f', 9)} "
                 f"{_f(m['time_ratio_to_single'], '.2f', 9)} "
                 f"{_f(m['flops_ratio_to_single'], '.2f', 8)} {_f(m['mfu'], '.1%', 7)}")
  checks = [f"{label} {v[f'{key}/inference']['time_ratio_to_single']:.2f}"
            f" {'ok' if v[f'{key}/inference']['time_ratio_to_single'] <= goal else 'MISSED'}"
            for key, label in TWO_STAGE_ROWS[1:] if f"{key}/inference" in v]
  lines.append(f"goal two-stage/single <= {goal} at inference: " + "; ".join(checks))
  if "single/train_step" in v:
    lines += ["", "Training step (forward + backward):",
              f"{'variant':28s} {'s/step':>9s} {'img/s':>9s} {'GFLOPs/img':>11s} {'MiB':>9s} "
              f"{'x single':>9s} {'MFU':>7s}"]
    for key, label in TWO_STAGE_ROWS[:3]:
      m = v.get(f"{key}/train_step")
      if m is None:
        continue
      lines.append(f"{label:28s} {_f(m['seconds'], '.4f', 9)} {_f(m['images_per_second'], '.2f', 9)} "
                   f"{_f(m['gflops_per_image'], 'gflops', 11)} {_f(_mib(m), '.1f', 9)} "
                   f"{_f(m['time_ratio_to_single'], '.2f', 9)} {_f(m['mfu'], '.1%', 7)}")
  per_flop = r.get("ms_per_gflop") or {}
  if "vit/forward" in per_flop:
    forward = per_flop["vit/forward"]
    labels = [("vit/forward", "plain ViT forward"),
              ("vit/train_step", "plain ViT forward + backward"),
              ("vit_early/train_step", "early-masked ViT forward + backward (Stage 2 alone)")]
    labels += [(f"{key}/train_step", f"{label} training step") for key, label in TWO_STAGE_ROWS[:3]]
    lines += ["", "Time per XLA GFLOP (ms), and x the plain forward's (what costs more than its "
              "FLOPs):"]
    lines += [f"  {label:52s} {per_flop[key]:8.3f} {per_flop[key] / forward:6.2f}x"
              for key, label in labels if key in per_flop]
  if r["foreground_sweep"]:
    dense = v.get("hard/inference") or v["ste/inference"]
    lines += ["", f"Background dropped vs foreground fraction (synthetic layouts; dense two-stage "
              f"= {dense['time_ratio_to_single']:.2f}x single time, "
              f"{_f(dense['flops_ratio_to_single'])}x FLOPs):",
              f"{'fg':>5s} {'fg patches':>11s} {'hard x single':>14s} {'STE x single':>13s} "
              f"{'FLOPs x single':>15s} {'x dense':>8s}"]
    for row in r["foreground_sweep"]:
      hard, ste = row.get("hard_drop_bg"), row.get("ste_drop_bg")
      either = hard or ste
      lines.append(f"{row['fraction']:5.2f} {row['foreground_patches']:5d}/{row['patches']:<5d} "
                   f"{_f(hard and hard['time_ratio_to_single'], '.2f', 14)} "
                   f"{_f(ste and ste['time_ratio_to_single'], '.2f', 13)} "
                   f"{_f(either['flops_ratio_to_single'], '.2f', 15)} "
                   f"{_f(either['seconds'] / dense['seconds'], '.2f', 8)}")
  return lines


def format_early(r: Dict[str, Any]) -> List[str]:
  p = r["variants"]["plain"]
  lines = [f"Plain vs early-masked forward: {r['model']} ({r['depth']} blocks), batch "
           f"{r['batch_size']} @ {r['image_size']}px; plain {p['images_per_second']:.2f} img/s, "
           f"{_f(p['gflops_per_image'], 'gflops')} GFLOPs/img, {_f(_mib(p), '.1f')} MiB, "
           f"MFU {_f(p['mfu'], '.1%')}",
           f"{'K':>3s} {'L plain->early':>15s} {'img/s':>9s} {'GFLOPs/img':>11s} {'MiB':>8s} "
           f"{'t(e)/t(p)':>10s} {'goal <=':>8s} {'':6s} {'FLOPs(e)/(p)':>12s}"]
  for row in r["rows"]:
    m = r["variants"][f"early_K{row['num_parts']}"]
    lines.append(f"{row['num_parts']:3d} {row['length_plain']:>7d}->{row['length_early']:<6d} "
                 f"{_f(m['images_per_second'], '.2f', 9)} {_f(m['gflops_per_image'], 'gflops', 11)} "
                 f"{_f(_mib(m), '.1f', 8)} {row['time_ratio']:10.3f} {row['goal']:8.3f} "
                 f"{'ok' if row['meets_goal'] else 'MISSED':6s} {_f(row['flops_ratio'], '.3f', 12)}")
  return lines


def format_attention(r: Dict[str, Any]) -> List[str]:
  labels = [l for l in ATTENTION_VARIANTS if l in r["rows"][0]]
  lines = [f"Early-masked attention vs K and resolution: {r['model']} ({r['depth']} blocks), "
           f"batch {r['batch_size']}, uniform random groups, tiles of "
           f"{r['attention_tiles'] or 'n/a'} queries; img/s, GFLOPs/img and MiB of "
           + "/".join(labels) + "; tiled speed-up and FLOPs vs dense and vs sorted",
           f"{'K':>3s} {'px':>5s} {'N':>5s} {'L':>5s} {'img/s':>23s} {'GFLOPs/img':>23s} {'MiB':>23s} "
           f"{'speed-up d/s':>13s} {'FLOPs d/s':>10s}"]
  for row in r["rows"]:
    join = lambda key, spec: "/".join(_f(row[l][key], spec) for l in labels)
    pair = lambda key: "/".join(_f(row.get(f"tiled_{key}_vs_{ref}"), ".2f")
                                for ref in ("dense", "sorted"))
    lines.append(f"{row['num_parts']:3d} {row['image_size']:5d} {row['patches']:5d} {row['early']:5d} "
                 f"{join('images_per_second', '.1f'):>23s} {join('gflops_per_image', '.3g'):>23s} "
                 f"{join('memory_mib', '.0f'):>23s} {pair('speedup'):>13s} {pair('flops'):>10s}")
  return lines


def format_data(r: Dict[str, Any]) -> List[str]:
  return [f"Data: train pipeline (Grain, synthetic world @ {r['image_size']}px, standard train "
          f"augmentations, batch {r['batch_size']}, {r['read_threads']} read thread(s), "
          f"{r['worker_count']} workers): {r['pipeline_examples_per_second']:.1f} examples/s; "
          f"rendering alone {r['render_examples_per_second_one_core']:.1f} examples/s per core"]


def format_tables(results: Dict[str, Any]) -> str:
  """All of `suite.run`'s results as text: the header, then one block per section that ran."""
  o = results["options"]
  lines = [f"metonymy bench suite on {results['device']} ({results['device_kind']}), jax "
           f"{results['jax']}, {o['dtype']}, attention {o['attention_impl'] or 'xla'}, peak "
           f"{_f(results['peak_tflops'], '.0f')} TFLOP/s; times: min over {o['repeats']} "
           f"interleaved repeats; MiB: XLA buffers (args + outputs + temps)"]
  for name, formatter in (("two_stage", format_two_stage), ("early", format_early),
                          ("attention", format_attention), ("data", format_data)):
    if name in results:
      lines += [""] + formatter(results[name])
  if "vit" in results:
    lines += ["", "Flax vs PyTorch (bench/vit.py):", vit_bench.format_table(results["vit"])]
  if results["notes"]:
    lines += ["", "Notes:"] + [f"  - {n}" for n in results["notes"]]
  return "\n".join(lines)
