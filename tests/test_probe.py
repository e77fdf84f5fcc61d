"""The leakage benchmark (issue 4): part masks, features, probes, cache/resume, causal leakage,
the synthetic-world check, configs and the job end to end."""

import importlib.util
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from metonymy import config_lib
from metonymy import loading
from metonymy.data import synthetic
from metonymy.data import transforms as transforms_lib
from metonymy.evaluation import position_baseline
from metonymy.models import vit
from metonymy.probe import benchmark
from metonymy.probe import cache as cache_lib
from metonymy.probe import extract as extract_lib
from metonymy.probe import features as features_lib
from metonymy.probe import leakage as leakage_lib
from metonymy.probe import linear
from metonymy.evaluation import patch_grid
from metonymy.probe import masks as masks_lib
from metonymy.workdir import writers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load_config(name, arg=""):
  spec = importlib.util.spec_from_file_location("cfg", os.path.join(ROOT, "configs", name))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


# ------------------------------------------------------------------------------------------------
# Part masks.


def test_patch_rules_hand_computed():
  # K = 2 parts (0, 1), background 2; 2x2 patches of 2x2 pixels.
  labels = np.array([[[0, 0, 1, 2],
                      [2, 2, 2, 2],
                      [0, 1, 2, 2],
                      [1, 2, 2, 2]]])
  plurality, coverage = patch_grid.patch_part_ids(labels, 2, 2, "plurality")
  foreground, _ = patch_grid.patch_part_ids(labels, 2, 2, "foreground")
  # Patch (0, 0): {0, 0, 2, 2}: a tie, won by the foreground part. Patch (0, 1): {1, 2, 2, 2}.
  np.testing.assert_array_equal(plurality[0], [[0, 2], [1, 2]])
  np.testing.assert_array_equal(foreground[0], [[0, 1], [1, 2]])
  np.testing.assert_allclose(coverage[0, 0, 1], [0, 0.25, 0.75])
  np.testing.assert_allclose(coverage.sum(-1), 1.0)
  with pytest.raises(ValueError, match="patch rule"):
    patch_grid.patch_part_ids(labels, 2, 2, "majority")
  with pytest.raises(ValueError, match="do not tile"):
    patch_grid.patch_part_ids(labels, 2, 3)
  with pytest.raises(ValueError, match="must lie in"):
    patch_grid.patch_part_ids(labels + 1, 2, 2)


def test_keypoint_parts_and_overlap():
  labels = np.array([[[0, 1], [2, 2]]])
  kp = np.array([[[0.5, 0.5], [1.9, 0.1], [1.0, 1.5], [5.0, 0.0]]])
  visible = np.array([[True, True, False, True]])
  np.testing.assert_array_equal(masks_lib.keypoint_parts(labels, kp, visible), [[0, 1, -1, -1]])
  masks = np.array([[[[1, 0], [0, 0]], [[0, 0], [1, 1]]]], bool)
  np.testing.assert_array_equal(masks_lib.mask_overlap(labels, masks, 2), [[[True, False],
                                                                           [False, False]]])


def test_ground_truth_masks_relabel_background_last():
  world = synthetic.SyntheticConfig(image_size=32, splits=(("test", 4),))
  src = synthetic.SyntheticParts(world, "test")
  batch = {k: np.stack([src[i][k] for i in range(2)]) for k in ("part_segmentation", "keypoints")}
  maps = masks_lib.GroundTruthMasks(5, world.part_names)(batch)
  seg = batch["part_segmentation"]
  np.testing.assert_array_equal(maps.labels == 5, seg == 0)
  np.testing.assert_array_equal(maps.labels[seg > 0], seg[seg > 0] - 1)
  gt = masks_lib.ground_truth_masks(batch)
  assert gt[0].shape == (2, 5, 32, 32) and gt[0][:, 0].sum() == (seg == 1).sum()
  with pytest.raises(ValueError, match="part_segmentation"):
    masks_lib.GroundTruthMasks(5, world.part_names)({"image": np.zeros((1, 4, 4, 3))})


def test_file_masks_layouts_and_errors(tmp_path):
  labels = np.array([[[0, 1], [2, 2]], [[1, 1], [0, 2]]], np.int32)  # K = 2, background last
  np.save(tmp_path / "last_test.npy", labels)
  batch = {"index": np.array([1, 0]), "image": np.zeros((2, 4, 4, 3))}
  cfg = config_lib.part_masks("file", path=str(tmp_path / "last_{split}.npy"))
  source = masks_lib.make_source(cfg, "test", 2, None)
  # Unnamed maps are discovered parts, 1-based; names given with the file are kept.
  assert source.num_parts == 2 and source.part_names == ("part 1", "part 2")
  named = config_lib.part_masks("file", path=str(tmp_path / "last_{split}.npy"),
                                part_names="head, tail")
  assert masks_lib.make_source(named, "test", 2, None).part_names == ("head", "tail")
  maps = source(batch)
  np.testing.assert_array_equal(maps.labels[1], np.repeat(np.repeat(labels[0], 2, 0), 2, 1))
  assert maps.foreground is None
  # Background first (0) with parts 1..K gives the same labels.
  first = np.where(labels == 2, 0, labels + 1)
  np.savez(tmp_path / "first.npz", test=first, train=first)
  cfg = config_lib.part_masks("file", path=str(tmp_path / "first.npz"), background="first")
  np.testing.assert_array_equal(masks_lib.make_source(cfg, "test", 2, None)(batch).labels,
                                maps.labels)
  # Soft maps [N, K + 1, H, W], background channel last.
  soft = np.eye(3, dtype=np.float32)[labels].transpose(0, 3, 1, 2)
  soft[:, :2] += 0.1 * np.arange(2)[None, :, None, None]  # foreground argmax: part 1 on background
  np.save(tmp_path / "soft.npy", soft)
  cfg = config_lib.part_masks("file", path=str(tmp_path / "soft.npy"), num_parts=2)
  soft_maps = masks_lib.make_source(cfg, "test", 2, None)(batch)
  np.testing.assert_array_equal(soft_maps.labels, maps.labels)
  assert soft_maps.foreground is not None and (soft_maps.foreground < 2).all()
  # Errors name the file and what is wrong.
  with pytest.raises(FileNotFoundError, match="missing.npy"):
    masks_lib.make_source(config_lib.part_masks("file", path=str(tmp_path / "missing.npy")),
                          "test", 2, None)
  with pytest.raises(ValueError, match="2 part maps for the 5 examples"):
    masks_lib.make_source(config_lib.part_masks("file", path=str(tmp_path / "last_test.npy")),
                          "test", 5, None)
  with pytest.raises(ValueError, match="3 channels but masks.num_parts is 4"):
    masks_lib.make_source(config_lib.part_masks("file", path=str(tmp_path / "soft.npy"),
                                                num_parts=4), "test", 2, None)
  with pytest.raises(ValueError, match="needs masks.path"):
    masks_lib.make_source(config_lib.part_masks("file"), "test", 2, None)


def test_stage1_mask_source_adapts_part_masks(monkeypatch):
  """The adapter around trained_part_model.TrainedPartModel (a stub from loading.load_trained_part_model here: training one
  is the Stage-1 tests' job)."""
  seen = {}

  class FakePartMasks:
    num_parts = 2
    meta = {"step": 7}
    params, frozen = {"prototypes": np.ones((2, 3), np.float32)}, {}

    def pixel_labels(self, images, mean, std):
      seen["norm"] = (mean, std)
      b, h, w = images.shape[:3]
      return np.full((b, h, w), 2, np.int32), np.zeros((b, h, w), np.int32)

  def load_trained_part_model(workdir):
    seen["workdir"] = workdir
    return FakePartMasks()

  monkeypatch.setattr(loading, "load_trained_part_model", load_trained_part_model)
  cfg = config_lib.part_masks("stage1", path="workdirs/cub_single")
  source = masks_lib.make_source(cfg, "test", 1, None, (0.5,) * 3, (0.25,) * 3)
  maps = source({"image": np.zeros((3, 8, 8, 3), np.float32)})
  assert seen == {"workdir": "workdirs/cub_single", "norm": ((0.5,) * 3, (0.25,) * 3)}
  assert source.num_parts == 2 and maps.labels.shape == (3, 8, 8) and maps.foreground is not None
  assert source.part_names == ("part 1", "part 2")  # a trained workdir's parts have no GT names
  assert source.spec()["step"] == 7
  # Its cache identity is what the masks are a function of, not where the workdir is.
  assert "path" not in source.spec() and len(source.spec()["params"]) == 16
  with pytest.raises(ValueError, match="training workdir"):
    masks_lib.make_source(config_lib.part_masks("stage1"), "test", 1, None)


def test_probe_report_names_discovered_parts_part_k_with_their_best_match(tmp_path):
  """A trained workdir's parts (masks.source = stage1) in report.md and its figures: "part k",
  with "(≈ group)" the group of the contingency row's largest entry; a part without keypoints
  stays "part k"; the matched-parts column keeps the short name; ground-truth names only appear
  as columns and matches."""
  import ml_collections
  from metonymy.evaluation import part_names
  from metonymy.probe import report
  config = ml_collections.ConfigDict({
      "data": {"dataset": "synthetic"}, "seeds": [0], "report": {"title": ""},
      "masks": {"source": "stage1", "patch_rule": "plurality"}, "features": {"prefix": "cls"}})
  groups = ["head", "tail"]
  names = part_names.discovered_names(3)  # the stage1 source's names (its test, above)
  seed0 = {"backbone": "tiny", "seed": 0, "dataset": "synthetic", "num_parts": 3,
           "part_names": names, "groups": groups, "keypoint_groups": groups,
           "maskings": ["late"], "probes": {"late": {"weight_decay": 0.1}},
           "num_train": 8, "num_val": 4, "num_test": 4, "tau": 0.5,
           "assignment": [[False, True], [True, False], [False, False]],
           "assignment_source": ["contingency"] * 2, "ps_late": 0.1,
           "map_matrix_late": [[0.5, 0.4], [0.4, 0.5], [0.3, 0.3]],
           "contingency": [[0.1, 0.7], [0.8, 0.2], [0.0, 0.0], [0.1, 0.1]]}
  results = report.build_results(config, {"tiny": [seed0]}, {})
  written = report.write(str(tmp_path), config, results, visuals={}, arch={})
  text = (tmp_path / "report.md").read_text()
  assert "| part 1 (≈ tail) | 0.500 | 0.400 |" in text
  assert "| part 2 (≈ head) | 0.400 | 0.500 |" in text
  assert "| part 3 | 0.300 | 0.300 |" in text
  assert "| head | part 2 | contingency |" in text  # K_g^+ lists the short names
  assert "P0" not in text and "| head (" not in text
  assert any(path.endswith("contingency_tiny.png") for path in written)


# ------------------------------------------------------------------------------------------------
# Features.


def test_late_and_early_feature_pooling():
  tokens = jnp.arange(12, dtype=jnp.float32).reshape(1, 3, 4)  # B=1, N=3, D=4
  weights = jnp.array([[[1.0, 0.0], [1.0, 0.0], [0.0, 0.0]]])  # part 1 has no patch
  feats, present = features_lib.late_features(tokens, weights)
  np.testing.assert_allclose(feats[0, 0], tokens[0, :2].mean(0))
  np.testing.assert_allclose(feats[0, 1], 0.0)
  np.testing.assert_array_equal(present, [[True, False]])
  part_tokens = jnp.arange(2 * 3 * 2 * 4, dtype=jnp.float32).reshape(2, 3, 2, 4)  # K = 2, P = 2
  np.testing.assert_allclose(features_lib.early_features(part_tokens, 2, "cls"),
                             part_tokens[:, :2, 0])
  np.testing.assert_allclose(features_lib.early_features(part_tokens, 2, "cls_registers"),
                             part_tokens[:, :2].mean(2))
  ids = jnp.array([[[0, 1], [2, 2]]])
  cov = jax.nn.one_hot(ids, 3)
  np.testing.assert_allclose(features_lib.patch_weights(ids, cov, 2, "hard"),
                             features_lib.patch_weights(ids, cov, 2, "coverage"))


def test_manual_assignment_parses_and_names_the_offending_value():
  assignment, named = benchmark.parse_manual_assignment(" hair:2, 0 ;hat:", ["hat", "hair"], 3)
  np.testing.assert_array_equal(assignment, [[False, True], [False, False], [False, True]])
  assert named == ["hair", "hat"]  # 'hat:' names the group with no parts.
  assert benchmark.parse_manual_assignment("", ["hat"], 3)[1] == []
  for spec, offending in (("hair", "'hair'"), ("hair:x", "'hair:x'"), ("wig:1", "'wig'"),
                          ("hair:3", "part 3")):
    with pytest.raises(ValueError, match="evaluation.manual_assignment") as e:
      benchmark.parse_manual_assignment(spec, ["hat", "hair"], 3)
    assert offending in str(e.value)


# ------------------------------------------------------------------------------------------------
# Linear probes.


def test_probes_match_sklearn_logistic_regression():
  rng = np.random.default_rng(0)
  s, k, d, a = 400, 2, 12, 4
  x = (rng.standard_normal((s, k, d)) * rng.uniform(0.2, 4, (1, 1, d)) + 2).astype(np.float32)
  z = x[:, 0] @ rng.standard_normal((d, a)) * 0.3
  y = (rng.random((s, a)) < 1 / (1 + np.exp(-(z - z.mean(0))))).astype(np.float32)
  valid = rng.random((s, a)) > 0.1
  lam = 1e-2
  cfg = linear.ProbeConfig(weight_decays=(lam,), max_iters=300, tol=1e-9)
  probes = linear.train_probes(x, y, valid, x[:50], y[:50], None, cfg)
  logits = probes.logits(x)
  for part in range(k):
    standardized = (x[:, part] - x[:, part].mean(0)) / x[:, part].std(0)
    for attr in range(a):
      keep = valid[:, attr]
      ref = LogisticRegression(C=1 / (lam * keep.sum()), tol=1e-12, max_iter=10000).fit(
          standardized[keep], y[keep, attr]).decision_function(standardized)
      np.testing.assert_allclose(logits[:, part, attr], ref, atol=2e-3 * np.abs(ref).max())


@pytest.mark.slow
def test_probe_parts_are_independent_and_weight_decay_is_chosen_on_val():
  rng = np.random.default_rng(1)
  x = rng.standard_normal((300, 3, 8)).astype(np.float32)
  y = (x[:, 0, :4] + 0.5 * rng.standard_normal((300, 4)) > 0.8).astype(np.float32)
  cfg = linear.ProbeConfig(weight_decays=(1.0, 1e-2, 1e-4), patience=0, tol=1e-7, max_iters=200)
  joint = linear.train_probes(x[:200], y[:200], None, x[200:], y[200:], None, cfg)
  single = linear.train_probes(x[:200, 1:2], y[:200], None, x[200:, 1:2], y[200:], None, cfg)
  np.testing.assert_allclose(joint.logits(x)[:, 1], single.logits(x[:, 1:2])[:, 0], atol=2e-3)
  assert joint.val_map.shape == (3, 3)
  np.testing.assert_array_equal(joint.weight_decay,
                                np.asarray(joint.path)[np.argmax(joint.val_map, axis=0)])
  with pytest.raises(ValueError, match="features must be"):
    linear.train_probes(x[:, :, :4], y, None, x, y, None, cfg)
  with pytest.raises(ValueError, match="weight_decays"):
    linear.ProbeConfig(weight_decays=(0.0,))


# ------------------------------------------------------------------------------------------------
# Cache and interrupted extraction.


def test_chunk_store_roundtrip_and_meta_check(tmp_path):
  store = cache_lib.ChunkStore(str(tmp_path / "s"), {"a": 1}, num_examples=5, chunk_size=2)
  assert store.num_chunks == 3 and store.missing() == [0, 1, 2]
  store.write(1, {"x": np.arange(2)})
  assert store.missing() == [0, 2] and not store.complete()
  with pytest.raises(ValueError, match="expected 1"):
    store.write(2, {"x": np.arange(2)})
  store.write(0, {"x": np.arange(2)})
  store.write(2, {"x": np.arange(1)})
  np.testing.assert_array_equal(store.load()["x"], [0, 1, 0, 1, 0])
  assert not [f for f in os.listdir(tmp_path / "s") if "tmp" in f]
  with pytest.raises(ValueError, match="different features"):
    cache_lib.ChunkStore(str(tmp_path / "s"), {"a": 2}, num_examples=5, chunk_size=2)


TINY_VIT = vit.ViTConfig(patch_size=4, width=32, depth=1, num_heads=2, mlp_dim=64,
                         pos_embed_grid=(8, 8), image_size=32)


def _tiny_setup(n=40, seed=0, correlation=0.0):
  world = synthetic.SyntheticConfig(image_size=32, correlation=correlation,
                                    splits=(("test", n),), seed=seed)
  source = synthetic.SyntheticParts(world, "test")
  model, params = vit.init_params(TINY_VIT, jax.random.PRNGKey(seed))
  transforms = transforms_lib.standard(32, train=False, mean=TINY_VIT.image_mean,
                                       std=TINY_VIT.image_std)
  return source, model, params, transforms


class _Counting:
  """A mask source that counts its calls and can fail on one, like a killed process."""

  def __init__(self, inner, fail_on=None):
    self.inner, self.fail_on, self.calls = inner, fail_on, 0
    self.num_parts, self.part_names = inner.num_parts, inner.part_names

  def __call__(self, batch):
    self.calls += 1
    if self.calls == self.fail_on:
      raise KeyboardInterrupt("simulated kill")
    return self.inner(batch)


def _extract(directory, source, model, params, transforms, mask_source):
  stores = {name: cache_lib.ChunkStore(os.path.join(directory, name), {"s": name}, len(source), 8)
            for name in ("labels", "late", "early")}
  return extract_lib.extract(
      source, stores=stores, mask_source=mask_source, patch_size=4, patch_rule="plurality",
      extractors=features_lib.make_extractors(model, 5), params=params, transforms=transforms,
      batch_size=4, progress=False), stores


@pytest.mark.slow
def test_interrupted_extraction_resumes_at_the_last_complete_chunk(tmp_path):
  source, model, params, transforms = _tiny_setup()
  gt = masks_lib.GroundTruthMasks(5, source.info.keypoint_groups)
  # Killed in the 5th batch: chunks 0 and 1 (2 batches of 4 each) are complete, chunk 2 is not.
  killed = _Counting(gt, fail_on=5)
  with pytest.raises(KeyboardInterrupt):
    _extract(str(tmp_path / "run"), source, model, params, transforms, killed)
  stores = {n: cache_lib.ChunkStore(str(tmp_path / "run" / n), {"s": n}, 40, 8)
            for n in ("labels", "late", "early")}
  assert all(s.missing() == [2, 3, 4] for s in stores.values())
  resumed = _Counting(gt)
  out, _ = _extract(str(tmp_path / "run"), source, model, params, transforms, resumed)
  assert resumed.calls == 6  # 24 remaining examples, 4 per batch: nothing redone
  reference, _ = _extract(str(tmp_path / "fresh"), source, model, params, transforms, gt)
  for stream in reference:
    for key in reference[stream]:
      np.testing.assert_array_equal(out[stream][key], reference[stream][key])
  assert out["late"]["features"].shape == (40, 5, 32)
  np.testing.assert_array_equal(out["labels"]["index"], np.arange(40))


@pytest.mark.slow
def test_file_masks_reproduce_ground_truth_features(tmp_path):
  source, model, params, transforms = _tiny_setup(n=8)
  gt = masks_lib.GroundTruthMasks(5, source.info.keypoint_groups)
  seg = np.stack([source[i]["part_segmentation"] for i in range(8)]).astype(np.int32)
  np.save(tmp_path / "maps.npy", seg)  # 0 = background, parts 1..5
  file_masks = masks_lib.FileMasks(str(tmp_path / "maps.npy"), "test", 8, 5, background="first")
  a, _ = _extract(str(tmp_path / "gt"), source, model, params, transforms, gt)
  b, _ = _extract(str(tmp_path / "file"), source, model, params, transforms, file_masks)
  for stream in ("late", "early"):
    np.testing.assert_array_equal(a[stream]["features"], b[stream]["features"])
  np.testing.assert_array_equal(a["labels"]["keypoint_part"], b["labels"]["keypoint_part"])


# ------------------------------------------------------------------------------------------------
# Causal leakage and the synthetic world.


@pytest.mark.slow
def test_causal_leakage_is_exactly_zero_under_early_masking():
  source, model, params, transforms = _tiny_setup(n=6)
  batch = [transforms(source[i]) for i in range(6)]
  images = np.stack([b["image"] for b in batch]).astype(np.float32)
  maps = masks_lib.GroundTruthMasks(5, source.info.keypoint_groups)(
      {"part_segmentation": np.stack([b["part_segmentation"] for b in batch])})
  ids, coverage = patch_grid.patch_part_ids(maps.labels, 5, 4)
  # The last row is padding: real donors come from the first 5 rows only.
  out = leakage_lib.batch_leakage(features_lib.make_extractors(model, 5), params, images, ids,
                                  coverage, 5, 4, num_valid=5)
  present = out["early"]["present"][:5]
  assert present.sum() > 5
  assert (out["early"]["change"][:5][present] == 0).all()
  assert (out["early"]["max_abs"][:5][present] == 0).all()
  assert (out["late"]["change"][:5][out["late"]["present"][:5]] > 1e-3).all()
  np.testing.assert_array_equal(leakage_lib.donor_order(6, 5), [1, 2, 3, 4, 0, 5])
  with pytest.raises(ValueError, match="at least 2"):
    leakage_lib.donor_order(4, 1)


def _synthetic_config():
  config = _load_config("probe_synthetic.py", "tiny")
  config.data.options.splits = {"train": 600, "val": 200, "test": 400}
  config.evaluation.bootstrap = 0
  config.evaluation.leakage_images = 16
  config.evaluation.overlay_images = 0
  return config


def _synthetic_run(tmp_path, seed, pretrain_steps, batch_size=16):
  from metonymy.training import pretraining as pretrain
  config = _synthetic_config()
  model, params, vit_config = loading.build_backbone(config.backbone, seed)
  if pretrain_steps:
    source, _, _ = benchmark.open_split(config.data, "train", 0)
    params = pretrain.pretrain(model, params, source, benchmark.eval_transforms(vit_config,
                                                                                config.data),
                               steps=pretrain_steps, batch_size=batch_size, images=600,
                               seed=seed, progress=False).params
  results, _ = benchmark.evaluate("tiny", model, params, vit_config, config, seed=seed,
                                  cache_root=str(tmp_path), progress=False)
  # What holds on every seed: early masking's causal leakage is exactly 0, late masking's is not.
  assert results["causal_leakage_early"] == 0.0
  assert results["causal_leakage_max_abs_change_early"] == 0.0
  assert results["causal_leakage_late"] > 0.05
  assert results["nmi_with_background"] == pytest.approx(100.0)  # ground truth = discovery
  return results


# PS (late, early) of the random-init tiny ViT on seeds 0 and 1, measured on 2026-11-30 (seed 2
# gave (0.317, 0.304): early - late = -0.013).
RANDOM_INIT_PS = {0: (0.3208, 0.3235), 1: (0.3147, 0.3164)}


@pytest.mark.slow
def test_synthetic_world_random_init_vit(tmp_path):
  """Correlation 0, ground-truth masks, random-init tiny ViT (issue 4's test).

  Causal leakage is asserted. The PS ordering early > late is not robust for random weights
  (measured over 3 seeds at 32 px / depth 2 and 9 runs at 48 px / depth 2-8: the difference is
  within +-0.015 with either sign): random attention mixes a near-uniform average of all tokens,
  mostly background, into every token, so late features move a lot (causal leakage 0.3-0.5) but
  other parts' attributes stay undecodable (off-diagonal late mAP only ~0.005 above early), and
  the own-part mAP differs between the two feature types by about as much. So instead of the
  ordering, the recorded PS values are asserted (to 0.01: another machine's float rounding moves
  them by far less), and that the gap stays within the noise band it was measured in; the
  ordering itself is the trained test's (below).
  """
  for seed, (late, early) in RANDOM_INIT_PS.items():
    (tmp_path / str(seed)).mkdir()
    r = _synthetic_run(tmp_path / str(seed), seed, 0)
    assert (r["ps_late"], r["ps_early"]) == pytest.approx((late, early), abs=0.01), (seed, r)
    assert r["ps_gap"] == pytest.approx(r["ps_early"] - r["ps_late"])
    assert abs(r["ps_gap"]) < 0.03, (seed, r["ps_gap"])


@pytest.mark.slow
def test_synthetic_world_briefly_trained_vit(tmp_path):
  """The same world after 400 steps (batch 16) of supervised pretraining (CLS and mean patch
  token predict all attributes): the backbone gathers object information into its patches, and
  late PS drops below early PS (measured: early - late = 0.030, 0.023, 0.057 on seeds 0-2)."""
  r = _synthetic_run(tmp_path, 0, 400)
  assert r["ps_early"] > r["ps_late"] + 0.01, (r["ps_late"], r["ps_early"])


# ------------------------------------------------------------------------------------------------
# Configs and the job.


@pytest.mark.parametrize("name,arg", [("probe_synthetic.py", ""), ("probe_synthetic.py", "tiny"),
                                      ("probe_synthetic.py", "trained"),
                                      ("probe_cub.py", ""), ("probe_celeba.py", ""),
                                      ("probe_chexpert.py", ""),
                                      ("probe_suite.py", "dataset=cub"),
                                      ("probe_suite.py", "dataset=synthetic")])
def test_probe_configs_load(name, arg):
  config = _load_config(name, arg)
  assert config.job == "probe"
  assert "backbone" in config or "backbones" in config


def test_real_data_config_without_checkpoint_fails_clearly(tmp_path):
  from metonymy.probe import job
  config = _load_config("probe_cub.py")
  with pytest.raises(ValueError, match="--config.backbone.checkpoint=PATH"):
    job.run(config, str(tmp_path))


def _tiny_real_config(name, root, masks_path):
  """A real-data probe config shrunk to a random-init 32-px ViT on a fixture dataset."""
  config = _load_config(name)
  config.backbone = config_lib.random_backbone(
      patch_size=4, width=32, depth=1, num_heads=2, mlp_dim=64, pos_embed_grid=(8, 8),
      image_size=32)
  config.allow_random_backbone = True
  config.data.root = str(root)
  config.data.image_size = 32
  config.data.read_threads = 1
  config.data.max_train = 0
  config.masks.path = str(masks_path)
  config.masks.num_parts = 3
  config.features.batch_size = 4
  config.features.chunk_size = 8
  config.probe.weight_decays = (1.0, 0.1)
  config.evaluation.bootstrap = 3
  config.evaluation.leakage_images = 4
  config.evaluation.overlay_images = 2
  return config


def _position_baseline_by_hand(config, vit_config, seed):
  """NMI / ARI of the position baseline recomputed from the dataset: every train and test
  example through the probe's transforms, train carved as the benchmark carves it when the
  dataset has no val split, k-means with masks.num_parts clusters."""
  transforms = benchmark.eval_transforms(vit_config, config.data)
  arrays = {}
  for role in ("train", "test"):
    source, info, _ = benchmark.open_split(config.data, config.data[role],
                                           int(config.data[f"max_{role}"]))
    examples = [transforms(source[i]) for i in range(len(source))]
    arrays[role] = {"labels": {"index": np.arange(len(examples)),
                               "keypoints": np.stack([e["keypoints"] for e in examples]),
                               "keypoint_visible": np.stack([e["keypoint_visible"]
                                                             for e in examples])}}
  train = arrays["train"]
  if not config.data.val:
    train, _ = benchmark.carve_validation(train, float(config.data.val_fraction), seed)
  size = (int(config.data.image_size),) * 2
  baseline = position_baseline.fit(train["labels"]["keypoints"],
                                   train["labels"]["keypoint_visible"], size,
                                   int(config.masks.num_parts), seed=seed)
  scores = baseline.scores(arrays["test"]["labels"]["keypoints"],
                           arrays["test"]["labels"]["keypoint_visible"], size,
                           keypoint_group=info.keypoint_group_array())
  return scores["parts/position_NMI"], scores["parts/position_ARI"]


@pytest.mark.slow
@pytest.mark.parametrize("dataset", ["cub", "celeba", "chexpert"])
def test_probe_job_on_fixture_datasets(tmp_path, dataset):
  """The real-data path: official layouts (miniature fixtures), part maps from files, resize and
  crop to the backbone, CUB's carved val split and keypoint contingency, the position baseline
  beside NMI / ARI on CUB and CelebA, CheXpert's MPPO."""
  from metonymy.data import fixtures as data_fixtures
  from metonymy import data as data_lib
  from metonymy.probe import job
  if dataset == "cub":
    fx = data_fixtures.make_cub(tmp_path / "data", n_images=24)
    root, splits, name = fx.root, ("train", "test"), "probe_cub.py"
  elif dataset == "celeba":
    fx = data_fixtures.make_celeba(tmp_path / "data", n_images=60)
    root, splits, name = fx.root, ("train", "val", "test"), "probe_celeba.py"
  else:
    fx = data_fixtures.make_chexpert(tmp_path / "data")
    root, splits, name = tmp_path / "data", ("train", "valid", "test"), "probe_chexpert.py"
  rng = np.random.default_rng(0)
  options = {"uncertainty": "ignore", "frontal_only": True} if dataset == "chexpert" else {}
  for split in splits:
    n = len(data_lib.make_source(dataset, str(root), split, **options))
    np.save(tmp_path / f"maps_{split}.npy", rng.integers(0, 4, (n, 8, 8)).astype(np.int32))
  config = _tiny_real_config(name, root, tmp_path / "maps_{split}.npy")
  if dataset == "cub":  # The metrics only (the job and its report: CelebA, CheXpert).
    model, params, vit_config = loading.build_backbone(config.backbone, 0)
    results, _ = benchmark.evaluate("tiny", model, params, vit_config, config, seed=0,
                                    cache_root=str(tmp_path / "cache"), progress=False)
    assert results["causal_leakage_early"] == 0.0
    assert np.shape(results["map_matrix_early"]) == (3, 7)
    assert np.shape(results["contingency"]) == (4, 7)  # 3 parts + background x 7 groups
    assert results["num_val"] == round(0.2 * results["num_examples"]["train"])  # carved
    assert "mppo_late" not in results
  elif dataset == "celeba":
    vit_config = loading.build_backbone(config.backbone, 0)[2]
    results = job.run(config, str(tmp_path / "work"))
    report = (tmp_path / "work" / "report.md").read_text()
    assert "| chance: keypoint position alone (k-means, 3 clusters, on the " in report
    assert f"| {results['nmi_position']:.2f} [" in report
  if dataset in ("cub", "celeba"):  # Keypoints: the position baseline is the chance row.
    seed0 = (next(iter(results["backbones"].values()))["seeds"][0] if "backbones" in results
             else results)
    assert seed0["position_baseline"]["num_clusters"] == 3  # K of the part maps
    nmi, ari = _position_baseline_by_hand(config, vit_config, seed=0)
    assert results["nmi_position"] == pytest.approx(nmi) and 0.0 <= nmi <= 100.0
    assert results["ari_position"] == pytest.approx(ari)
    # Bootstrapped like the parts' NMI (resampling duplicates points and inflates NMI, so the
    # percentile interval need not hold the point estimate).
    low, high = results["nmi_position_ci"]
    assert 0.0 <= low <= high <= 100.0
  elif dataset == "chexpert":
    results = job.run(config, str(tmp_path / "work"))
    assert results["causal_leakage_early"] == 0.0
    assert np.shape(results["map_matrix_early"]) == (3, 10)
    assert results["ps_late"] is None  # no keypoints: PS undefined, MPPO instead
    assert "mppo_late" in results
    files = set(os.listdir(tmp_path / "work"))
    assert {"report.md", "results.json", "table1.png", "table2.png"} <= files


@pytest.mark.slow
def test_probe_job_smoke(tmp_path):
  workdir = tmp_path / "probe"
  proc = subprocess.run(
      [sys.executable, "-m", "metonymy.main", "--config=configs/probe_synthetic.py:tiny",
       f"--workdir={workdir}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  files = set(os.listdir(workdir))
  assert {"report.md", "results.json", "table1.png"} <= files
  assert any(f.startswith("map_matrices_") for f in files)
  assert any(f.startswith("ps_scatter_") for f in files)
  assert any(f.startswith("overlays_") for f in files)
  assert any(f.startswith("contingency_") for f in files)
  results = json.loads((workdir / "results.json").read_text())
  for key in ("ps_late", "ps_early", "causal_leakage_late", "causal_leakage_early",
              "map_matrix_late", "map_matrix_early"):
    assert key in results, key
  assert results["causal_leakage_early"] == 0.0
  assert np.shape(results["map_matrix_late"]) == (5, 5)
  assert "Table 1" in (workdir / "report.md").read_text()
  # TensorBoard shows the benchmark too: its numbers, its figures and the config.
  shown = writers.read_tensorboard(str(workdir))
  name = next(iter(results["backbones"]))
  assert {f"{name}/ps_late", f"{name}/ps_early", f"{name}/causal_leakage_late"} <= shown["scalars"]
  assert "figures/table1" in shown["images"] and any(
      t.startswith("figures/map_matrices_") for t in shown["images"])
  assert "config" in shown["text"]
