"""The probe job: `python -m metonymy.main --config=configs/probe_<dataset>.py --workdir=DIR`.

For every backbone (`config.backbone`, or the suite `config.backbones` = {name: backbone()}) and
every seed in `config.seeds`, runs `benchmark.evaluate`, then writes results.json, report.md and
the figures (report.py) into the workdir.

Seeds: a random-init backbone is initialised with the seed (so seeds are different backbones), and
optionally pretrained for `backbone_pretraining.steps` (by the caller's `prepare_backbone`:
runs/probe.py, training/pretraining.py); a checkpoint is loaded once
and the seed only changes the val carve-out and the bootstrap draws.
Suite backbones without a checkpoint are skipped (and listed in the report) unless
`allow_random_backbone` is set.
"""

import os
import time
from typing import Callable, Dict, List, Optional, Tuple

from absl import logging

from metonymy import console
from metonymy import loading
from metonymy.probe import benchmark
from metonymy.probe import report
from metonymy.workdir import Workdir
from metonymy.workdir import writers


def backbone_entries(config) -> List[Tuple[str, object]]:
  """[(name, backbone config)] of a single-backbone or suite config."""
  if "backbones" in config:
    return list(config.backbones.items())
  name = config.get("backbone_name", "") or _default_name(config.backbone)
  return [(name, config.backbone)]


def _default_name(backbone_cfg) -> str:
  if backbone_cfg.checkpoint:
    return os.path.basename(os.path.normpath(backbone_cfg.checkpoint))
  return f"{backbone_cfg.preset}-random"


def run(config, workdir, prepare_backbone: Optional[Callable] = None) -> Dict:
  """The benchmark of every backbone and seed. `prepare_backbone(model, params, vit_config,
  seed) -> params` readies a random-init backbone (runs/probe.py passes the pretraining that
  `backbone_pretraining.steps > 0` asks for); None: used as initialised."""
  start = time.perf_counter()
  cache_root = config.features.cache_dir or os.fspath(Workdir(workdir).feature_cache)
  suite = "backbones" in config
  per_backbone, visuals, arch, skipped = {}, {}, {}, {}
  inputs = with_paths_resolved(config, workdir)  # What it reads; the reports keep `config`.
  for name, backbone_cfg in backbone_entries(inputs):
    if not backbone_cfg.checkpoint and not config.allow_random_backbone:
      reason = ("no checkpoint: pass --config.backbone" + (f"s.{name}" if suite else "")
                + ".checkpoint=PATH (or set allow_random_backbone=True)")
      if not suite:
        raise ValueError(f"backbone {name!r} has {reason}")
      logging.warning("skipping backbone %s: %s", name, reason)
      skipped[name] = "no checkpoint given"
      continue
    per_seed = []
    loaded = None
    for seed in config.seeds:
      if backbone_cfg.checkpoint and "backbone_pretraining" in config and int(
          config.backbone_pretraining.steps) > 0:
        raise ValueError("backbone_pretraining.steps > 0 trains random-init backbones only; "
                         f"backbone {name!r} loads {backbone_cfg.checkpoint}")
      if backbone_cfg.checkpoint:
        # The seed does not change a checkpoint: load it once.
        loaded = loaded or loading.build_backbone(backbone_cfg, seed)
        model, params, vit_config = loaded
      else:
        model, params, vit_config = loading.build_backbone(backbone_cfg, seed)
        if prepare_backbone is not None:
          params = prepare_backbone(model, params, vit_config, int(seed))
      console.console(f"[probe] {name} seed {seed}: {vit_config.depth} blocks, width "
                      f"{vit_config.width}, patch {vit_config.patch_size}, {config.data.dataset} "
                      f"at {config.data.image_size or vit_config.image_size} px")
      results, vis = benchmark.evaluate(name, model, params, vit_config,
                                        _with_backbone_maskings(inputs, backbone_cfg),
                                        seed=int(seed), cache_root=cache_root)
      per_seed.append(results)
      visuals.setdefault(name, vis["leakage_examples"])
      arch[name] = {"width": vit_config.width, "patch_size": vit_config.patch_size,
                    "depth": vit_config.depth}
      console.console(f"[probe] {name} seed {seed}: PS late {_f(results.get('ps_late'))}, early "
                      f"{_f(results.get('ps_early'))}; causal leakage late "
                      f"{_f(results.get('causal_leakage_late'), 4)}, early "
                      f"{_f(results.get('causal_leakage_early'), 4)}")
    per_backbone[name] = per_seed
  if not per_backbone:
    raise ValueError(f"no backbone could run: {skipped}")
  results = report.build_results(config, per_backbone, skipped)
  results["seconds"] = time.perf_counter() - start
  written = report.write(workdir, config, results, visuals, arch)
  _write_tensorboard(workdir, config, results, written)
  console.console(f"[probe] wrote {len(written)} files to {workdir} in "
                  f"{results['seconds']:.0f} s: {', '.join(os.path.basename(p) for p in written)}")
  return results


# The headline numbers of every backbone, as TensorBoard scalars (tag "<backbone>/<key>").
TENSORBOARD_KEYS = ("ps_late", "ps_early", "ps_gap", "causal_leakage_late",
                    "causal_leakage_early", "mppo_late", "mppo_early")


def _write_tensorboard(workdir: str, config, results: Dict, written) -> None:
  """WORKDIR/tensorboard: the config as text, each backbone's PS / MPPO / causal leakage (mean
  over seeds) as scalars at step 0, and the report's figures as images."""
  writer = writers.MetricWriter(workdir)
  try:
    writer.write_config_to_tensorboard(config)
    for name, backbone in results["backbones"].items():
      scalars = {f"{name}/{k}": v for k, v in backbone["mean"].items()
                 if k in TENSORBOARD_KEYS and v is not None}
      if scalars:
        writer.write_scalars(0, scalars)
    for path in written:
      if path.endswith(".png"):
        writer.write_figure(0, f"figures/{os.path.basename(path)[:-4]}", path)
  finally:
    writer.close()


def with_paths_resolved(config, workdir: str):
  """A copy of `config` whose backbone checkpoints and masks.path are the paths they name:
  a sub-run records those of its own job's tree relative to its workdir ("workdir:../train",
  layout.record_path), read here against where that workdir is now; any other path as given."""
  config, files = config.copy_and_resolve_references(), Workdir(workdir)
  blocks = [config.backbone] if "backbone" in config else []
  blocks += list((config.get("backbones") or {}).values())
  for block in blocks:
    if block.get("checkpoint"):
      block.checkpoint = files.resolve(block.checkpoint)
  if config.get("masks") and config.masks.get("path"):
    config.masks.path = files.resolve(config.masks.path)
  return config


def _with_backbone_maskings(config, backbone_cfg):
  """`config` with features.maskings cut to the backbone's own `maskings`, when it lists them
  (a suite's SAM entry: late only, it has no aggregation token for early masking)."""
  if "maskings" not in backbone_cfg:
    return config
  maskings = tuple(m for m in config.features.maskings if m in tuple(backbone_cfg.maskings))
  if not maskings:
    raise ValueError(f"features.maskings {tuple(config.features.maskings)} and the backbone's "
                     f"maskings {tuple(backbone_cfg.maskings)} have nothing in common")
  config = config.copy_and_resolve_references()
  config.features.maskings = maskings
  return config


def _f(value, digits: int = 3) -> str:
  return "n/a" if value is None else f"{value:.{digits}f}"
