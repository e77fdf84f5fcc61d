"""The Table-3 job (configs/synthetic_table3.py): its statistics, and the `small` job end to end:
every (variant, run seed) row, the arms starting from one Stage-1 state, the paired differences,
report.md, the figure and README's block, and its runs in worker processes the same as in the
job's own."""

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from scipy import stats as scipy_stats

from metonymy import config_lib
from metonymy import reporting
from metonymy import table3
from metonymy.runs import subjobs
from metonymy.table3 import report
from metonymy.table3 import stats
from metonymy.runs import workers
from metonymy.table3 import variants
from metonymy.workdir import Workdir
from tests.helpers import compile_cache

compile_cache.enable()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_FILE = os.path.join(ROOT, "configs", "synthetic_table3.py")


def test_t_interval_is_students():
  diffs = [1.0, 3.0, 2.5]
  out = stats.t_interval(diffs)
  half = scipy_stats.t.ppf(0.975, 2) * np.std(diffs, ddof=1) / math.sqrt(3)
  assert out["mean"] == pytest.approx(np.mean(diffs))
  assert out["ci"] == pytest.approx([np.mean(diffs) - half, np.mean(diffs) + half])
  assert stats.t_interval([2.0])["ci"] is None and stats.t_interval([])["mean"] is None


def test_paired_differences_pair_by_seed_not_by_position():
  rows = [{"variant": "single", "seed": 0, "NMI": 10.0},
          {"variant": "single", "seed": 1, "NMI": 30.0},
          {"variant": "ste", "seed": 1, "NMI": 31.0}, {"variant": "ste", "seed": 0, "NMI": 12.0},
          {"variant": "ste", "seed": 2, "NMI": 50.0}]  # seed 2 has no single-stage partner
  out = stats.paired(rows, metrics=("NMI",))["ste"]
  assert out["seeds"] == [0, 1]
  assert out["NMI"]["differences"] == [2.0, 1.0] and out["NMI"]["mean"] == pytest.approx(1.5)
  summary = stats.summary(rows, metrics=("NMI",))
  assert summary["ste"]["NMI"]["mean"] == pytest.approx(31.0) and summary["ste"]["NMI"]["n"] == 3
  assert summary["single"]["NMI"]["sd"] == pytest.approx(np.std([10.0, 30.0], ddof=1))


def _rows_with_position_and_coverage():
  """Two seeds x (single, ste): the position baseline per seed, coverage of two true parts."""
  rows = []
  for seed, (nmi, ari) in ((0, (40.0, 30.0)), (1, (44.0, 34.0))):
    for variant, cover in (("single", (0.4, 0.6)), ("ste", (0.6, 0.9 - 0.1 * seed))):
      rows.append({"variant": variant, "seed": seed, "NMI": 10.0 + seed, "ARI": 5.0,
                   "position_NMI": nmi, "position_ARI": ari, "position_NMI_fg": nmi,
                   "position_ARI_fg": ari, "coverage": float(np.mean(cover)),
                   "area_ratio": 1.0, "coverage/0": cover[0], "coverage/1": cover[1],
                   "area_ratio/0": 0.5, "area_ratio/1": 1.5, "collapsed": False})
  return rows


def test_position_baseline_row_is_the_mean_over_seeds_and_checked_across_variants():
  rows = _rows_with_position_and_coverage()
  position = stats.position_baseline(rows)
  assert position["equal_across_variants"] and position["unequal"] == []
  assert position["NMI"]["mean"] == pytest.approx(42.0) and position["NMI"]["n"] == 2
  assert position["ARI"]["mean"] == pytest.approx(32.0)
  assert position["by_seed"]["1"]["NMI"] == 44.0
  results = {"summary": stats.summary(rows), "chance_mAP": 0.3, "position_baseline": position}
  table = report.table3(results)
  row = [l for l in table.splitlines() if l.startswith("| chance: keypoint position alone")][0]
  cells = [c.strip() for c in row.strip("|").split("|")]
  assert cells[2:4] == ["32.0 ± 2.8", "42.0 ± 2.8"]  # ARI, NMI: Table 3's column order
  assert "the same for every variant of a seed" in cells[1]
  # A variant scored on other keypoints (or with another K) shows, and is not averaged away.
  rows[3]["position_NMI"] = 45.0
  odd = stats.position_baseline(rows)
  assert not odd["equal_across_variants"] and "seed 1: ste gives NMI 45.0 (not 44.0)" in odd["unequal"][0]
  assert "differs across the variants of a seed" in report.position_method(odd)
  assert stats.position_baseline([{"variant": "single", "seed": 0}]) is None


def test_coverage_tables_show_means_over_seeds_and_paired_differences():
  rows = _rows_with_position_and_coverage()
  metrics = stats.METRICS + stats.coverage_metrics(2)
  assert stats.coverage_metrics(2) == ("coverage", "area_ratio", "coverage/0", "coverage/1",
                                       "area_ratio/0", "area_ratio/1")
  results = {"rows": rows, "true_parts": ["head", "tail"], "summary": stats.summary(rows, metrics),
             "paired": stats.paired(rows, metrics=metrics)}
  tables = report.coverage_tables(results)
  lines = tables.splitlines()
  assert "| Variant | Coverage, mean over the parts | head | tail |" in lines
  assert "| STE | 0.72 ± 0.04 | 0.60 ± 0.00 | 0.85 ± 0.07 |" in lines
  assert "| single-stage | 0.50 ± 0.00 | 0.40 ± 0.00 | 0.60 ± 0.00 |" in lines
  # STE - single: head +0.2 on both seeds (no spread: the interval is a point, bold), tail +0.3
  # and +0.2.
  assert ("| STE (seeds 0, 1) | +0.22 [-0.09, +0.54] | **+0.20 [+0.20, +0.20]** | "
          "+0.25 [-0.39, +0.89] |") in lines
  assert results["paired"]["ste"]["coverage/1"]["differences"] == pytest.approx([0.3, 0.2])
  assert "| Variant | Area ratio, mean over the parts | head | tail |" in lines
  assert report.coverage_tables({"rows": [{"variant": "single"}]}) == ""


@pytest.mark.slow
def test_the_val_route_measures_the_stand_in_on_the_world_s_val_split():
  """`split=val` empties the probe's val role (val is its score split then); the stand-in's
  quality still reads the world's own val images (it raised "unknown split ''" before)."""
  from metonymy import loading
  from metonymy.runs import stand_in
  config = config_lib.load_config(CONFIG_FILE, "small,split=val")
  assert config.benchmark.data.val == ""
  _, params, vit_config = loading.build_backbone(config.backbone, 0)
  quality = stand_in.stand_in_quality(config, config.world, vit_config, params, {})
  assert quality["part_probe/images"] == min(400, dict(config.world.splits)["val"])
  assert 0.0 <= quality["kmeans_fg/NMI"] <= 100.0


def test_configs_load_and_refuse_unknown_args():
  full = config_lib.load_config(CONFIG_FILE)
  assert full.variants == ("single", "hard", "ste", "soft") and len(full.seeds) >= 3
  assert full.single.data.eval_split == "test"
  assert (full.benchmark.data.val, full.benchmark.data.test) == ("val", "test")
  on_val = config_lib.load_config(CONFIG_FILE, "split=val")
  assert on_val.single.data.eval_split == "val"
  # The probe scores PS and MPPO on val too, its weight decay chosen on a part of train.
  assert (on_val.benchmark.data.val, on_val.benchmark.data.test) == ("", "val")
  off = config_lib.load_config(CONFIG_FILE, "priors=off").single.loss.weights
  assert off.attribute == 1.0 and off.orthogonality == 0.0 and off.background_presence == 0.0
  assert off.total_variation == 0.0
  # The recipe: every prior at PDiscoFormer's weight but total variation, at a quarter; the demo's
  # v3 parts are found with the same weights.
  recipe = full.single.loss.weights
  paper = config_lib.part_losses().weights
  assert recipe.total_variation == 0.25 and paper.total_variation == 1.0
  assert all(recipe[t] == paper[t] for t in config_lib.PRIOR_TERMS if t != "total_variation")
  demo = config_lib.load_config(os.path.join(ROOT, "configs", "demo.py"))
  assert demo.single.loss.weights.to_dict() == recipe.to_dict()
  assert demo.two_stage.loss.weights.to_dict() == recipe.to_dict()
  with pytest.raises(ValueError, match="total_variation"):
    config_lib.load_config(CONFIG_FILE, "priors=off,total_variation=0.5")
  paper = config_lib.load_config(CONFIG_FILE, "paper_stage2_rate").single.optimizer
  assert paper.learning_rates.backbone == 2e-6
  with pytest.raises(ValueError, match="small"):
    config_lib.load_config(CONFIG_FILE, "smal")
  with pytest.raises(ValueError, match="priors"):
    config_lib.load_config(CONFIG_FILE, "priors=some")
  # The two-stage arms are the single-stage run with another model, nothing else.
  single = variants.training_config(full, "single").to_dict()
  for variant in ("hard", "ste", "soft"):
    two = variants.training_config(full, variant).to_dict()
    assert two["model"]["stage2"]["mask"] == variant
    assert {k: v for k, v in two.items() if k != "model"} == {
        k: v for k, v in single.items() if k != "model"}
  with pytest.raises(ValueError, match="unknown variant"):
    variants.training_config(full, "late")
  # Stage 2's feedback scale reaches every two-stage arm's model, and the protocol records it.
  assert variants.training_config(full, "ste").model.stage2.feedback_scale == 1.0
  full.stage2_feedback_scale = 30
  for variant in ("hard", "ste", "soft", "hard_none"):
    assert variants.training_config(full, variant).model.stage2.feedback_scale == 30.0
  assert variants.training_config(full, "hard_none").model.stage2.hard_gradient == "none"
  assert variants.protocol(full, variants.training_config(full, "ste"))[
      "stage2_feedback_scale"] == 30.0
  full.single.model.background_prototypes = 3
  options = variants.protocol(full, variants.training_config(full, "ste"))["stage1_options"]
  assert set(options) == set(config_lib.STAGE1_OPTIONS) and options["background_prototypes"] == 3


def test_readme_block_says_whether_the_machine_was_shared():
  # The committed run's results.json predates the load record: its block names the cores only.
  with open(os.path.join(ROOT, "docs", "table3_world0", "results.json")) as f:
    results = json.load(f)
  assert "Wall time 92 min on 2 CPU cores.\n" in report.readme_block(results)
  results["machine"].update(cores=2, load_average_start=[2.5, 2.4, 2.2],
                            load_average_end=[3.9, 3.6, 3.2])
  assert ("Wall time 92 min on 2 CPU cores (load average 3.9 at the end: the cores were shared "
          "with other jobs).") in report.readme_block(results)
  results["machine"].update(load_average_start=[0.1, 0.1, 0.1], load_average_end=[2.0, 2.0, 1.9])
  assert ("Wall time 92 min on 2 CPU cores (load average 2.0 at the end: machine otherwise "
          "idle).") in report.readme_block(results)
  # The command names what made the numbers, whatever the defaults of the day: the priors
  # (off here), the world when not v1, the stand-in's objective when recorded.
  assert ("--config=configs/synthetic_table3.py:priors=off --workdir=DIR"
          in report.readme_block(results))
  results["world_name"] = "v3"
  results["stand_in_objective"] = "attributes_then_dense"
  results["protocol"]["loss_weights"] = {"attribute": 1.0, "orthogonality": 1.0, "entropy": 2.0}
  assert ("--config=configs/synthetic_table3.py:world=v3,priors=paper,stand_in_objective="
          "attributes_then_dense --workdir=DIR" in report.readme_block(results))
  # Total variation's weight is named with the priors: the recipe's quarter is not PDiscoFormer's.
  results["protocol"]["loss_weights"].update(entropy=1.0, total_variation=0.25)
  assert (":world=v3,priors=paper,total_variation=0.25,stand_in_objective="
          in report.readme_block(results))
  assert ("every part-shaping prior at PDiscoFormer's weight but total variation at 0.25;"
          in report.readme_block(results))
  results["protocol"]["loss_weights"]["total_variation"] = 1.0
  assert ",priors=paper,total_variation=1,stand_in_objective=" in report.readme_block(results)
  assert "PDiscoFormer's weight but" not in report.readme_block(results)
  # The command it names makes those weights.
  for arg, weight in (("priors=paper,total_variation=0.25", 0.25),
                      ("priors=paper,total_variation=1", 1.0)):
    assert config_lib.load_config(CONFIG_FILE, arg).single.loss.weights.total_variation == weight
  results["protocol"]["loss_weights"] = {"attribute": 1.0, "orthogonality": 1.0, "entropy": 0.0}
  assert ":world=v3,stand_in_objective=" in report.readme_block(results)  # neither: not said
  # The variants are named when not all of them ran.
  assert report.TABLE3_VARIANTS == config_lib.load_config(CONFIG_FILE).variants
  assert "--config.variants" not in report.readme_block(results)
  only = dict(results, summary={k: results["summary"][k] for k in ("single", "ste")})
  assert ("--config.world.seed=0 \"--config.variants=('single','ste')\" --config.readme"
          in report.readme_block(only))
  # Stage 2's feedback scale is named when it is not eq. 9's 1.
  assert "stage2_feedback_scale" not in report.readme_block(results)
  results["protocol"]["stage2_feedback_scale"] = 30.0
  assert ("--config.world.seed=0 --config.stage2_feedback_scale=30 --config.readme=README.md"
          in report.readme_block(results))
  # ... and by the setting line, which report.md opens with too.
  assert "Stage 2's gradient into Stage 1 scaled by 30" in report._setting(results)
  results["protocol"]["stage2_feedback_scale"] = 1.0
  assert "scaled by" not in report._setting(results)
  # Stage 1's options are named, in the setting and the command, where they are not the
  # defaults (a counterfactual's model), and not otherwise.
  defaults = config_lib.stage1_model(num_parts=5)
  results["protocol"]["stage1_options"] = {k: defaults[k] for k in config_lib.STAGE1_OPTIONS}
  assert "Stage 1 with" not in report.readme_block(results)
  results["protocol"]["stage1_options"].update(background_prototypes=3)
  assert ", Stage 1 with background prototypes 3;" in report._setting(results)
  assert ("--config.single.model.background_prototypes=3 --config.readme=README.md"
          in report.readme_block(results))


def test_each_world_seed_writes_its_own_readme_block(tmp_path):
  assert report.readme_block_name(0) == report.README_BLOCK
  assert report.readme_block_name(1) == "table3:results:world1"
  readme = tmp_path / "README.md"
  readme.write_text("".join(f"<!-- {name}:begin -->\nold {name}\n<!-- {name}:end -->\n"
                            for name in ("table3:results", "table3:results:world1")))
  with open(os.path.join(ROOT, "docs", "table3_world0", "results.json")) as f:
    results = json.load(f)
  results["world_seed"] = 1
  report.write(Workdir(os.fspath(tmp_path / "job")).make(), results, None, os.fspath(readme))
  assert reporting.read_block(os.fspath(readme), "table3:results")[1].strip() == (
      "old table3:results")
  world1 = reporting.read_block(os.fspath(readme), "table3:results:world1")[1]
  assert "--config.world.seed=1 " in world1 and "| Two-stage | STE masks |" in world1


def test_figure_legend_numbers_discovered_parts_from_1():
  from matplotlib import figure
  colours = [(0.1 * k, 0.2, 0.3) for k in range(5)] + [(0.0, 0.0, 0.0)]
  legend = report.part_legend(figure.Figure(), colours, 5, ("head", "body", "wing", "tail", "legs"))
  assert [t.get_text() for t in legend.get_texts()] == [f"part {k}" for k in range(1, 6)]
  title = legend.get_title().get_text()
  assert "discovered parts 1..5" in title and "1 head, 2 body, 3 wing, 4 tail, 5 legs" in title


# The small job: small_table3_run (tests/helpers/shared_runs.py), shared with
# tests/test_workdir_records.py.


@pytest.mark.slow
def test_small_job_writes_every_row_and_the_paired_comparison(small_table3_run):
  workdir = small_table3_run.workdir
  with open(os.path.join(workdir, "results.json")) as f:
    saved = json.load(f)
  rows = saved["rows"]
  assert [(r["variant"], r["seed"]) for r in rows] == [
      (v, s) for s in (0, 1) for v in ("single", "hard", "ste", "soft")]
  for r in rows:
    assert set(variants.ROW_KEYS) <= set(r) and r["world_seed"] == 0
    assert 0.0 <= r["NMI"] <= 100.0 and 0.0 < r["mAP_stage1"] <= 1.0
    assert r["PS"] is not None and r["MPPO"] is not None
    assert (r["mAP_stage2"] is None) == (r["variant"] == "single")
    assert r["grad_norm_start"] and r["grad_norm_end"]
    assert ("attribute_stage2" in r["grad_norm_start"]) == (r["variant"] != "single")
    if r["variant"] != "single":
      assert r["relative_change"]["backbone"] > 0.0 and r["mAP_stage2_start"] is not None
  by = {(r["variant"], r["seed"]): r for r in rows}
  for seed in (0, 1):
    single = by[("single", seed)]
    for variant in ("hard", "ste", "soft"):
      two = by[(variant, seed)]
      # One Stage-1 initialisation, data order and noise for both arms: at step 0 Stage 1 is
      # the same model (same mAP) and every prior sends it the same gradient.
      assert two["mAP_stage1_start"] == single["mAP_stage1_start"], (variant, seed)
      for term, value in single["grad_norm_start"].items():
        assert two["grad_norm_start"][term] == pytest.approx(value, rel=1e-5), (variant, term)
  # Another run seed is another initialisation.
  assert by[("single", 0)]["grad_norm_start"] != by[("single", 1)]["grad_norm_start"]
  # Summary and paired differences are the rows' own numbers.
  for variant in ("single", "hard", "ste", "soft"):
    nmi = [by[(variant, s)]["NMI"] for s in (0, 1)]
    assert saved["summary"][variant]["NMI"]["mean"] == pytest.approx(np.mean(nmi))
  for variant in ("hard", "ste", "soft"):
    diffs = [by[(variant, s)]["ARI"] - by[("single", s)]["ARI"] for s in (0, 1)]
    assert saved["paired"][variant]["ARI"]["differences"] == pytest.approx(diffs)
  assert 0.0 < saved["chance_mAP"] < 1.0
  assert saved["protocol"]["epochs"] == 2 and saved["protocol"]["steps"] > 0
  # The position baseline: each run's own eval/parts/position_*, the same for every variant of
  # a seed (it depends on the world, K and the seed only), its row the mean over seeds.
  position = saved["position_baseline"]
  assert position["equal_across_variants"] and not position["unequal"]
  for seed in (0, 1):
    logged = subjobs.last_eval(os.path.join(workdir, f"single_seed{seed}", "train"))
    values = {k: by[("single", seed)][f"position_{k}"] for k in ("NMI", "ARI", "NMI_fg", "ARI_fg")}
    assert values == {k: logged[f"parts/position_{k}"] for k in values}
    assert 0.0 <= values["NMI"] <= 100.0 and values["NMI_fg"] == values["NMI"]
    for variant in ("hard", "ste", "soft"):
      assert {k: by[(variant, seed)][f"position_{k}"] for k in values} == values, (variant, seed)
    assert position["by_seed"][str(seed)] == values
  assert position["NMI"]["mean"] == pytest.approx(np.mean(
      [by[("single", s)]["position_NMI"] for s in (0, 1)]))
  assert saved["summary"]["ste"]["position_ARI"]["mean"] == pytest.approx(position["ARI"]["mean"])
  assert "position_NMI" not in saved["paired"]["ste"]  # it does not depend on the variant
  # Mask coverage: each run's own eval/parts/coverage*, per true part of the world.
  parts = saved["true_parts"]
  assert parts == ["head", "body", "wing", "tail", "legs"]
  for r in rows:
    logged = subjobs.last_eval(os.path.join(workdir, f"{r['variant']}_seed{r['seed']}", "train"))
    per_part = [r[f"coverage/{g}"] for g in range(len(parts))]
    assert per_part == [None if not np.isfinite(logged[f"parts/coverage/{g}"])
                        else logged[f"parts/coverage/{g}"] for g in range(len(parts))]
    present = [c for c in per_part if c is not None]
    assert present and all(0.0 <= c <= 1.0 for c in present)
    assert r["coverage"] == pytest.approx(np.mean(present))
    assert all(a is None or a >= c for a, c in zip(
        [r[f"area_ratio/{g}"] for g in range(len(parts))], per_part) if c is not None)
  for variant in ("hard", "ste", "soft"):
    diffs = [by[(variant, s)]["coverage"] - by[("single", s)]["coverage"] for s in (0, 1)]
    assert saved["paired"][variant]["coverage"]["differences"] == pytest.approx(diffs)
    assert saved["summary"][variant]["area_ratio/0"]["n"] >= 1


@pytest.mark.slow
def test_small_job_writes_the_report_figure_and_readme_block(small_table3_run, tmp_path):
  workdir, results = small_table3_run.workdir, small_table3_run.results
  readme_path = small_table3_run.readme
  with open(os.path.join(workdir, "report.md")) as f:
    text = f.read()
  assert "| Setting | Method | ARI | NMI | PS | MPPO | mAP Stage 1 |" in text
  assert "(chance level)" in text and "Does Stage 2 train?" in text
  assert "attribute_stage2" in text and "collapse watch" in text
  position = results["position_baseline"]
  row = [l for l in text.splitlines() if l.startswith("| chance: keypoint position alone |")]
  assert len(row) == 1 and "the same for every variant of a seed" in row[0]
  assert f"| {position['NMI']['mean']:.1f} ± " in row[0]
  assert "## Mask coverage of the true parts (Fig. 4)" in text
  assert "| Variant | Coverage, mean over the parts | head | body | wing | tail | legs |" in text
  ste = results["summary"]["ste"]["coverage"]
  assert f"| STE | {ste['mean']:.2f} ± {ste['sd']:.2f} |" in text
  assert "position baseline (chance level of NMI / ARI)" in text
  assert os.path.getsize(os.path.join(workdir, report.FIGURE)) > 10_000
  _, block, tail = reporting.read_block(readme_path, report.README_BLOCK)
  assert "| Two-stage | STE masks |" in block and tail.strip() == "tail"
  assert "| chance: keypoint position alone |" in block
  # A rerun on the finished workdir trains nothing and reports the same numbers (on a copy:
  # the rerun rewrites the results, and the shared run stays as the job left it).
  rerun = os.fspath(tmp_path / "rerun")
  shutil.copytree(workdir, rerun)
  config = config_lib.load_config(CONFIG_FILE, "small")
  again = table3.run(config, rerun)
  assert again["rows"] == results["rows"]
  # ... and its wall time says it is the rerun's, not the job's.
  assert results["runs_read_back"] == 0 and again["runs_read_back"] == len(again["rows"])
  assert "Wall time" in report.readme_block(again)
  assert (f"this invocation only: {len(again['rows'])} of {len(again['rows'])} runs were trained "
          "by an earlier invocation" in report.readme_block(again))
  assert "this invocation only" not in block


def test_worker_processes_two_on_a_cpu_unless_asked():
  assert workers.process_count(0, 8) == (2 if (os.cpu_count() or 1) >= 2 else 1)
  assert workers.process_count(3, 8) == 3 and workers.process_count(3, 2) == 2
  assert workers.process_count(1, 8) == 1 and workers.process_count(0, 0) == 1
  with pytest.raises(ValueError, match=r"config.run_processes=-1"):
    workers.process_count(-1, 8)


@pytest.mark.slow
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="the shared job ran its runs in-process")
def test_a_run_in_a_worker_process_is_the_same_run_in_this_process(small_table3_run, tmp_path):
  # The shared job trained its runs in two worker processes (run_processes 0 on a 2+ core CPU),
  # each writing its output to its log; the same run trained here gives the same row, bit for bit.
  workdir = small_table3_run.workdir
  with open(os.path.join(workdir, "ste_seed1", workers.LOG_FILE)) as f:
    assert "Training " in f.read()
  config = config_lib.load_config(CONFIG_FILE, "small")
  backbone = os.path.join(workdir, "backbone")
  files = Workdir(os.fspath(tmp_path / "here")).make()
  train_dir = variants.train(config, "ste", 1, backbone, files)
  probe = variants.benchmark(config, "ste", 1, backbone, train_dir, files)
  by = {(r["variant"], r["seed"]): r for r in small_table3_run.results["rows"]}
  assert variants.row("ste", 1, int(config.world.seed), train_dir, probe) == by[("ste", 1)]


@pytest.mark.slow
def test_a_failed_worker_run_stops_the_job_and_names_its_log(tmp_path):
  config = config_lib.load_config(CONFIG_FILE, "small")
  files = Workdir(os.fspath(tmp_path)).make()
  log = variants.log_path(files, "nope", 0)
  task = workers.Task("nope, run seed 0", log, variants.train_and_benchmark,
                      (config.to_dict(), "nope", 0, "no-backbone", os.fspath(files)))
  with pytest.raises(RuntimeError, match=r"nope, run seed 0 failed.*nope_seed0/log.txt"):
    workers.run_all([task], 2, "[table3]")
  with open(log) as f:
    assert "unknown variant 'nope'" in f.read()


def _alive(pid: int) -> bool:
  """Whether `pid` runs (a zombie, dead but not yet reaped, does not)."""
  try:
    with open(f"/proc/{pid}/status") as f:
      return not any(line.startswith("State:") and "Z" in line.split()[1:2] for line in f)
  except FileNotFoundError:
    return False


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads worker states from /proc")
def test_workers_stop_when_the_job_process_is_killed(small_table3_run, tmp_path):
  workdir = os.fspath(tmp_path / "killed")
  script = (
      "import sys; from metonymy import config_lib, table3\n"
      f"config = config_lib.load_config({CONFIG_FILE!r}, 'small')\n"
      f"config.benchmark.backbone.checkpoint = "
      f"{os.path.join(small_table3_run.workdir, 'backbone')!r}\n"
      "config.run_processes = 2\n"
      f"table3.run(config, {workdir!r})\n")
  job = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  logs = [os.path.join(workdir, f"{v}_seed0", workers.LOG_FILE) for v in ("single", "hard")]
  pids, deadline = [], time.monotonic() + 120
  while len(pids) < 2 and time.monotonic() < deadline and job.poll() is None:
    time.sleep(0.5)
    pids = [int(m.group(1)) for path in logs if os.path.exists(path)
            for m in [re.search(r"worker, pid (\d+)\]", open(path).read())] if m]
  assert len(pids) == 2, "the two workers never started"
  job.kill()
  job.wait()
  deadline = time.monotonic() + 60
  while any(_alive(p) for p in pids) and time.monotonic() < deadline:
    time.sleep(0.5)
  assert not any(_alive(p) for p in pids), "a worker outlived the job process"
