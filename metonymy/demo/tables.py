"""The demo's numbers as tables and sentences: its markdown tables, the paragraph that describes
a run's setup, and the collapse warnings. One place, so report.md, README's block and the
console show the same numbers the same way."""

from typing import Dict, List, Optional

from metonymy import reporting
from metonymy.runs import references


def results_tables(results: Dict) -> List[str]:
  """The headline tables (markdown lines), shared by report.md and README: leakage, part
  discovery, the stand-in's quality and the priors' costs, with blank lines between."""
  b, pd = results["benchmark"], results["part_discovery"]
  leak = reporting.markdown_table(
      ["Masking", "PS (higher = part-specific)", "Causal leakage (0 = none)", "MPPO"], [
      ["late (pool a plain forward in the part mask)", reporting.with_ci(b, "ps_late"),
       reporting.with_ci(b, "causal_leakage_late", 4), reporting.with_ci(b, "mppo_late")],
      ["early (block-masked forward)", reporting.with_ci(b, "ps_early"),
       reporting.with_ci(b, "causal_leakage_early", 4), reporting.with_ci(b, "mppo_early")]])
  rows = []
  for name, key, heads in (("single-stage", "single", ("stage1",)),
                           ("two-stage STE", "two_stage_ste", ("stage1", "stage2", "ensemble"))):
    r = pd[key]
    label = {"stage1": "Stage 1 head", "stage2": "Stage 2 head (isolated parts)",
             "ensemble": "ensemble (sum of logits)"}
    for i, h in enumerate(heads):
      parts = ([reporting.fmt(r[k], 1) for k in ("NMI", "ARI", "NMI_fg", "ARI_fg")]
               + [reporting.fmt(r.get("max_part_share"), 2),
                  f"{reporting.fmt(r.get('background_share'), 2)} "
                  f"({reporting.fmt(r.get('background_share_true'), 2)})"]
               if i == 0 else ["", "", "", "", "", ""])
      rows.append([name, label[h], reporting.fmt(r["mAP"].get(h))] + parts)
  chance = pd.get("chance_mAP")
  rows.append(["constant predictor", "(chance level)", reporting.fmt(chance), "0", "0", "0", "0",
               "", ""])
  rows += position_rows(pd)
  discovery = reporting.markdown_table(
      ["Model", "Attribute head", "mAP", "NMI", "ARI", "NMI fg", "ARI fg", "largest part share",
       "background share (truth)"],
      rows)
  quality = (results["backbone"].get("quality_val") or {})
  rows = []
  if "cls/mAP" in quality:  # A supervised stand-in's own heads.
    rows += [["attribute mAP of its CLS head", reporting.fmt(quality.get("cls/mAP")),
              reporting.fmt(quality.get("chance/mAP"))],
             ["attribute mAP of its part read-out head", reporting.fmt(quality.get("parts/mAP")),
              reporting.fmt(quality.get("chance/mAP"))]]
  if "cls_probe/mAP" in quality:
    rows.append(["attribute mAP of linear probes on its frozen CLS token",
                 reporting.fmt(quality["cls_probe/mAP"]),
                 reporting.fmt(quality["cls_probe/chance"])])
  if "part_probe/balanced_accuracy" in quality:
    rows += [["a patch token's part, logistic probe (balanced accuracy)",
              reporting.fmt(quality["part_probe/balanced_accuracy"]),
              reporting.fmt(quality["part_probe/chance"])],
             ["k-means on the last block's foreground tokens vs the true parts (NMI x100)",
              reporting.fmt(quality["kmeans_fg/NMI"], 1),
              f"{reporting.fmt(quality.get('position_fg/NMI'), 1)} (k-means on the patch position)"
              if "position_fg/NMI" in quality else "0"]]
  stand_in = reporting.markdown_table(["Stand-in backbone, on `val`", "value", "chance level"],
                   rows) if quality else ""
  return [leak, "", discovery, "", stand_in, "", priors_table(pd.get("priors"))]


def position_rows(part_discovery: Dict) -> List[List[str]]:
  """The discovery table's chance rows for NMI / ARI: where a keypoint lies, without the image
  (k-means on the training keypoints, the runs' `eval/parts/position_*`). One row when both runs
  measured the same (same training keypoints, K and seed), one per run otherwise; none in a
  results.json that predates it."""
  measured = [(name, part_discovery[key].get("position_baseline"))
              for key, name in (("single", "single-stage"), ("two_stage_ste", "two-stage STE"))
              if part_discovery.get(key, {}).get("position_baseline")]
  if len({tuple(sorted(p.items())) for _, p in measured}) > 1:
    shown = [(f" (K of {name})", p) for name, p in measured]
  else:
    shown = [("", p) for _, p in measured[:1]]
  return [["chance: keypoint position alone" + suffix,
           "(k-means on the training keypoints; no image)", "",
           *(reporting.fmt(p[k], 1) for k in ("NMI", "ARI", "NMI_fg", "ARI_fg")), "", ""]
          for suffix, p in shown]


def priors_table(priors: Optional[Dict[str, Dict]]) -> str:
  """What the part-shaping priors charge (unweighted; lower is preferred) the ground-truth parts
  on the patch grid and each model's maps at its last training step (a model trained without
  the priors logs none: no row)."""
  if not priors:
    return ""
  rows = [[label, *(reporting.fmt(priors[key].get(name)) for name in references.MAP_PRIORS)]
          for key, label in (("truth", "ground-truth parts on the patch grid (one-hot)"),
                             ("single", "single-stage maps, last training batch"),
                             ("two_stage_ste", "two-stage STE maps, last training batch"))
          if key in priors and any(v is not None for v in priors[key].values())]
  return reporting.markdown_table(
      ["Part-shaping priors (unweighted, lower = preferred)", "total variation",
       "foreground presence", "background presence", "entropy"], rows)


def describe(results: Dict) -> str:
  """One paragraph: the world, the backbone, the benchmark and training sizes, the machine."""
  w, pd = results["world"], results["part_discovery"]
  b = results["benchmark"]
  pre = results["backbone"]["pretraining_steps"]
  arch = results["backbone"]["arch"] or {}
  source = results["backbone"].get("source")
  learned = ("self-supervised on the world's images, no labels"
             if results["backbone"].get("pretraining_objective") == "self_supervised"
             else "on the world's attributes")
  start = results["backbone"].get("pretraining_start")
  if start:  # A stand-in continued from another (stand_in_objective=attributes_then_dense).
    weight = results["backbone"].get("attribute_weight")
    term = ("its attribute term" if weight in (None, 1.0)
            else f"its attribute term at {weight:g} of the dense term's weight")
    learned = (f"with the dense self-supervised term beside {term}, continuing "
               f"{start} (pretrained on the world's attributes)")
  registers = int(arch.get("num_registers") or 0)
  backbone = (f"a ViT (patch {arch.get('patch_size')}, width {arch.get('width')}, depth "
              f"{arch.get('depth')}{f', {registers} register tokens' if registers else ''}) "
              f"pretrained for {pre} steps {learned}"
              f"{' (' + source + ')' if source else ''}" if pre is not None
              else f"the backbone `{results['backbone']['path']}`")
  return (f"Synthetic parts world (world seed {w.get('seed', 0)}; run seed "
          f"{results.get('seed', 0)}) at {w['image_size']} px, "
          f"cross-part correlation {w['correlation']:g}; {backbone}. Benchmark: ground-truth "
          f"part masks, train/val/test "
          f"{b.get('num_train')}/{b.get('num_val')}/{b.get('num_test')} images, 95% bootstrap "
          f"intervals over test images. Part discovery: {pd['train_steps']['single']} "
          f"(single-stage) and {pd['train_steps']['two_stage_ste']} (two-stage STE) training "
          f"steps, from one Stage-1 initialisation (Stage 2's ViT moved by "
          f"{reporting.fmt(pd['two_stage_ste'].get('stage2_vit_relative_change'), 4)} of its "
          f"norm), "
          f"evaluated on the {reporting.fmt_int(pd['single'].get('num_examples'))} first "
          f"`{pd['eval_split']}` images (NMI/ARI x100, keypoints vs argmax part; \"fg\": argmax "
          f"over the foreground parts only; largest part share: the biggest share of the "
          f"evaluation patches any part, background included, takes). "
          + reporting.wall_time_text(f"{results['seconds']['total']:.0f} s",
                                        results['seconds']['total'], results['machine']) + ".")


def collapse_warnings(results: Dict) -> List[str]:
  """One line per part-discovery model whose evaluation flagged a collapse."""
  lines = []
  for key, name in (("single", "single-stage"), ("two_stage_ste", "two-stage STE")):
    r = results["part_discovery"][key]
    if r.get("collapsed"):
      shares = r.get("part_share") or []
      lines.append(f"**Collapse** ({name}): a part holds "
                   f"{reporting.fmt(r.get('max_part_share'))} of "
                   f"the evaluation patches or a part is empty "
                   f"({reporting.fmt_int(r.get('empty_parts'))} empty); shares (background last): "
                   f"{', '.join(reporting.fmt(v, 2) for v in shares)}.")
  return lines


def summary_line(results: Dict) -> str:
  """The console's one-line summary of a story run."""
  s = results["summary"]
  return ("[demo] PS late {} / early {}; causal leakage late {} / early {}; mAP single {} / "
          "two-stage stage 2 {} / ensemble {}; NMI single {} / two-stage {} (keypoint position "
          "alone {})").format(
              reporting.fmt(s["ps_late"]), reporting.fmt(s["ps_early"]),
              reporting.fmt(s["causal_leakage_late"], 4),
              reporting.fmt(s["causal_leakage_early"], 4), reporting.fmt(s["map_single"]),
              reporting.fmt(s["map_two_stage_stage2"]), reporting.fmt(s["map_two_stage_ensemble"]),
              reporting.fmt(s["nmi_single"], 1), reporting.fmt(s["nmi_two_stage"], 1),
              reporting.fmt(s.get("nmi_position"), 1))
