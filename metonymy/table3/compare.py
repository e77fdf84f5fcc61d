r"""Counterfactual arms of the Table-3 job against a baseline run, paired by run seed.

  python -m metonymy.table3.compare --baseline=DIR_A --arm=joint=DIR_B --arm=dropout=DIR_C \
      [--variant=single] [--seeds=0,1] [--output=FILE.md]

Each DIR is a finished Table-3 workdir (its results.json and config.json) of the same world,
stand-in and run seeds, run with one override changed (e.g. `--config.single.model.
embedding_norm=joint`); an arm whose world, stand-in or run seeds differ from the baseline's is
refused, since its differences would not be the override's alone; with `--seeds` every run is
read on those run seeds alone (a screen on one seed against a baseline that has run three), and
a run without one of them is refused. The report gives, per arm:
the config keys it changes; the mean over run seeds of NMI / ARI (background included, and
foreground only), Stage-1 attribute mAP, the largest part share, the background channel's share
against the truth's and the share of the true object it takes, coverage and area ratio, the
gradient norm each weighted loss term sends Stage 1's prototypes at the start; how many runs
collapsed; and each metric minus the baseline's, paired by run seed, with its 95% Student-t
interval. The chance rows are the position baseline (k-means on the keypoints' positions) and
the constant predictor's mAP.

A run counts as collapsed when one channel holds more than COLLAPSE_SHARE of the patches, or when
the background channel's share is off the truth's by more than BACKGROUND_TOLERANCE.
"""

import argparse
import json
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

from metonymy import reporting
from metonymy.table3 import stats
from metonymy.workdir import layout

COLLAPSE_SHARE = 0.9
BACKGROUND_TOLERANCE = 0.15
METRICS = ("NMI", "ARI", "NMI_fg", "ARI_fg", "mAP_stage1", "max_part_share", "background_share",
           "object_in_background", "coverage", "area_ratio")
# (metric, header, decimals) of the report's tables.
COLUMNS = (("NMI", "NMI", 1), ("ARI", "ARI", 1), ("NMI_fg", "NMI fg", 1), ("ARI_fg", "ARI fg", 1),
           ("mAP_stage1", "Stage-1 mAP", 3), ("max_part_share", "largest part share", 2),
           ("background_share", "background channel", 2),
           ("object_in_background", "object in the background channel", 2),
           ("coverage", "coverage", 2),
           ("area_ratio", "area ratio", 1))
# What must be equal for a paired difference to be the override's alone.
SHARED = ("world", "stand_in", "seeds")


def collapsed(row: Dict) -> bool:
  truth = row.get("background_share_true")
  off = (truth is not None and row.get("background_share") is not None
         and abs(row["background_share"] - truth) > BACKGROUND_TOLERANCE)
  return bool((row.get("max_part_share") or 0.0) > COLLAPSE_SHARE or off)


def _flatten(tree, prefix="") -> Dict[str, object]:
  if isinstance(tree, dict):
    out = {}
    for key, value in tree.items():
      out.update(_flatten(value, f"{prefix}{key}."))
    return out
  return {prefix[:-1]: tree}


def config_changes(baseline: Dict, arm: Dict) -> List[str]:
  """"key: baseline value -> arm value" for every leaf of the two configs that differs."""
  a, b = _flatten(baseline), _flatten(arm)
  return [f"{key}: {a.get(key, '(absent)')!r} -> {b.get(key, '(absent)')!r}"
          for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)]


def read_run(workdir: str) -> Dict:
  """{"results", "config"} of a finished Table-3 workdir; names the file that is missing."""
  files = layout.Workdir(workdir)
  out = {}
  for name, path in (("results", files.results_file), ("config", files.config_file)):
    if not layout.as_path(path).exists():
      raise FileNotFoundError(f"{os.fspath(path)} not found: {workdir!r} is not a finished "
                              "Table-3 workdir.")
    out[name] = layout.read_json(path)
  if out["results"].get("job") != "table3":
    raise ValueError(f"{workdir}: results.json is job {out['results'].get('job')!r}, not table3.")
  return out


def _shared(run: Dict) -> Dict:
  results = run["results"]
  return {"world": results.get("world"), "stand_in": results.get("backbone", {}).get("source"),
          "seeds": results.get("seeds")}


def compare(baseline: Dict, arms: Sequence[Tuple[str, Dict]], variant: str = "single",
            seeds: Optional[Sequence[int]] = None) -> Dict:
  """The comparison of `arms` [(name, read_run(dir))] against `baseline` (read_run), on the
  rows of `variant`; with `seeds`, on those run seeds' rows alone, which every run must have."""
  base_shared = _shared(baseline)
  shared_keys = [k for k in SHARED if seeds is None or k != "seeds"]
  rows, changes, grads = [], {}, {}
  for name, run in [("baseline", baseline)] + list(arms):
    shared = _shared(run)
    differ = [key for key in shared_keys if shared[key] != base_shared[key]]
    if differ:
      raise ValueError(f"arm {name!r} differs from the baseline in {', '.join(differ)}: its "
                       "differences would not be its override's alone.")
    mine = [dict(r, variant=name) for r in run["results"]["rows"] if r["variant"] == variant]
    if seeds is not None:
      missing = sorted(set(seeds) - {r["seed"] for r in mine})
      if missing:
        raise ValueError(f"arm {name!r} has no {variant!r} row of run seed(s) {missing}.")
      mine = [r for r in mine if r["seed"] in seeds]
    if not mine:
      raise ValueError(f"arm {name!r} has no {variant!r} rows.")
    rows += mine
    # With `seeds` the runs' own seed lists are not what the arm changes.
    unseeded = lambda c: {k: v for k, v in c.items() if seeds is None or k != "seeds"}
    changes[name] = config_changes(unseeded(baseline["config"]), unseeded(run["config"]))
    terms = sorted({t for r in mine for t in (r.get("grad_norm_start") or {})})
    grads[name] = {t: stats.mean_sd([(r.get("grad_norm_start") or {}).get(t) for r in mine])
                   for t in terms}
  for r in rows:
    r["collapsed"] = collapsed(r)
  names = ["baseline"] + [name for name, _ in arms]
  return {
      "variant": variant, "arms": names, "changes": changes,
      "summary": stats.summary(rows, METRICS),
      "paired": stats.paired(rows, baseline="baseline", metrics=METRICS),
      "collapsed": {n: sum(r["collapsed"] for r in rows if r["variant"] == n) for n in names},
      "runs": {n: sum(r["variant"] == n for r in rows) for n in names},
      "background_truth": stats.mean_sd([r.get("background_share_true") for r in rows])["mean"],
      "term_gradients_start": grads,
      "position_baseline": stats.position_baseline(rows),
      "chance_mAP": baseline["results"].get("chance_mAP"),
      "world_seed": baseline["results"].get("world_seed"),
      "stand_in": base_shared["stand_in"],
      "seeds": base_shared["seeds"] if seeds is None else sorted(seeds),
  }


def _interval(paired: Dict, digits: int) -> str:
  if paired is None or paired.get("mean") is None:
    return "n/a"
  ci = paired.get("ci")
  text = f"{paired['mean']:+.{digits}f}"
  return text + (f" [{ci[0]:+.{digits}f}, {ci[1]:+.{digits}f}]" if ci else "")


def markdown(result: Dict) -> str:
  """The report: the arms' means, their paired differences, what each arm changes."""
  names, summary = result["arms"], result["summary"]
  header = ["arm"] + [title for _, title, _ in COLUMNS] + ["collapsed", "prototype gradient "
                                                            "at step 0, per term"]
  rows = []
  for name in names:
    grads = ", ".join(f"{t} {reporting.fmt(v['mean'], 3)}"
                      for t, v in result["term_gradients_start"][name].items())
    rows.append([name] + [reporting.fmt(summary[name][m]["mean"], d) for m, _, d in COLUMNS]
                + [f"{result['collapsed'][name]} / {result['runs'][name]}", grads or "n/a"])
  position = result["position_baseline"] or {}
  chance = ["keypoint position alone / constant predictor (chance)"] + [
      reporting.fmt((position.get(m) or {}).get("mean"), d) if m in ("NMI", "ARI", "NMI_fg",
                                                                      "ARI_fg")
      else reporting.fmt(result["chance_mAP"], d) if m == "mAP_stage1"
      else reporting.fmt(result["background_truth"], d) if m == "background_share"
      else "" for m, _, d in COLUMNS] + ["", ""]
  rows.append(chance)
  lines = [f"World seed {result['world_seed']}, stand-in {result['stand_in']}, run seeds "
           f"{result['seeds']}, variant {result['variant']!r}; means over run seeds. The "
           "background row's value under `background channel` is the truth's share. Collapsed: "
           f"a channel above {COLLAPSE_SHARE} of the patches, or the background channel off the "
           f"truth's share by more than {BACKGROUND_TOLERANCE}.", "",
           reporting.markdown_table(header, rows), "",
           "Each arm minus the baseline, paired by run seed (mean [95% t interval]):", ""]
  diff_rows = [[name] + [_interval(result["paired"][name].get(m), d) for m, _, d in COLUMNS]
               for name in names[1:]]
  lines += [reporting.markdown_table(["arm"] + [t for _, t, _ in COLUMNS], diff_rows), "",
            "What each arm changes against the baseline's config:", ""]
  for name in names[1:]:
    lines.append(f"- {name}: " + ("; ".join(result["changes"][name]) or "nothing"))
  return "\n".join(lines) + "\n"


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m metonymy.table3.compare",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--baseline", required=True, help="the baseline's Table-3 workdir")
  parser.add_argument("--arm", action="append", default=[], metavar="NAME=DIR",
                      help="an arm's name and Table-3 workdir (repeatable)")
  parser.add_argument("--variant", default="single", help="the variant compared")
  parser.add_argument("--seeds", default="", help="compare on these run seeds alone "
                      "(comma-separated; every run must have them); default: the runs' own, "
                      "which must agree")
  parser.add_argument("--output", default="", help="also write the report here (.md; the "
                      "numbers beside it as .json)")
  args = parser.parse_args(argv)
  arms = []
  for spec in args.arm:
    name, sep, workdir = spec.partition("=")
    if not sep or not name or not workdir:
      parser.error(f"--arm={spec!r}: expected NAME=DIR.")
    arms.append((name, workdir))
  try:
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
  except ValueError:
    parser.error(f"--seeds={args.seeds!r}: expected comma-separated integers, e.g. 0,1.")
  try:
    result = compare(read_run(args.baseline), [(n, read_run(d)) for n, d in arms], args.variant,
                     seeds)
  except (FileNotFoundError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  text = markdown(result)
  print(text, end="")
  if args.output:
    with open(args.output, "w") as f:
      f.write(text)
    with open(os.path.splitext(args.output)[0] + ".json", "w") as f:
      json.dump(reporting.sanitize(result), f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
