"""The demo job (metonymy/demo/): configs, the README blocks, the attention/feature helpers
(metonymy/probe/explore.py), and small end-to-end runs of the story and the correlation sweep."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn import metrics as skm

from metonymy import config_lib
from metonymy import data as data_lib
from metonymy import demo
from metonymy import reporting
from metonymy.demo import readme
from metonymy.demo import sweep
from metonymy.demo import tables
from metonymy.models import vit
from metonymy.probe import explore
from metonymy.runs import references
from metonymy.runs import stand_in
from metonymy.runs import subjobs
from tests.helpers import shared_runs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_FILE = os.path.join(ROOT, "configs", "demo.py")


def _config(name, arg=""):
  return config_lib.load_sibling_config(CONFIG_FILE, name, arg)


@pytest.mark.parametrize("name,arg", [("demo", ""), ("demo", "tiny"),
                                      ("demo_correlation_sweep", ""),
                                      ("demo_correlation_sweep", "small")])
def test_configs_load(name, arg):
  config = _config(name, arg)
  assert config.job == "demo"
  assert config.mode == ("story" if name == "demo" else "correlation_sweep")
  assert config.world.correlation == 0.0
  # The sub-jobs are the real configs: a benchmark and (story) the two training runs.
  assert config.benchmark.job == "probe" and config.benchmark.masks.source == "ground_truth"
  if name == "demo":
    assert config.single.model.name == "stage1"
    assert config.two_stage.model.name == "two_stage"
    assert config.two_stage.model.stage2.mask == "ste"
    assert config.single.data.image_size == config.world.image_size
  else:
    assert "single" not in config and min(config.sweep.correlations) == 0.0
    assert max(config.sweep.correlations) == 1.0


@pytest.mark.parametrize("name", ["demo", "demo_correlation_sweep"])
def test_unknown_arg_fails_clearly(name):
  with pytest.raises(ValueError, match="Unknown config argument"):
    _config(name, "nope")


def test_seed_rows_are_replaced_per_seed_and_kept_sorted(tmp_path):
  path = tmp_path / "README.md"
  begin, end = reporting.markers(readme.SEEDS_BLOCK)
  # A row written before the position column: kept, the new column "n/a".
  old_row = ("| 1 | 0.6 | 0.1 / 0.5 | 0.5 | 8.4 / 6.5 | 0.5 | 0.5 | 8.8 / 6.6 | 0.61 / 0.65 | 0.2 "
             "| 9 s |")
  path.write_text(f"# t\n{begin}\n{old_row}\n{end}\nafter\n")
  summary = {k: 0.5 for k in ("ps_late", "ps_early", "map_single", "nmi_single", "ari_single",
                              "map_two_stage_stage2", "map_two_stage_ensemble", "nmi_two_stage",
                              "ari_two_stage", "max_part_share_single",
                              "max_part_share_two_stage", "map_chance")}
  summary.update(nmi_position=9.44, ari_position=7.06)
  run = lambda seed, value: {"world": {"seed": seed}, "summary": dict(summary, map_single=value),
                             "backbone": {"quality_val": {"cls/mAP": 0.7}},
                             "seconds": {"total": 100.0}}
  readme.write_seed_row(str(path), run(2, 0.1))
  readme.write_seed_row(str(path), run(0, 0.2))
  readme.write_seed_row(str(path), run(2, 0.3))  # seed 2 again: its row is replaced
  lines = [l for l in path.read_text().splitlines() if l.startswith("| ") and l[2].isdigit()]
  assert [l.split("|")[1].strip() for l in lines] == ["0", "1", "2"]
  assert "| 0.300 |" in lines[2] and "| 0.200 |" in lines[0] and "0.100" not in path.read_text()
  column = readme.SEEDS_HEADER.index(readme.POSITION_COLUMN) + 1
  assert [l.split("|")[column].strip() for l in lines] == ["9.4 / 7.1", "n/a", "9.4 / 7.1"]
  assert "| 8.8 / 6.6 | n/a | 0.61 / 0.65 |" in lines[1]
  assert path.read_text().endswith(f"{end}\nafter\n")


def test_block_says_whether_the_machine_was_shared():
  """The wall-time sentence of README's demo block (tables.describe), from results.json's record."""
  results = {
      "world": {"seed": 0, "image_size": 48, "correlation": 0.0}, "seed": 0,
      "backbone": {"path": "/tmp/b", "arch": {"patch_size": 4, "width": 64, "depth": 4},
                   "pretraining_steps": 3000, "source": "demo_stand_in_world0"},
      "benchmark": {"num_train": 2000, "num_val": 500, "num_test": 1000},
      "part_discovery": {"train_steps": {"single": 1000, "two_stage_ste": 1000},
                         "single": {"num_examples": 256},
                         "two_stage_ste": {"stage2_vit_relative_change": 0.0311},
                         "eval_split": "test"},
      "seconds": {"total": 484.2},
      "machine": {"cpu_count": 2, "backend": "cpu x 1", "cores": 2,
                  "load_average_start": [0.2, 0.3, 0.4], "load_average_end": [3.9, 3.5, 2.0]}}
  assert tables.describe(results).endswith(
      "Wall time 484 s on 2 CPU cores (cpu x 1; load average 3.9 at the end: the cores were "
      "shared with other jobs).")
  results["machine"]["load_average_end"] = [1.9, 1.8, 1.2]
  assert tables.describe(results).endswith(
      "Wall time 484 s on 2 CPU cores (cpu x 1; load average 1.9 at the end: machine otherwise "
      "idle).")
  for key in ("cores", "load_average_start", "load_average_end"):  # An older results.json.
    del results["machine"][key]
  assert tables.describe(results).endswith("Wall time 484 s on 2 CPU cores (cpu x 1).")
  # How the stand-in learned: an older results.json (no objective) and the supervised recipe
  # read as before; the self-supervised one says so.
  assert "3000 steps on the world's attributes" in tables.describe(results)
  results["backbone"]["pretraining_objective"] = "self_supervised"
  assert "3000 steps self-supervised on the world's images, no labels" in tables.describe(results)
  # A stand-in continuing the supervised one says what it continues, never "no labels".
  results["backbone"]["pretraining_start"] = "demo_stand_in_v3_world0"
  text = tables.describe(results)
  assert "continuing demo_stand_in_v3_world0" in text and "no labels" not in text
  assert "beside its attribute term," in text and "register" not in text
  # Its registers and a lighter attribute term are said.
  results["backbone"]["attribute_weight"] = 0.1
  results["backbone"]["arch"]["num_registers"] = 4
  text = tables.describe(results)
  assert "depth 4, 4 register tokens) pretrained" in text
  assert "beside its attribute term at 0.1 of the dense term's weight, continuing" in text


def test_position_baseline_rows_of_the_discovery_table():
  """One chance row when both runs measured the same position baseline, one per run when their
  K differ, none in an older results.json."""
  same = {"NMI": 41.6, "ARI": 37.5, "NMI_fg": 41.6, "ARI_fg": 37.5}
  pd = {"single": {"position_baseline": same}, "two_stage_ste": {"position_baseline": same}}
  assert tables.position_rows(pd) == [["chance: keypoint position alone",
                                       "(k-means on the training keypoints; no image)", "",
                                       "41.6", "37.5", "41.6", "37.5", "", ""]]
  pd["two_stage_ste"]["position_baseline"] = dict(same, NMI=30.0)
  rows = tables.position_rows(pd)
  assert [r[0] for r in rows] == ["chance: keypoint position alone (K of single-stage)",
                                  "chance: keypoint position alone (K of two-stage STE)"]
  assert [r[3] for r in rows] == ["41.6", "30.0"]
  assert tables.position_rows({"single": {}, "two_stage_ste": {}}) == []


def test_seed_row_without_markers_fails_clearly(tmp_path):
  path = tmp_path / "README.md"
  path.write_text("# no markers\n")
  with pytest.raises(ValueError, match="demo:seeds:begin"):
    readme.write_seed_row(str(path), {})
  assert path.read_text() == "# no markers\n"
  with pytest.raises(FileNotFoundError, match="nope.md"):
    readme.write_seed_row(str(tmp_path / "nope.md"), {})


def test_last_eval_reads_the_latest_evaluation(tmp_path):
  records = [{"step": 5, "loss": 1.0},
             {"step": 5, "eval/stage1/mAP": 0.3, "eval/parts/NMI": "nan"},
             {"step": 10, "eval/stage1/mAP": 0.4, "eval/parts/NMI": 12.0},
             {"step": 11, "loss": 0.5}]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  assert subjobs.last_eval(str(tmp_path)) == {"stage1/mAP": 0.4, "parts/NMI": 12.0, "step": 10}


def _tiny_vit():
  config = vit.get_config("vit_tiny_test").replace(image_size=32, patch_size=4,
                                                   pos_embed_grid=(8, 8))
  model, params = vit.init_params(config, jax.random.PRNGKey(0))
  images = jax.random.normal(jax.random.PRNGKey(1), (2, 32, 32, 3))
  ids = jax.random.randint(jax.random.PRNGKey(2), (2, 8, 8), 0, 4)
  return config, params, images, ids


@pytest.mark.slow  # eager (unjitted) forwards: ~10 s on 2 CPU cores
def test_priors_table_shows_a_model_only_when_it_trained_with_the_priors():
  truth = {"total_variation": 0.5, "foreground_presence": 0.1, "background_presence": 0.0,
           "entropy": 0.0}
  with_priors = dict(truth, total_variation=0.3)
  table = tables.priors_table({"truth": truth, "single": with_priors,
                               "two_stage_ste": {k: None for k in truth}})
  assert "| ground-truth parts on the patch grid (one-hot) | 0.500 |" in table
  assert "| single-stage maps, last training batch | 0.300 |" in table
  assert "two-stage STE maps" not in table


def test_priors_of_the_truth_by_hand():
  """Total variation and presence of the world's true parts on the patch grid, recomputed here
  from the pixels with plain loops: plurality label per patch, then neighbour differences."""
  config = _config("demo", "tiny")
  data = subjobs.with_world(config.single, config.world).data
  data.eval_examples, data.batch_size = 3, 3
  patch = 4
  got = references.priors_of_the_truth(data, patch)
  source = data_lib.make_source(data.dataset, None, data.eval_split, **data.options.to_dict())
  num_parts = len(source.info.part_names)
  tv = 0.0
  fg_best = np.zeros(num_parts)
  for i in range(3):
    seg = np.asarray(source[i]["part_segmentation"])
    grid = seg.shape[0] // patch
    ids = np.zeros((grid, grid), int)
    for r in range(grid):
      for c in range(grid):
        counts = np.bincount(seg[r * patch:(r + 1) * patch, c * patch:(c + 1) * patch].ravel(),
                             minlength=num_parts + 1)
        # World label 0 is the background (channel K); ties go to the lower channel.
        by_channel = np.concatenate([counts[1:], counts[:1]])
        ids[r, c] = int(np.argmax(by_channel))
    for r in range(grid):
      for c in range(grid):
        if r + 1 < grid and ids[r + 1, c] != ids[r, c]:
          tv += 2.0  # two channels change by 1
        if c + 1 < grid and ids[r, c + 1] != ids[r, c]:
          tv += 2.0
    for k in range(num_parts):
      for r in range(grid - 2):
        for c in range(grid - 2):
          fg_best[k] = max(fg_best[k], np.mean(ids[r:r + 3, c:c + 3] == k))
  assert got["total_variation"] == pytest.approx(tv / (3 * grid * grid), rel=1e-6)
  assert got["foreground_presence"] == pytest.approx(1.0 - fg_best.mean(), rel=1e-6)
  assert got["entropy"] == 0.0


@pytest.mark.slow
def test_attention_weights_are_the_models_and_respect_the_block_mask():
  """The weights are those the ViT sows (tests/test_vit_masking.py checks them against the
  forward); here, that explore reads the right block's, in the layout the notebook expects."""
  config, params, images, ids = _tiny_vit()
  _, state = vit.VisionTransformer(config).apply({"params": params}, images,
                                                 mutable=["intermediates"])
  for layer in range(config.depth):
    plain = explore.attention_weights(config, params, images, layer)
    np.testing.assert_array_equal(
        plain["weights"], state["intermediates"][f"blocks_{layer}"]["attn"]["attention_weights"][0])
    early = explore.attention_weights(config, params, images, layer, part_ids=ids, num_parts=3)
    length = config.num_prefix + 64
    assert plain["weights"].shape == (2, config.num_heads, length, length)
    np.testing.assert_allclose(plain["weights"].sum(-1), 1.0, atol=1e-5)
    groups = early["group_ids"]
    allowed = groups[:, None, :, None] == groups[:, None, None, :]
    assert early["weights"].shape[-1] == 4 * config.num_prefix + 64
    assert np.all(early["weights"][~np.broadcast_to(allowed, early["weights"].shape)] == 0.0)
    np.testing.assert_allclose(early["weights"].sum(-1), 1.0, atol=1e-5)


@pytest.mark.slow
def test_early_part_feature_ignores_pixels_outside_the_part():
  config, params, images, ids = _tiny_vit()
  inside = np.repeat(np.repeat(np.asarray(ids) == 1, 4, 1), 4, 2)[..., None]
  edited = jnp.where(inside, images, images[::-1])
  before = explore.late_and_early(config, params, images, ids, 3)
  after = explore.late_and_early(config, params, edited, ids, 3)
  np.testing.assert_array_equal(before["early"][:, 1], after["early"][:, 1])
  assert np.abs(before["late"][:, 1] - after["late"][:, 1]).max() > 1e-4


# The tiny story run: tiny_demo_run (tests/helpers/shared_runs.py), shared with
# tests/test_workdir_records.py.
RUN_SEED = shared_runs.TINY_DEMO_SEED  # not the default 0: the sub-jobs must be given the run seed


@pytest.mark.slow
def test_tiny_demo_seeds_every_sub_job_with_the_run_seed(tiny_demo_run):
  workdir, results = tiny_demo_run.workdir, tiny_demo_run.results
  assert results["seed"] == RUN_SEED and results["world"]["seed"] == 0
  for sub in ("single", "two_stage_ste"):
    for name in ("config.json", "model.json"):
      with open(os.path.join(workdir, sub, name)) as f:
        assert json.load(f)["seed"] == RUN_SEED, (sub, name)
  with open(os.path.join(workdir, subjobs.BENCHMARK_DIR, "config.json")) as f:
    assert tuple(json.load(f)["seeds"]) == (RUN_SEED,)
  # The stand-in has its own seed (config.stand_in_seed), so the run seed leaves it alone.
  with open(os.path.join(workdir, stand_in.BACKBONE_DIR, stand_in.STAND_IN_FILE + ".json")) as f:
    assert json.load(f)["recipe"]["seed"] == 0


@pytest.mark.slow
def test_tiny_demo_writes_report_and_results(tiny_demo_run):
  workdir, readme_path = tiny_demo_run.workdir, tiny_demo_run.readme
  with open(os.path.join(workdir, "results.json")) as f:
    saved = json.load(f)
  assert saved["summary"].keys() == {
      "ps_late", "ps_early", "causal_leakage_late", "causal_leakage_early", "map_single",
      "map_two_stage_stage1", "map_two_stage_stage2", "map_two_stage_ensemble", "map_chance",
      "nmi_single", "ari_single", "nmi_two_stage", "ari_two_stage", "nmi_fg_single",
      "ari_fg_single", "nmi_fg_two_stage", "ari_fg_two_stage", "nmi_position", "ari_position",
      "max_part_share_single", "max_part_share_two_stage", "collapsed", "stand_in_cls_map_val"}
  s = saved["summary"]
  for key in ("ps_late", "ps_early", "causal_leakage_late", "map_single",
              "map_two_stage_stage2", "map_two_stage_ensemble", "map_chance"):
    assert isinstance(s[key], float), key
  # Early masking: part k's feature is a function of part k's pixels only.
  assert s["causal_leakage_early"] == 0.0 and s["causal_leakage_late"] > 0.0
  # Values, not just keys. The summary carries the numbers the sub-runs measured.
  pd = saved["part_discovery"]
  for run, suffix in (("single", "single"), ("two_stage_ste", "two_stage")):
    for metric in ("NMI", "ARI", "NMI_fg", "ARI_fg"):
      assert s[f"{metric.lower()}_{suffix}"] == pd[run][metric], (run, metric)
    assert s[f"max_part_share_{suffix}"] == max(pd[run]["part_share"])
    assert 0.0 <= pd[run]["NMI"] <= 100.0 and -100.0 <= pd[run]["ARI"] <= 100.0, pd[run]
    # Neither tiny run collapsed (recorded), so its parts split the keypoints somewhat.
    assert not pd[run]["collapsed"] and pd[run]["NMI"] > 0.0, pd[run]
  assert s["map_single"] == pd["single"]["mAP"]["stage1"]
  # The chance row of NMI / ARI: each run's own eval/parts/position_*, the same for both (same
  # training keypoints, K and seed), and the row of the table with those numbers.
  for run in ("single", "two_stage_ste"):
    logged = subjobs.last_eval(os.path.join(workdir, run))
    assert pd[run]["position_baseline"] == {k: logged[f"parts/position_{k}"]
                                           for k in ("NMI", "ARI", "NMI_fg", "ARI_fg")}, run
  position = pd["single"]["position_baseline"]
  assert pd["two_stage_ste"]["position_baseline"] == position
  assert (s["nmi_position"], s["ari_position"]) == (position["NMI"], position["ARI"])
  assert 0.0 <= position["NMI"] <= 100.0 and position["NMI_fg"] == position["NMI"]
  for head in ("stage1", "stage2", "ensemble"):
    assert s[f"map_two_stage_{head}"] == pd["two_stage_ste"]["mAP"][head]
    assert 0.0 < s[f"map_two_stage_{head}"] <= 1.0
  # The chance level is a constant predictor's mAP on the evaluated images, recomputed here
  # with sklearn. Beating it takes a backbone that has learned the world and more than the
  # tiny run's 3 steps: tests/test_part_discovery_regression.py checks that.
  config = _config("demo", "tiny")
  data = subjobs.with_world(config.single, config.world).data
  source = data_lib.make_source(data.dataset, data.root or None, data.eval_split,
                                **data.options.to_dict())
  labels = np.stack([source[i]["attributes"] for i in range(int(pd["single"]["num_examples"]))])
  constant = np.zeros(len(labels))
  chance = np.mean([skm.average_precision_score(column, constant)
                    for column in labels.T if column.any()])
  assert s["map_chance"] == pytest.approx(chance) and pd["chance_mAP"] == s["map_chance"]
  assert 0.0 < chance < 1.0
  assert set(saved["part_discovery"]["two_stage_ste"]["mAP"]) == {"stage1", "stage2", "ensemble"}
  assert saved["seconds"]["total"] > 0
  # The stand-in's own quality was measured on val, beside the chance level.
  quality = saved["backbone"]["quality_val"]
  assert s["stand_in_cls_map_val"] == quality["cls/mAP"]
  assert 0.0 < quality["chance/mAP"] < quality["cls/mAP"] <= 1.0
  assert 0.0 <= quality["part_probe/balanced_accuracy"] <= 1.0
  assert 0.0 <= quality["kmeans_fg/NMI"] <= 100.0
  assert saved["backbone"]["source"] == "pretrained in this run"
  # Part discovery: NMI/ARI with and without the background, and the collapse watch.
  for key in ("single", "two_stage_ste"):
    r = saved["part_discovery"][key]
    assert all(isinstance(r[k], float) for k in ("NMI", "ARI", "NMI_fg", "ARI_fg")), r
    assert len(r["part_share"]) == config_lib.load_sibling_config(
        CONFIG_FILE, "demo", "tiny").single.model.num_parts + 1
    assert sum(r["part_share"]) == pytest.approx(1.0, abs=1e-6)
    assert r["collapsed"] == (max(r["part_share"]) > 0.9 or r["empty_parts"] > 0)
  # The numbers in the files are the ones the sub-jobs measured.
  with open(os.path.join(workdir, subjobs.BENCHMARK_DIR, "results.json")) as f:
    assert json.load(f)["ps_late"] == pytest.approx(s["ps_late"])
  assert subjobs.last_eval(os.path.join(workdir, "single"))["stage1/mAP"] == pytest.approx(
      s["map_single"])
  # report.md: the tables, and only links to figures that exist.
  with open(os.path.join(workdir, "report.md")) as f:
    report = f.read()
  assert "| late (pool a plain forward" in report and "| two-stage STE |" in report
  assert "| NMI fg | ARI fg |" in report and "Stand-in backbone" in report
  assert (f"| chance: keypoint position alone | (k-means on the training keypoints; no image) |  "
          f"| {position['NMI']:.1f} | {position['ARI']:.1f} |") in report
  links = [line[line.index("](") + 2:-1] for line in report.splitlines() if line.startswith("![")]
  assert any(l.startswith("benchmark/") for l in links)
  assert any(l.startswith("two_stage_ste/images/") for l in links)
  assert all(os.path.exists(os.path.join(workdir, l)) for l in links), links
  # The priors' bill: the truth's on the patch grid, and each model's from its training log
  # (the demo's world v3 trains with every prior on).
  priors = pd["priors"]
  logged = subjobs.last_train_losses(os.path.join(workdir, "single"))
  assert priors["single"] == {k: logged.get(k) for k in references.MAP_PRIORS}
  assert priors["truth"]["entropy"] == 0.0 and priors["truth"]["total_variation"] > 0.0
  assert "| ground-truth parts on the patch grid (one-hot) |" in report
  assert priors["single"]["total_variation"] > 0.0 and priors["two_stage_ste"]["entropy"] > 0.0
  assert "| single-stage maps, last training batch |" in report
  assert "| two-stage STE maps, last training batch |" in report
  assert "trained with the attribute losses alone (every prior at weight 0)" not in report
  assert "| k-means on the last block's foreground tokens vs the true parts (NMI x100) |" in report
  with open(readme_path) as f:
    block = f.read()
  results_end, seeds_begin = (reporting.markers(readme.RESULTS_BLOCK)[1],
                              reporting.markers(readme.SEEDS_BLOCK)[0])
  assert f"{s['ps_late']:.3f}" in block and results_end in block
  assert f"| chance: keypoint position alone | (k-means" in block.split(results_end)[0]
  assert "| 0 | " in block.split(seeds_begin)[1]  # this world's row of the seeds table


@pytest.mark.slow
def test_small_sweep_plots_ps_against_correlation(tiny_demo_run, tmp_path):
  demo_dir = tiny_demo_run.workdir  # Its stand-in backbone.
  config = _config("demo_correlation_sweep", "small")
  config.benchmark.backbone.checkpoint = os.path.join(demo_dir, stand_in.BACKBONE_DIR)
  results = demo.run(config, str(tmp_path))
  assert os.path.getsize(tmp_path / sweep.SWEEP_PNG) > 1000
  assert [p["correlation"] for p in results["points"]] == [0.0, 1.0]
  with open(tmp_path / "results.json") as f:
    points = json.load(f)["points"]
  assert all(isinstance(p["ps_late"], float) and isinstance(p["ps_early"], float) for p in points)
  report = (tmp_path / "report.md").read_text()
  assert "| 0 |" in report and "| 1 |" in report
  # Each correlation has its own benchmark workdir and report.
  assert (tmp_path / "correlation_0" / "report.md").exists()
  assert (tmp_path / "correlation_1" / "report.md").exists()
