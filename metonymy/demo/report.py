"""A story run's files: DIR/results.json (every number, machine-readable) and DIR/report.md
(the tables, the per-group mAP matrices, and links to the figures the sub-jobs drew)."""

import glob
import os
from typing import Dict, List

from metonymy import reporting
from metonymy.demo import tables
from metonymy.runs import subjobs
from metonymy.workdir import layout
from metonymy.workdir import Workdir


def write_story(files: Workdir, results: Dict) -> List[str]:
  """DIR/results.json and DIR/report.md; returns their paths."""
  path_json = os.fspath(layout.write_json(files.results_file, reporting.sanitize(results)))
  b = results["benchmark"]
  shown = tables.results_tables(results)
  lines = ["# metonymy demo: intra-object leakage on the synthetic parts world", "",
           tables.describe(results), "",
           "## 1. Leakage of the pretrained backbone (late vs early masking)", "",
           "PS = how much better a part's feature predicts its own part's attributes than the "
           "other parts' (paper eq. 1); MPPO = how often the most predictive part of an attribute "
           "is its own (eq. 2). Causal leakage = relative change of part k's feature when "
           "every pixel outside part k is replaced by another image's. At correlation 0 any "
           "cross-part predictability is leakage.", "",
           shown[0], ""]
  parts, groups = b.get("part_names"), b.get("groups")
  for m in ("late", "early"):
    matrix = b.get(f"map_matrix_{m}")
    if matrix is not None and parts and groups:
      rows = [[parts[i]] + [reporting.fmt(v) for v in matrix[i]] for i in range(len(matrix))]
      lines += [f"Attribute mAP, {m} masking (rows: part features, columns: attribute groups):",
                "", reporting.markdown_table([""] + list(groups), rows), ""]
  lines += ["Full benchmark report: [benchmark/report.md](benchmark/report.md).", "",
            "## 2. Part discovery from the same backbone", "",
            "Single-stage: Stage 1 on the frozen backbone. Two-stage STE: Stage 1's maps drive "
            "Stage 2's isolated part streams (hard forward, soft backward); its Stage 2 head sees "
            "each part's pixels only.", "",
            shown[2], ""] + [w + "\n" for w in tables.collapse_warnings(results)]
  lines += ["## The stand-in backbone", "", shown[4], ""]
  priors = results["part_discovery"].get("priors")
  if priors:
    trained = any(v is not None for key in ("single", "two_stage_ste")
                  for v in priors.get(key, {}).values())
    lines += ["## What the part-shaping priors charge", "",
              "PDiscoFormer's priors (unweighted) on the true parts and on the maps Stage 1 "
              "found: when the truth costs more than the found maps, the priors pull Stage 1 "
              "away from the real parts." + ("" if trained else " This run trained with the "
              "attribute losses alone (every prior at weight 0), so only the truth's costs are "
              "shown: what the priors would charge the real parts."), "",
              shown[6], ""]
  lines += ["## Figures", ""] + _figures(files)
  lines += ["## Timing", "",
            reporting.markdown_table(["step", "seconds"],
                       [[k, f"{v:.0f}"] for k, v in results["seconds"].items()]),
            ""]
  path_md = os.fspath(layout.write_text(files.report_file, "\n".join(lines) + "\n"))
  return [path_json, path_md]


def _figures(files: Workdir) -> List[str]:
  """Markdown image lines for the PNGs the sub-jobs wrote (paths relative to the workdir)."""
  lines = []
  workdir, bench = files.path, files.sub(subjobs.BENCHMARK_DIR).path
  for pattern, caption in (("table1.png", "PS and causal leakage"),
                           ("map_matrices_*.png",
                            "attribute mAP per part (rows) and group, late vs early"),
                           ("ps_scatter_*.png", "matched vs unmatched mAP (Fig. S6 layout)"),
                           ("overlays_*.png", "test images with their ground-truth part maps")):
    for path in sorted(glob.glob(os.path.join(bench, pattern))):
      lines += [f"![{caption}]({os.path.relpath(path, workdir)})", ""]
  for key, sub in subjobs.TRAIN_DIRS.items():
    images = files.sub(sub).images
    found = sorted(glob.glob(os.path.join(images, "eval_part_maps_*.png")))
    if found:
      lines += [f"Discovered part maps, {key.replace('_', '-')} (rows: the images, the argmax "
                "discovered part with its legend, the ground-truth keypoints):", "",
                f"![{key} part maps]({os.path.relpath(found[-1], workdir)})", ""]
  return lines
