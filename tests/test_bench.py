"""`python -m metonymy.bench suite`: XLA FLOPs that follow the sequence lengths, the background
drop's FLOP savings, the JSON structure and the printed tables (tiny model, seconds)."""

import json

import numpy as np
import pytest

from metonymy.bench import __main__ as bench_main
from metonymy.bench import cost
from metonymy.bench import options as bench_options
from metonymy.bench import suite
from metonymy.bench import tables
from metonymy.bench import two_stage
from metonymy.models import vit
from tests.helpers import compile_cache

compile_cache.enable()


def _analytic_flops(config: vit.ViTConfig, image_size: int, length: int) -> float:
  """Matmul FLOPs per image: patch embedding, then per block qkv/out/MLP projections (linear in
  L) and attention scores + weighted values (quadratic in L, dense masked attention)."""
  n = (image_size // config.patch_size) ** 2
  d, m = config.width, config.mlp_dim
  patch = 2 * n * config.patch_size ** 2 * 3 * d
  block = 2 * length * (4 * d * d + 2 * d * m) + 4 * length * length * d
  return patch + config.depth * block


@pytest.fixture(scope="module")
def results():
  options = bench_options.make_options(quick=True, sections=("early", "data"), num_parts=(1, 4))
  return suite.run(options)


def test_early_masked_flops_follow_the_sequence_lengths(results):
  early = results["early"]
  config = vit.get_config("vit_tiny_test", depth=early["depth"])
  plain = early["variants"]["plain"]
  assert plain["gflops_per_image"] > 0 and plain["memory_mib"] > 0
  for row in early["rows"]:
    k = row["num_parts"]
    assert row["length_plain"] == config.num_prefix + 16
    assert row["length_early"] == (k + 1) * config.num_prefix + 16
    expected = (_analytic_flops(config, 32, row["length_early"])
                / _analytic_flops(config, 32, row["length_plain"]))
    # XLA also counts LayerNorm, GELU, softmax and the mask: within 3% of the matmul model.
    assert row["flops_ratio"] == pytest.approx(expected, rel=0.03), row
    assert row["flops_ratio"] > 1.0
    assert row["goal"] == pytest.approx(1.05 * row["length_early"] / row["length_plain"])
    assert row["time_ratio"] > 0 and isinstance(row["meets_goal"], bool)


def test_results_are_json_and_the_tables_print(results):
  decoded = json.loads(json.dumps(results))
  assert set(decoded) >= {"options", "device", "device_kind", "jax", "peak_tflops", "notes",
                          "early", "data"}
  assert "two_stage" not in decoded  # Only the selected sections run.
  assert decoded["options"]["model"] == "vit_tiny_test"
  for m in decoded["early"]["variants"].values():
    assert set(m) >= {"seconds", "images_per_second", "gflops_per_image", "memory_mib", "mfu",
                      "control_flow"}
    assert m["mfu"] is None  # CPU: no peak FLOP/s known without --peak-tflops.
  assert decoded["data"]["pipeline_examples_per_second"] > 0
  assert decoded["data"]["render_examples_per_second_one_core"] > 0
  table = tables.format_tables(results)
  assert "Plain vs early-masked forward" in table and "t(e)/t(p)" in table
  assert "examples/s" in table and "MFU: no peak FLOP/s known" in table


def test_peak_flops_by_device_kind():
  assert cost.peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
  assert cost.peak_tflops("NVIDIA H100 PCIe") == 756.0
  assert cost.peak_tflops("NVIDIA H200") == 989.0
  assert cost.peak_tflops("NVIDIA A100-SXM4-40GB") == 312.0
  assert cost.peak_tflops("TPU v4") == 275.0
  assert cost.peak_tflops("TPU v5 lite") == 197.0
  assert cost.peak_tflops("TPU v5") == 459.0
  assert cost.peak_tflops("cpu") is None
  assert cost.peak_tflops("cpu", override=1.5) == 1.5


def test_foreground_layouts():
  ids = two_stage.layout_part_ids((8, 8), 2, 4, 0.25)
  assert ids.shape == (2, 8, 8) and ids.dtype == np.int32
  assert np.sum(ids[0] != 4) == 16 and set(np.unique(ids[0])) == {0, 1, 2, 3, 4}
  assert np.all(two_stage.layout_part_ids((8, 8), 1, 4, 1.0) != 4)


def test_options():
  assert bench_options.make_options().model == "vit_s16"
  quick = bench_options.make_options(quick=True, depth=2)
  assert quick.model == "vit_tiny_test" and quick.depth == 2
  with pytest.raises(ValueError, match="cudnn"):
    bench_options.make_options(attention_impl="cudnn")
  with pytest.raises(ValueError, match="sections"):
    bench_options.make_options(sections=("nope",))


@pytest.mark.slow
def test_dropping_the_background_cuts_two_stage_flops():
  options = bench_options.make_options(quick=True, sections=("two_stage",),
                                       two_stage_masks=("hard",), fg_fractions=(0.25,),
                                       train=False, image_size=48)
  notes = []
  r = two_stage.table_s5(options, None, notes)
  v = r["variants"]
  single = v["single/inference"]["gflops_per_image"]
  dense = v["hard/inference"]["gflops_per_image"]
  dropped = v["hard_drop_bg/fg0.25"]["gflops_per_image"]
  assert single > 0
  assert v["hard/inference"]["flops_ratio_to_single"] > 1.5  # Stage 1 + an early-masked Stage 2.
  # Stage 2 on K prefix copies + 9 of 36 patches, cut to the 16-token bucket of 42: well under
  # the dense Stage 2 (the whole program's count shows the costliest bucket, all 42 tokens).
  assert single < dropped and dropped - single < 0.7 * (dense - single)
  assert v["hard_drop_bg/fg0.25"]["gflops_per_image_static"] > 0.95 * dense
  assert "Table S5" in "\n".join(tables.format_two_stage(r))


def test_vit_readme_rows_replace_their_configuration(tmp_path):
  path = tmp_path / "README.md"
  path.write_text("intro\n<!-- bench:vit:begin -->\nold\n<!-- bench:vit:end -->\noutro\n")
  header = "| model | batch | px | K | x |\n|---|---|---|---|---|"
  row = lambda model, value: f"| {model} | 8 | 224 | 8 | 197 -> 205 | {value} |"
  bench_main.update_readme(str(path), "bench:vit", header, row("vit_b16", 1), "cpu:0")
  bench_main.update_readme(str(path), "bench:vit", header, row("vit_s16", 2), "cpu:0")
  bench_main.update_readme(str(path), "bench:vit", header, row("vit_b16", 3), "cpu:0")
  text = path.read_text()
  assert text.startswith("intro\n<!-- bench:vit:begin -->\nGenerated by `python -m metonymy.bench")
  assert text.endswith("<!-- bench:vit:end -->\noutro\n") and "old" not in text
  assert text.count(header) == 1
  assert text.index(row("vit_s16", 2)) < text.index(row("vit_b16", 3))
  assert row("vit_b16", 1) not in text


@pytest.mark.slow
def test_suite_command_writes_json(tmp_path, capsys):
  path = tmp_path / "suite.json"
  assert bench_main.main(["suite", "--quick", "--no-torch", "--json", str(path)]) == 0
  out = capsys.readouterr().out
  assert "Table S5" in out and "Training step" in out and "Early-masked attention" in out
  results = json.loads(path.read_text())
  assert set(results) >= set(bench_options.SECTIONS)
  two = results["two_stage"]["variants"]
  assert {"single/inference", "hard/inference", "ste/inference", "single/train_step",
          "hard/train_step", "ste/train_step"} <= set(two)
  assert all(m["gflops_per_image"] > 0 for m in two.values())
  assert two["ste/train_step"]["gflops_per_image"] > two["ste/inference"]["gflops_per_image"]
  assert [row["fraction"] for row in results["two_stage"]["foreground_sweep"]] == [0.25, 1.0]
  # The time-per-FLOP breakdown: a forward + backward does ~3x a forward's FLOPs, and the
  # early-masked one more than the plain one (a longer sequence).
  per_flop = results["two_stage"]["ms_per_gflop"]
  assert {"vit/forward", "vit/train_step", "vit_early/train_step", "ste/train_step"} <= set(per_flop)
  assert 2.5 < two["vit/train_step"]["gflops_per_image"] / two["vit/forward"]["gflops_per_image"] < 3.5
  assert (two["vit_early/train_step"]["gflops_per_image"]
          > two["vit/train_step"]["gflops_per_image"])
  assert "Time per XLA GFLOP" in out and "early-masked ViT forward + backward" in out
  assert [row["image_size"] for row in results["attention"]["rows"]] == [32, 64]
  assert results["vit"]["timings"]["flax_plain"]["images_per_second"] > 0
