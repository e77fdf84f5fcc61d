"""results.json, report.md and the PNGs of a probe run.

results.json:
  top level: the first backbone of the run (its name in `backbone`), averaged over seeds:
    ps_late, ps_early, ps_gap, causal_leakage_late, causal_leakage_early, map_matrix_late,
    map_matrix_early (and the other metrics when defined: mppo_*, nmi_*, ari_*, auroc_matrix_*;
    nmi_position / ari_position: the position baseline at the test keypoints, the chance row);
  backbones: {name: {"mean": {...}, "std": {...}, "num_seeds": n, "seeds": [per-seed results,
    each with `<metric>_ci` = [low, high] bootstrap intervals over test images]}};
  skipped: {name: reason} for suite backbones that did not run.
"""

import math
import os
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np

from metonymy import reporting
from metonymy.evaluation import bootstrap as bootstrap_lib
from metonymy.evaluation import part_names as part_names_lib
from metonymy.probe import plots
from metonymy.workdir import Workdir
from metonymy.workdir import layout

# Per-seed keys that are numbers (or nested lists of numbers) and are averaged over seeds.
_NON_METRIC = {"backbone", "seed", "dataset", "num_parts", "part_names", "groups", "num_examples",
               "maskings", "probes", "assignment", "assignment_source", "tau", "keypoint_groups",
               "bootstrap", "mppo_attributes", "num_train", "num_val", "num_test",
               "attribute_part", "position_baseline"}
TOP_LEVEL = ("ps_late", "ps_early", "ps_gap", "causal_leakage_late", "causal_leakage_early",
             "map_matrix_late", "map_matrix_early", "auroc_matrix_late", "auroc_matrix_early",
             "mppo_late", "mppo_early", "mppo_per_attribute_late", "mppo_per_attribute_early",
             "nmi_with_background", "ari_with_background", "nmi_foreground", "ari_foreground",
             "nmi_position", "ari_position",
             "ps_per_group_late", "ps_per_group_early", "contingency")


def _to_array(x):
  if x is None:
    return np.nan
  if isinstance(x, list):
    return np.asarray([_to_array(v) for v in x], np.float64)
  return float(x)


def _to_json(x):
  a = np.asarray(x, np.float64)
  if a.ndim == 0:
    return float(a) if math.isfinite(float(a)) else None
  return [_to_json(v) for v in a]


def aggregate(per_seed: Sequence[Mapping]) -> Dict:
  """Mean and std over seeds of every metric the seeds share (NaN-skipping)."""
  keys = [k for k in per_seed[0] if k not in _NON_METRIC and not k.endswith("_ci")
          and all(k in r for r in per_seed)]
  mean, std = {}, {}
  for k in keys:
    try:
      values = [_to_array(r[k]) for r in per_seed]
      stats = bootstrap_lib.over_seeds(values)
    except (TypeError, ValueError):
      continue  # not numeric, or shapes differ across seeds
    mean[k], std[k] = _to_json(stats["mean"]), _to_json(stats["std"])
  return {"mean": mean, "std": std, "num_seeds": len(per_seed)}


def build_results(config, backbones: Mapping[str, List[Dict]], skipped: Mapping[str, str]) -> Dict:
  """The results.json object (see the module docstring)."""
  out = {"job": "probe", "dataset": config.data.dataset, "seeds": list(config.seeds),
         "masks": config.masks.to_dict(), "backbones": {}, "skipped": dict(skipped)}
  for name, per_seed in backbones.items():
    summary = aggregate(per_seed)
    summary["seeds"] = list(per_seed)
    out["backbones"][name] = summary
  if backbones:
    first = next(iter(backbones))
    out["backbone"] = first
    mean = out["backbones"][first]["mean"]
    for key in TOP_LEVEL:
      if key in mean:
        out[key] = mean[key]
        if out["backbones"][first]["num_seeds"] > 1:
          out[f"{key}_seed_std"] = out["backbones"][first]["std"][key]
    if out["backbones"][first]["num_seeds"] == 1:
      for key in TOP_LEVEL:
        ci = backbones[first][0].get(f"{key}_ci")
        if ci is not None:
          out[f"{key}_ci"] = ci
  return out


def _arch(vit_info: Optional[Dict]) -> str:
  if not vit_info:
    return ""
  size = {192: "Ti", 384: "S", 768: "B", 1024: "L", 1280: "H"}.get(vit_info["width"],
                                                                   f"w{vit_info['width']}")
  return f"ViT {size}-{vit_info['patch_size']} (depth {vit_info['depth']})"


def _cell(summary: Dict, key: str, digits: int = 3) -> str:
  """'mean ± std (n)' over seeds, or 'value [low, high]' (bootstrap) for one seed."""
  mean = summary["mean"].get(key)
  if mean is None or isinstance(mean, list):
    return "n/a"
  if summary["num_seeds"] > 1:
    std = summary["std"].get(key)
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if std is not None else f"{mean:.{digits}f}"
  ci = summary["seeds"][0].get(f"{key}_ci") or [None, None]
  return bootstrap_lib.format_ci(mean, *(np.nan if v is None else v for v in ci), digits=digits)


def _matrix_md(matrix, row_names, col_names, digits=3) -> str:
  m = _to_array(matrix)
  rows = [[row_names[i]] + [("n/a" if not np.isfinite(v) else f"{v:.{digits}f}") for v in m[i]]
          for i in range(m.shape[0])]
  return reporting.markdown_table([""] + list(col_names), rows)


def write(workdir: str, config, results: Dict, visuals: Mapping[str, Dict],
          arch: Mapping[str, Dict]) -> List[str]:
  """Writes results.json, report.md and the PNGs; returns the files written."""
  written = []
  files = Workdir(workdir)
  path = os.fspath(layout.write_json(files.results_file, reporting.sanitize(results)))
  written.append(path)

  dataset = results["dataset"]
  seeds = results["seeds"]
  lines = [f"# Intra-object leakage benchmark: {config.report.title or dataset}", ""]
  lines += [f"Dataset `{dataset}`, part masks `{config.masks.source}` (partial patches: "
            f"`{config.masks.patch_rule}`), seeds {seeds}. Late masking = mask-weighted mean of "
            f"the final patch tokens; early masking = the part's "
            f"{'CLS' if config.features.prefix == 'cls' else 'CLS/register mean'} under the "
            "block-masked forward. Intervals: 95% percentile bootstrap over test images (one "
            "seed) or mean ± std over seeds.", ""]
  if results["skipped"]:
    lines += ["Not run: " + "; ".join(f"`{k}` ({v})" for k, v in results["skipped"].items()), ""]

  backbones = results["backbones"]
  has_mppo = any("mppo_late" in b["mean"] or "mppo_early" in b["mean"] for b in backbones.values())
  # Table 1 layout: backbone x (late, early).
  header = ["Method", "Arch", "PS late", "PS early", "PS gap (early - late)",
            "Causal leakage late", "Causal leakage early"]
  if has_mppo:
    header += ["MPPO late", "MPPO early"]
  rows = []
  for name, b in backbones.items():
    row = [name, _arch(arch.get(name)), _cell(b, "ps_late"), _cell(b, "ps_early"),
           _cell(b, "ps_gap"), _cell(b, "causal_leakage_late", 4),
           _cell(b, "causal_leakage_early", 4)]
    if has_mppo:
      row += [_cell(b, "mppo_late"), _cell(b, "mppo_early")]
    rows.append(row)
  lines += ["## Part specificity and causal leakage (Table 1 layout)", "",
            reporting.markdown_table(header, rows), ""]
  table1 = os.fspath(files.output("table1.png"))
  plots.table_figure(table1, header, rows, f"PS and causal leakage on {dataset}")
  lines += ["![table 1](table1.png)", ""]
  written.append(table1)

  # Table 2 layout: MPPO per attribute (per group when there are many), rows backbone x masking.
  if has_mppo:
    first = next(iter(backbones.values()))
    attributes = list(first["seeds"][0].get("mppo_attributes", []))
    groups = first["seeds"][0]["groups"]
    by_group = len(attributes) > 16
    columns = groups if by_group else attributes
    header2 = ["Method", "Masking"] + list(columns) + ["Average"]
    rows2 = []
    for name, b in backbones.items():
      for masking in ("late", "early"):
        per = b["mean"].get(f"mppo_per_attribute_{masking}")
        if per is None:
          continue
        values = _to_array(per)
        if by_group:
          part = np.asarray(b["seeds"][0]["attribute_part"])
          with np.errstate(invalid="ignore"):
            values = np.array([np.nanmean(values[part == g]) if np.isfinite(values[part == g]).any()
                               else np.nan for g in range(len(groups))])
        rows2.append([name, masking] + ["n/a" if not np.isfinite(v) else f"{v:.2f}" for v in values]
                     + [_cell(b, f"mppo_{masking}", 2)])
    note = (" (mean MPPO_a over each group's attributes)" if by_group else "")
    lines += [f"## Most predictive part overlap (Table 2 layout){note}", "",
              reporting.markdown_table(header2, rows2), ""]
    table2 = os.fspath(files.output("table2.png"))
    plots.table_figure(table2, header2, rows2, f"MPPO on {dataset}")
    lines += ["![table 2](table2.png)", ""]
    written.append(table2)

  for name, b in backbones.items():
    seed0 = b["seeds"][0]
    part_names, groups = seed0["part_names"], seed0["groups"]
    labels = part_labels(seed0, b["mean"].get("contingency"))  # the matrices' and figures' rows
    slug = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
    lines += [f"## {name}", ""]
    decays = "; ".join(f"{m}: {seed0['probes'][m]['weight_decay']}" for m in seed0["maskings"])
    lines += [f"Train {seed0['num_train']} / val {seed0['num_val']} / test {seed0['num_test']} "
              f"examples; K = {seed0['num_parts']} parts; tau = {seed0['tau']:g}. Weight decay "
              f"chosen per part: {decays}.", ""]
    if labels != list(part_names):
      lines += ["Discovered parts have no names of their own: part 1..K, with \"≈ g\" the "
                "keypoint group with the largest share of its visible keypoints inside the part "
                "(the largest entry of the part's contingency row, mean over seeds), not a "
                "ground-truth label: " + "; ".join(x for x in labels if "≈" in x) + ".", ""]
    ps_rows = []
    for g, group in enumerate(groups):
      matched = [part_names[k] for k in range(len(part_names)) if seed0["assignment"][k][g]]
      ps_rows.append([group, ", ".join(matched) or "none", seed0["assignment_source"][g]]
                     + [_fmt(b["mean"].get(f"ps_per_group_{m}"), g) for m in ("late", "early")])
    lines += ["Per-group PS (K_g^+ from the contingency with c > tau, or manual):", "",
              reporting.markdown_table(["Group", "K_g^+", "from", "PS_g late", "PS_g early"],
                                       ps_rows), ""]
    terms = [[m, _cell(b, f"map_matched_{m}"), _cell(b, f"map_other_{m}"), _cell(b, f"ps_{m}")]
             for m in seed0["maskings"] if f"map_matched_{m}" in b["mean"]]
    if terms:
      lines += ["The two terms of eq. 1, averaged over the groups with a defined PS_g (leakage "
                "raises the mAP of the other parts):", "",
                reporting.markdown_table(
                    ["Masking", "mAP, matched parts", "mAP, other parts", "PS"], terms), ""]
    if "nmi_with_background" in b["mean"] or "nmi_foreground" in b["mean"]:
      fit = seed0.get("position_baseline")
      position = [[f"chance: keypoint position alone (k-means, {fit['num_clusters']} clusters, "
                   f"on the {fit['num_points']} visible training keypoints; no image)",
                   _cell(b, "nmi_position", 2), _cell(b, "ari_position", 2)]
                  ] if fit and "nmi_position" in b["mean"] else []
      # Both variants side by side: a collapse onto the background gives 0 with the background
      # while the foreground-only argmax may still partition the object.
      lines += ["NMI / ARI (x100) at the visible keypoints against their groups. With background: "
                "the part under the keypoint by argmax over the K parts and the background; "
                "foreground only (MPAE): the argmax over the K foreground maps (soft maps), or the "
                "keypoints on the background dropped (hard part labels).", "",
                reporting.markdown_table(["", "NMI", "ARI"], [
                    ["with background", _cell(b, "nmi_with_background", 2),
                     _cell(b, "ari_with_background", 2)],
                    ["foreground only", _cell(b, "nmi_foreground", 2),
                     _cell(b, "ari_foreground", 2)]] + position), ""]
    for m in seed0["maskings"]:
      if f"map_matrix_{m}" in b["mean"]:
        lines += [f"mAP matrix, {m} masking (rows: parts, columns: groups):", "",
                  _matrix_md(b["mean"][f"map_matrix_{m}"], labels, groups), ""]
    if b["mean"].get("contingency") is not None:
      png = os.fspath(files.output(f"contingency_{slug}.png"))
      plots.contingency_heatmap(png, b["mean"]["contingency"], labels,
                                seed0["keypoint_groups"], _kp_assignment(seed0), seed0["tau"])
      lines += [f"![contingency]({os.path.basename(png)})", ""]
      written.append(png)
    matrices = {m: b["mean"][f"map_matrix_{m}"] for m in seed0["maskings"]
                if f"map_matrix_{m}" in b["mean"]}
    png = os.fspath(files.output(f"map_matrices_{slug}.png"))
    plots.map_matrices(png, matrices, labels, groups, seed0["assignment"],
                       f"{name}: attribute mAP per part and group")
    written.append(png)
    png2 = os.fspath(files.output(f"ps_scatter_{slug}.png"))
    plots.ps_scatter(png2, matrices, seed0["assignment"], groups, f"{name} (Fig. S6 layout)")
    written.append(png2)
    lines += [f"![mAP matrices]({os.path.basename(png)})", "",
              f"![PS scatter]({os.path.basename(png2)})", ""]
    vis = visuals.get(name, {})
    png3 = os.fspath(files.output(f"overlays_{slug}.png"))
    if plots.part_overlays(png3, vis, seed0["num_parts"], arch.get(name, {}).get("patch_size", 1),
                           labels, f"{name}: test images, part maps, patch grid"):
      lines += [f"![overlays]({os.path.basename(png3)})", ""]
      written.append(png3)
  report = os.fspath(files.report_file)
  with open(report, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  written.append(report)
  return written


def part_labels(seed0: Mapping, contingency=None) -> List[str]:
  """The row names of a backbone's part x group matrices and figures: the mask source's names,
  except that discovered parts (default names "part 1".."part K") carry their best-matching
  keypoint group where `contingency` ([K + 1, G] over seed0's keypoint groups) is known:
  "part 3 (≈ wing)" (metonymy.evaluation.part_names)."""
  names = list(seed0["part_names"])
  if contingency is None or not part_names_lib.is_discovered(names):
    return names
  return part_names_lib.matched_names(names, _to_array(contingency), seed0["keypoint_groups"])


def _fmt(values, i, digits=3):
  if values is None or values[i] is None:
    return "n/a"
  return f"{values[i]:.{digits}f}"


def _kp_assignment(seed0) -> Optional[np.ndarray]:
  """The assignment restricted to the keypoint groups (the contingency's columns)."""
  groups, kp = seed0["groups"], seed0["keypoint_groups"]
  a = np.asarray(seed0["assignment"], bool)
  cols = [groups.index(g) if g in groups else None for g in kp]
  out = np.zeros((a.shape[0], len(kp)), bool)
  for j, c in enumerate(cols):
    if c is not None:
      out[:, j] = a[:, c]
  return out
