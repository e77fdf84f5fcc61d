"""What the Table-3 job writes: results.json, report.md, fig4_part_maps.png and README's
"table3:results" block. It formats what the job computed: every number comes from the rows the
runs wrote (variants.row), the figure from the arrays of part_maps.compute."""

import math
import os
from typing import Dict, List, Optional

import matplotlib
from matplotlib import patches
import numpy as np

from metonymy import config_lib
from metonymy import reporting
from metonymy.evaluation import part_names as part_names_lib
from metonymy.probe import plots
from metonymy.workdir import layout
from metonymy.workdir import Workdir

TABLE3_VARIANTS = ("single", "hard", "ste", "soft")  # configs/synthetic_table3.py's VARIANTS
README_BLOCK = "table3:results"  # world seed 0's block; readme_block_name gives the others'


def readme_block_name(world_seed: int) -> str:
  """README's block for a world seed's table: "table3:results" for world seed 0, then
  "table3:results:world1", ..., so that each world's job rewrites its own table only."""
  return README_BLOCK if int(world_seed) == 0 else f"{README_BLOCK}:world{int(world_seed)}"


FIGURE = "fig4_part_maps.png"
NAMES = {"single": ("Single-stage", "–"), "hard": ("Two-stage", "Hard masks"),
         "ste": ("Two-stage", "STE masks"), "soft": ("Two-stage", "Soft masks"),
         "hard_none": ("Two-stage", "Hard masks, no gradient to Stage 1")}
# Table 3's columns, then Table S6's (attribute mAP of each head), then the collapse watch.
COLUMNS = (("ARI", "ARI", 1), ("NMI", "NMI", 1), ("PS", "PS", 3), ("MPPO", "MPPO", 3),
           ("mAP_stage1", "mAP Stage 1", 3), ("mAP_stage2", "mAP Stage 2", 3),
           ("mAP_ensemble", "mAP ensemble", 3), ("max_part_share", "largest part share", 2),
           ("background_share", "background share", 2))
LABELS = {"single": "single-stage", "hard": "hard", "ste": "STE", "soft": "soft",
          "hard_none": "hard, no gradient"}
PAIRED = (("NMI", 1), ("ARI", 1), ("NMI_fg", 1), ("ARI_fg", 1), ("PS", 3), ("MPPO", 3),
          ("mAP_stage1", 3))


def label(variant: str) -> str:
  return LABELS.get(variant, variant)


def _mean_sd(cell: Dict, digits: int) -> str:
  if cell["mean"] is None:
    return "n/a"
  sd = "" if cell["sd"] is None else f" ± {reporting.fmt(cell['sd'], digits)}"
  return reporting.fmt(cell["mean"], digits) + sd


def _interval(cell: Dict, digits: int) -> str:
  if cell["mean"] is None:
    return "n/a"
  shown = f"{cell['mean']:+.{digits}f}"
  if cell["ci"] is not None:
    lo, hi = cell["ci"]
    shown += f" [{lo:+.{digits}f}, {hi:+.{digits}f}]"
  excludes_zero = cell["ci"] is not None and (cell["ci"][0] > 0 or cell["ci"][1] < 0)
  return f"**{shown}**" if excludes_zero else shown


def row_line(row: Dict) -> str:
  """One console line per finished run."""
  fmt = reporting.fmt
  return (f"[table3] {row['variant']} seed {row['seed']}: NMI {fmt(row['NMI'], 1)}, ARI "
          f"{fmt(row['ARI'], 1)}, PS {fmt(row['PS'], 3)}, MPPO {fmt(row['MPPO'], 3)}, mAP stage 1 "
          f"{fmt(row['mAP_stage1'], 3)} / stage 2 {fmt(row['mAP_stage2'], 3)}, largest part share "
          f"{fmt(row['max_part_share'], 2)}, background share "
          f"{fmt(row.get('background_share'), 2)} (truth "
          f"{fmt(row.get('background_share_true'), 2)}; the object's share in it "
          f"{fmt(row.get('object_in_background'), 2)}), coverage {fmt(row.get('coverage'), 2)} "
          f"(area ratio "
          f"{fmt(row.get('area_ratio'), 2)}), position baseline NMI "
          f"{fmt(row.get('position_NMI'), 1)}{' COLLAPSED' if row['collapsed'] else ''}")


def table3(results: Dict) -> str:
  """Table 3's layout (mean ± sd over run seeds) with Table S6's mAP columns and the chance row."""
  header = ["Setting", "Method"] + [name for _, name, _ in COLUMNS]
  rows = []
  for variant, cells in results["summary"].items():
    setting, method = NAMES.get(variant, (variant, ""))
    # A results.json written before a column existed has no cell for it.
    rows.append([setting, method] + [_mean_sd(cells[key], d) if key in cells else "n/a"
                                     for key, _, d in COLUMNS])
  chance = ["constant predictor", "(chance level)", "0", "0", "0"] + [""] * (len(COLUMNS) - 3)
  chance[COLUMNS.index(("mAP_stage1", "mAP Stage 1", 3)) + 2] = reporting.fmt(
      results["chance_mAP"], 3)
  rows.append(chance)
  position = results.get("position_baseline")
  if position:
    row = ["chance: keypoint position alone", position_method(position)] + [""] * len(COLUMNS)
    row[2 + COLUMNS.index(("ARI", "ARI", 1))] = _mean_sd(position["ARI"], 1)
    row[2 + COLUMNS.index(("NMI", "NMI", 1))] = _mean_sd(position["NMI"], 1)
    rows.append(row)
  return reporting.markdown_table(header, rows)


def position_method(position: Dict) -> str:
  """The position row's second cell: what it is, and whether every variant of a seed agreed."""
  seeds = position["NMI"]["n"]
  agreed = ("the same for every variant of a seed" if position["equal_across_variants"] else
            "**differs across the variants of a seed**: " + "; ".join(position["unequal"]))
  return (f"(chance level: k-means on the training keypoints, no image; mean over {seeds} "
          f"run seed{'s' if seeds != 1 else ''}, {agreed})")


def paired_table(results: Dict) -> str:
  header = ["Two-stage variant − single-stage"] + [f"Δ {m}" for m, _ in PAIRED]
  rows = [[label(v) + f" (seeds {', '.join(map(str, cells['seeds']))})"]
          + [_interval(cells[m], d) for m, d in PAIRED]
          for v, cells in results["paired"].items()]
  return reporting.markdown_table(header, rows)


def _true_parts(results: Dict) -> List[str]:
  """The true parts the rows carry coverage for (results.json's `true_parts`, else numbered)."""
  rows = [r for r in results["rows"] if "coverage" in r]
  if not rows:
    return []
  count = sum(1 for k in rows[0] if k.startswith("coverage/"))
  names = list(results.get("true_parts") or [])
  return names if len(names) == count else [f"true part {g + 1}" for g in range(count)]


def coverage_tables(results: Dict) -> str:
  """Mask coverage (Fig. 4) per variant, mean ± sd over run seeds, per true part and the mean
  over the parts, then two-stage minus single-stage paired by seed; "" when no row has it."""
  parts = _true_parts(results)
  if not parts:
    return ""
  blocks = []
  for name, title in (("coverage", "Coverage"), ("area_ratio", "Area ratio")):
    keys = [name] + [f"{name}/{g}" for g in range(len(parts))]
    header = ["Variant", f"{title}, mean over the parts"] + parts
    rows = [[label(v)] + [_mean_sd(cells[k], 2) if k in cells else "n/a" for k in keys]
            for v, cells in results["summary"].items()]
    paired = [[label(v) + f" (seeds {', '.join(map(str, cells['seeds']))})"]
              + [_interval(cells[k], 2) if k in cells else "n/a" for k in keys]
              for v, cells in results["paired"].items()]
    blocks += [reporting.markdown_table(header, rows),
               f"{title}, two-stage variant − single-stage (paired by seed, 95% t interval; bold "
               f"where it excludes 0):",
               reporting.markdown_table(
                   ["Two-stage variant − single-stage", f"Δ {title.lower()}, mean"]
                   + [f"Δ {p}" for p in parts], paired)]
  return "\n\n".join(blocks)


def _by_variant(rows: List[Dict]) -> Dict[str, List[Dict]]:
  out: Dict[str, List[Dict]] = {}
  for r in rows:
    out.setdefault(r["variant"], []).append(r)
  return out


def _mean(values) -> float:
  xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
  return float(np.mean(xs)) if xs else float("nan")


def stage2_table(results: Dict) -> str:
  """Does Stage 2 train? Its ViT's relative weight change over the run, and its mAP at step 0
  against the end (means over run seeds)."""
  header = ["Variant", "Stage-2 ViT relative change", "Stage-2 mAP at step 0",
            "Stage-2 mAP at the end", "Stage-1 mAP at step 0", "Stage-1 mAP at the end"]
  rows = []
  for variant, rs in _by_variant(results["rows"]).items():
    if variant == "single":
      continue
    rows.append([label(variant),
                 reporting.fmt(_mean(r["relative_change"].get("backbone") for r in rs), 4),
                 reporting.fmt(_mean(r["mAP_stage2_start"] for r in rs), 3),
                 reporting.fmt(_mean(r["mAP_stage2"] for r in rs), 3),
                 reporting.fmt(_mean(r["mAP_stage1_start"] for r in rs), 3),
                 reporting.fmt(_mean(r["mAP_stage1"] for r in rs), 3)])
  return reporting.markdown_table(header, rows)


def mechanism_table(results: Dict) -> str:
  """The gradient norm each weighted loss term sends to Stage 1's prototypes, at step 0 and at
  the end of each variant's run (means over run seeds)."""
  terms = sorted({t for r in results["rows"] for t in list(r["grad_norm_start"])
                  + list(r["grad_norm_end"])},
                 key=lambda t: (not t.startswith("attribute"), t))
  header = ["Variant", "when"] + terms
  rows = []
  for variant, rs in _by_variant(results["rows"]).items():
    for when, key in (("step 0", "grad_norm_start"), ("end", "grad_norm_end")):
      rows.append([label(variant), when]
                  + [reporting.fmt(_mean(r[key].get(t) for r in rs), 3) for t in terms])
  return reporting.markdown_table(header, rows)


def seed_table(results: Dict) -> str:
  keys = ("variant", "seed", "world_seed", "NMI", "ARI", "NMI_fg", "ARI_fg", "PS", "MPPO",
          "mAP_stage1", "mAP_stage2", "mAP_ensemble", "max_part_share", "background_share",
          "background_share_true", "object_in_background", "coverage",
          "area_ratio", "position_NMI", "position_ARI", "collapsed")
  digits = {"PS": 3, "MPPO": 3, "mAP_stage1": 3, "mAP_stage2": 3, "mAP_ensemble": 3,
            "max_part_share": 2, "background_share": 2, "background_share_true": 2,
            "object_in_background": 2, "coverage": 2, "area_ratio": 2}
  rows = [[str(r[k]) if k in ("variant", "seed", "world_seed", "collapsed")
           else reporting.fmt(r.get(k), digits.get(k, 1)) for k in keys] for r in results["rows"]]
  return reporting.markdown_table(list(keys), rows)


def _setting(results: Dict) -> str:
  p, b = results["protocol"], results["backbone"]
  rates = ", ".join(f"{g} {v:.2g}" for g, v in p["learning_rates"].items())
  priors = {k: v for k, v in p["loss_weights"].items() if k != "attribute"}
  paper = config_lib.part_losses().weights
  changed = [f"{k.replace('_', ' ')} at {v:g}" for k, v in priors.items() if v != paper.get(k)]
  priors_text = ("every part-shaping prior at PDiscoFormer's weight"
                 + (" but " + ", ".join(changed) if changed else "")
                 if any(priors.values()) and all(priors.values()) else
                 "the attribute losses alone (every prior at weight 0)" if not any(priors.values())
                 else "priors " + ", ".join(f"{k} {v:g}" for k, v in priors.items()))
  return (f"Synthetic parts world (world seed {results['world_seed']}) at {p['image_size']} px, "
          f"cross-part correlation {results['world']['correlation']:g}; stand-in backbone "
          f"{b.get('source') or b['path']}. Each variant trained {p['epochs']} epochs of the "
          f"first {p['train_examples']} `train` images ({p['steps']} steps at batch "
          f"{p['batch_size']}; rates at that batch: {rates}; {p['schedule']}), {priors_text}"
          f"{_feedback_text(p)}{_stage1_text(p)}; "
          f"run seeds {', '.join(map(str, results['seeds']))}, each the same for every variant "
          f"(same Stage-1 initialisation, data order, Gumbel noise). Scored on "
          f"{'all' if not p['eval_examples'] else 'the first ' + str(p['eval_examples'])} "
          f"`{p['eval_split']}` images: NMI/ARI x100 of merged keypoints against the argmax part "
          f"(background included; \"fg\": foreground parts only); PS / MPPO: linear probes on the "
          f"model's own part features over its discovered parts (late masking of the frozen "
          f"backbone for single-stage, early masking of the trained Stage-2 ViT for two-stage). "
          + reporting.wall_time_text(f"{results['seconds'] / 60:.0f} min", results["seconds"],
                                        results["machine"]) + _read_back_text(results) + ".")


def _stage1_changes(protocol: Dict) -> List:
  """[(option, value)] of Stage 1's options that differ from config_lib.stage1_model's defaults
  (a counterfactual's model), so a report and its command say which Stage 1 made it."""
  defaults = config_lib.stage1_model(num_parts=1)
  return [(k, v) for k, v in protocol.get("stage1_options", {}).items()
          if k in defaults and v != defaults[k]]


def _stage1_text(protocol: Dict) -> str:
  changed = [f"{k.replace('_', ' ')} {v}" for k, v in _stage1_changes(protocol)]
  return f", Stage 1 with {', '.join(changed)}" if changed else ""


def _feedback_text(protocol: Dict) -> str:
  """Names a Stage-2 feedback into Stage 1 other than eq. 9's (the counterfactual's scale)."""
  scale = float(protocol.get("stage2_feedback_scale", 1.0))
  if scale == 1:
    return ""
  return (f", Stage 2's gradient into Stage 1 scaled by {scale:g} (a counterfactual: eq. 9 "
          f"weighs it 1)")


def _read_back_text(results: Dict) -> str:
  """Says when the wall time is a rerun's: runs trained by an earlier invocation were read back."""
  read_back = int(results.get("runs_read_back", 0))
  if not read_back:
    return ""
  return (f", this invocation only: {read_back} of {len(results['rows'])} runs were trained by an "
          f"earlier invocation of the job on the same workdir and read back")


def summary_lines(results: Dict) -> List[str]:
  """What the comparison says, from the paired intervals: one line per two-stage variant."""
  lines = []
  for variant, cells in results["paired"].items():
    verdicts = []
    for metric in ("NMI", "ARI", "coverage"):
      if metric not in cells:  # (coverage: only worlds with a part segmentation)
        continue
      digits = 2 if metric == "coverage" else 1
      ci = cells[metric]["ci"]
      if ci is None:
        verdicts.append(f"{metric} {cells[metric]['mean']:+.{digits}f} (one seed, no interval)"
                        if cells[metric]["mean"] is not None else f"{metric} n/a")
      else:
        side = ("above" if ci[0] > 0 else "below" if ci[1] < 0 else "not distinguishable from")
        verdicts.append(f"{metric} {cells[metric]['mean']:+.{digits}f} [{ci[0]:+.{digits}f}, "
                        f"{ci[1]:+.{digits}f}]: {side} single-stage")
    lines.append(f"{label(variant)}: " + "; ".join(verdicts))
  position = results.get("position_baseline")
  if position:
    lines.append(f"position baseline (chance level of NMI / ARI): NMI "
                 f"{reporting.fmt(position['NMI']['mean'], 1)}, ARI "
                 f"{reporting.fmt(position['ARI']['mean'], 1)}; "
                 + ("the same for every variant of a seed" if position["equal_across_variants"]
                    else "DIFFERS across the variants of a seed: "
                    + "; ".join(position["unequal"])))
  truth = [r.get("background_share_true") for r in results["rows"]
           if r.get("background_share_true") is not None]
  if truth:
    lines.append(f"background channel: the true background is "
                 f"{reporting.fmt(np.mean(truth), 2)} of "
                 "the patches (the `background share` column is each variant's channel)")
  collapsed = [f"{r['variant']} seed {r['seed']}" for r in results["rows"] if r["collapsed"]]
  lines.append("collapse watch: " + (", ".join(collapsed) + " collapsed (one part above 90% of "
                                     "the patches or a part empty)" if collapsed else
                                     "no run collapsed (no part above 90% of the patches, none "
                                     "empty)"))
  return lines


def markdown(results: Dict) -> str:
  chance = reporting.fmt(results["chance_mAP"], 3)
  return "\n\n".join([
      f"# Table 3 on the synthetic world (world seed {results['world_seed']})",
      _setting(results),
      "## Single vs two-stage (Table 3, with Table S6's mAP columns)\n\nMean ± sd over run "
      f"seeds. Chance level: mAP {chance} (a constant predictor on the scored images), NMI = "
      "ARI = 0 (one part for every patch), PS = 0 (no part more predictive of its own "
      "attributes than the others); and the NMI / ARI of keypoint position alone (k-means "
      "with K clusters on the training keypoints, scored at the same keypoints as the models' "
      "parts), the level a part model must beat before its parts say more than where a point "
      "lies.",
      table3(results),
      "## Paired by run seed\n\nTwo-stage minus single-stage, mean over seeds with the 95% "
      "Student-t interval; bold where the interval excludes 0.",
      paired_table(results),
      "\n".join(f"- {line}" for line in summary_lines(results)),
      *(["## Mask coverage of the true parts (Fig. 4)\n\nOn the maps' patch grid, for each "
         "true part: its best-matching discovered part (the one holding most of its patches "
         "over the scored images; never the background), the share of the part's patches that "
         "part holds (coverage; a lazy mask that covers a piece of the region scores low) and "
         "all the patches it holds over the part's (area ratio; above 1 it spills beyond the "
         "part). Mean ± sd over run seeds.", coverage_tables(results)]
        if coverage_tables(results) else []),
      "## Does Stage 2 train?\n\nRelative change of Stage 2's ViT weights over the run "
      "(|θ − θ₀| / |θ₀|) and the heads' mAP at step 0 against the end (means over seeds).",
      stage2_table(results),
      "## The mechanism: what reaches Stage 1's prototypes\n\nGradient norm of each weighted "
      f"loss term at Stage 1's prototypes (mean of "
      f"{results['protocol'].get('term_gradient_batches', 'the')} unaugmented training batches, "
      "then over "
      "seeds), at step 0 and at the end. `attribute_stage2` is Stage 2's feedback to Stage 1; "
      "if it is small against the priors, Stage 2 cannot shape the parts.",
      mechanism_table(results),
      "## Every run",
      seed_table(results),
      f"![Part maps of every variant on the same test images]({FIGURE})",
  ]) + "\n"


def config_arg(results: Dict) -> str:
  """The configs/synthetic_table3.py argument that made `results`
  (":world=v3,priors=paper,total_variation=0.25,stand_in_objective=attributes_then_dense"), as
  far as the results tell and whatever the defaults of the day: the world when not v1, the priors
  when every one is on (paper, with total variation's weight) or off, the stand-in's objective
  when recorded, the evaluation split when not test."""
  args = []
  if results.get("world_name", "v1") != "v1":
    args.append(f"world={results['world_name']}")
  p = results["protocol"]
  priors = [v for k, v in p["loss_weights"].items() if k != "attribute"]
  if priors and all(priors):
    args.append("priors=paper")
    if "total_variation" in p["loss_weights"]:  # its weight is the job's to choose
      args.append(f"total_variation={p['loss_weights']['total_variation']:g}")
  elif not any(priors):
    args.append("priors=off")
  if results.get("stand_in_objective"):
    args.append(f"stand_in_objective={results['stand_in_objective']}")
  if p.get("eval_split", "test") != "test":
    args.append(f"split={p['eval_split']}")
  return ":" + ",".join(args) if args else ""


def _variants_arg(results: Dict) -> str:
  """The --config.variants override that made `results`, when not every variant ran."""
  ran = tuple(results["summary"])
  if set(ran) == set(TABLE3_VARIANTS):
    return ""
  return "\"--config.variants=(" + ",".join(f"'{v}'" for v in ran) + ")\" "


def readme_block(results: Dict) -> str:
  feedback = float(results["protocol"].get("stage2_feedback_scale", 1.0))
  return "\n\n".join([
      f"Generated by `python -m metonymy.main --config=configs/synthetic_table3.py"
      f"{config_arg(results)} --workdir=DIR --config.world.seed={results['world_seed']} "
      + _variants_arg(results)
      + (f"--config.stage2_feedback_scale={feedback:g} " if feedback != 1 else "")
      + "".join(f"--config.single.model.{k}={v} " for k, v in _stage1_changes(results["protocol"]))
      +
      f"--config.readme=README.md` on {results['date'][:10]}; do not edit by hand. {_setting(results)}",
      table3(results),
      paired_table(results) + "\n\n" + "\n".join(f"- {line}" for line in summary_lines(results)),
  ])


def part_legend(fig, colours, num_parts: int, true_part_names):
  """The figure's legend: discovered parts "part 1".."part K" (1-based, as the reports,
  TensorBoard and the notebook name them), the true parts numbered the same way."""
  handles = [patches.Rectangle((0, 0), 1, 1, color=colours[k]) for k in range(num_parts)]
  true_names = ", ".join(f"{k + 1} {n}" for k, n in enumerate(true_part_names))
  return fig.legend(handles, part_names_lib.discovered_names(num_parts), loc="lower center",
                    ncol=num_parts, fontsize=8, title_fontsize=8,
                    title=f"discovered parts 1..{num_parts} (ground-truth row: the true parts, "
                          f"{true_names}); background greyed")


def part_map_figure(path: str, maps: Dict) -> None:
  """Fig. 4 from part_maps.compute's arrays: the ground truth and every variant's discovered
  parts on the same images; colours are discovered part indices, not part names (a discovered
  part has no name until it is matched to the truth: "part 1..K")."""
  shown, num_parts = maps["images"], maps["num_parts"]
  num_images = len(shown)
  grey = np.repeat(shown.mean(-1, keepdims=True), 3, -1)
  cmap = matplotlib.colormaps.get_cmap("tab10")
  colours = np.array([cmap(k % 10)[:3] for k in range(num_parts)] + [(0.0, 0.0, 0.0)])
  rows = [("image", None)] + ([("ground truth", maps["truth"])]
                              if maps["truth"] is not None else [])
  rows += [(label(variant), labels) for variant, labels in maps["labels"].items()]
  fig, axes = plots.subplots(len(rows), num_images, figsize=(1.6 * num_images, 1.7 * len(rows)),
                             squeeze=False)
  for r, (title, labels) in enumerate(rows):
    for i in range(num_images):
      ax = axes[r][i]
      if labels is None:
        ax.imshow(shown[i])
      else:
        fg = (labels[i] < num_parts)[..., None]
        ax.imshow(np.where(fg, 0.3 * grey[i] + 0.7 * colours[labels[i]], 0.5 * grey[i]))
      ax.set_xticks([])
      ax.set_yticks([])
    axes[r][0].set_ylabel(title, fontsize=9)
  part_legend(fig, colours, num_parts, maps["true_part_names"])
  fig.suptitle(f"Part maps on the first {num_images} scored images, run seed {maps['seed']}",
               fontsize=10)
  fig.tight_layout(rect=(0, 0.09, 1, 0.97))
  fig.savefig(path, dpi=120)


def write(files: Workdir, results: Dict, maps: Optional[Dict], readme: str = "") -> List[str]:
  """results.json, the figure (from part_maps.compute's `maps`, when there are any), report.md
  and, with `readme`, its block there; returns the paths written."""
  written = [os.fspath(layout.write_json(files.results_file, reporting.sanitize(results)))]
  if maps is not None:
    part_map_figure(os.fspath(files.output(FIGURE)), maps)
    written.append(os.fspath(files.output(FIGURE)))
  written.append(os.fspath(layout.write_text(files.report_file, markdown(results))))
  if readme:
    reporting.write_block(readme, readme_block_name(results["world_seed"]),
                              readme_block(results))
    written.append(readme)
  return written
