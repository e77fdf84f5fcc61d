"""Metrics of metonymy/evaluation against hand-computed cases and scikit-learn (issue 4)."""

import math

import numpy as np
import pytest
from sklearn import metrics as skm

from metonymy.evaluation import bootstrap
from metonymy.evaluation import metrics
from metonymy.evaluation import part_metrics
from metonymy.probe import linear


# ------------------------------------------------------------------------------------------------
# AP / AUROC.


def test_average_precision_and_auroc_hand_computed():
  scores = np.array([0.9, 0.8, 0.7, 0.6])
  labels = np.array([1, 0, 1, 0])
  # Positives at ranks 1 and 3: AP = (1/1 + 2/3) / 2.
  assert metrics.average_precision(scores, labels) == pytest.approx((1 + 2 / 3) / 2)
  # Pairs (pos > neg): 0.9 beats both negatives, 0.7 beats 0.6 only: 3 of 4.
  assert metrics.roc_auc(scores, labels) == pytest.approx(0.75)
  # A tie between a positive and a negative counts half, and shares one precision value.
  tied = np.array([0.5, 0.5, 0.1])
  assert metrics.roc_auc(tied, np.array([1, 0, 0])) == pytest.approx(0.75)
  assert metrics.average_precision(tied, np.array([1, 0, 0])) == pytest.approx(0.5)


def test_undefined_columns_are_nan():
  scores = np.random.default_rng(0).standard_normal((10, 2))
  labels = np.zeros((10, 2))
  labels[:, 1] = 1
  ap = metrics.average_precision(scores, labels)
  auc = metrics.roc_auc(scores, labels)
  assert math.isnan(ap[0]) and ap[1] == pytest.approx(1.0)
  assert np.isnan(auc).all()  # one class only in both columns


@pytest.mark.parametrize("seed", [0, 1])
def test_ap_auroc_match_sklearn_with_ties_and_weights(seed):
  rng = np.random.default_rng(seed)
  scores = np.round(rng.standard_normal((300, 12)), 1)  # many ties
  labels = (rng.random((300, 12)) < 0.3).astype(int)
  weights = rng.integers(0, 4, 300).astype(float)
  ap = metrics.average_precision(scores, labels, weights)
  auc = metrics.roc_auc(scores, labels, weights)
  for m in range(12):
    assert ap[m] == pytest.approx(skm.average_precision_score(labels[:, m], scores[:, m],
                                                              sample_weight=weights), abs=1e-12)
    assert auc[m] == pytest.approx(skm.roc_auc_score(labels[:, m], scores[:, m],
                                                     sample_weight=weights), abs=1e-12)
  # Integer weights are multiplicities: the same as sklearn on the resampled data.
  rows = np.repeat(np.arange(300), weights.astype(int))
  assert ap[3] == pytest.approx(skm.average_precision_score(labels[rows, 3], scores[rows, 3]))


def test_sorted_columns_equal_direct_computation():
  rng = np.random.default_rng(3)
  scores = np.round(rng.standard_normal((200, 7)), 1)
  labels = (rng.random((200, 7)) < 0.4).astype(int)
  valid = rng.random((200, 7)) > 0.2
  cols = metrics.SortedColumns(scores, labels, valid)
  for _ in range(3):
    w = rng.multinomial(200, np.full(200, 1 / 200)).astype(float)
    np.testing.assert_allclose(cols.average_precision(w),
                               metrics.average_precision(scores, labels, w[:, None] * valid),
                               atol=1e-12)
    np.testing.assert_allclose(cols.roc_auc(w), metrics.roc_auc(scores, labels, w[:, None] * valid),
                               atol=1e-12)


def test_map_matrix_groups_attributes():
  rng = np.random.default_rng(0)
  labels = (rng.random((50, 4)) < 0.5).astype(float)
  logits = np.stack([labels * 2 - 1, rng.standard_normal((50, 4))], 1)  # part 0 perfect
  m = metrics.map_matrix(logits, labels, None, [0, 0, 1, 1], 2)
  assert m.shape == (2, 2)
  np.testing.assert_allclose(m[0], 1.0)
  ap = metrics.average_precision(logits[:, 1], labels)
  np.testing.assert_allclose(m[1], [ap[:2].mean(), ap[2:].mean()])
  with pytest.raises(ValueError, match="attribute_group"):
    metrics.group_mean(np.zeros((2, 4)), [0, 0, 1, 5], 2)


# ------------------------------------------------------------------------------------------------
# Contingency, assignment, PS, MPPO.


def test_contingency_and_threshold_assignment_hand_computed():
  # 2 parts (ids 0, 1), background id 2, 2 groups; -1 = invisible.
  keypoint_part = np.array([[0, 1], [0, 2], [-1, 1]])
  c = part_metrics.contingency(keypoint_part, num_parts=2)
  np.testing.assert_allclose(c, [[1, 0], [0, 2 / 3], [0, 1 / 3]])
  np.testing.assert_array_equal(part_metrics.assign_by_threshold(c, 0.5), [[True, False],
                                                                          [False, True]])
  # The background row never joins a group, whatever tau.
  assert part_metrics.assign_by_threshold(c, 0.0).shape == (2, 2)
  with pytest.raises(ValueError, match="tau"):
    part_metrics.assign_by_threshold(c, 1.0)
  with pytest.raises(ValueError, match="keypoint_part values"):
    part_metrics.contingency(np.array([[3]]), num_parts=2)


def test_contingency_counts_every_keypoint_of_a_group():
  # Keypoints: left wing, right wing (group 0), left leg, right leg (group 1); 2 parts, bg 2.
  keypoint_group = [0, 0, 1, 1]
  keypoint_part = np.array([[0, 0, 1, 1],
                            [0, 1, 1, -1]])
  # Wing: 4 points, 3 on part 0, 1 on part 1; leg: 3 visible points, all on part 1.
  c = part_metrics.contingency(keypoint_part, num_parts=2, keypoint_group=keypoint_group)
  np.testing.assert_allclose(c, [[3 / 4, 0], [1 / 4, 1], [0, 0]])
  with pytest.raises(ValueError, match="group of 3 keypoints"):
    part_metrics.contingency(keypoint_part, num_parts=2, keypoint_group=[0, 0, 1])
  with pytest.raises(ValueError, match="every group id"):
    part_metrics.contingency(keypoint_part, num_parts=2, keypoint_group=[0, 0, 2, 2])


def test_manual_assignment():
  a = part_metrics.assign_manually({"head": [0, 2], "legs": [1]}, ["head", "legs", "tail"], 3)
  np.testing.assert_array_equal(a, [[1, 0, 0], [0, 1, 0], [1, 0, 0]])
  with pytest.raises(ValueError, match="unknown groups"):
    part_metrics.assign_manually({"wing": [0]}, ["head"], 3)
  with pytest.raises(ValueError, match="part 7"):
    part_metrics.assign_manually({"head": [7]}, ["head"], 3)


def test_part_specificity_hand_computed():
  map_matrix = np.array([[0.8, 0.3, 0.5],
                         [0.2, 0.6, 0.5],
                         [0.4, 0.5, 0.5]])
  assignment = np.array([[1, 0, 0],
                         [0, 1, 0],
                         [0, 1, 0]], bool)  # group 2 has no matched part: undefined
  ps_g, ps = part_metrics.part_specificity(map_matrix, assignment)
  # PS_0 = 0.8 - (0.2 + 0.4) / 2; PS_1 = (0.6 + 0.5) / 2 - 0.3.
  np.testing.assert_allclose(ps_g[:2], [0.5, 0.25])
  assert math.isnan(ps_g[2])
  assert ps == pytest.approx(0.375)
  matched, other = part_metrics.specificity_terms(map_matrix, assignment)
  np.testing.assert_allclose(matched[:2], [0.8, 0.55])
  np.testing.assert_allclose(other, [0.3, 0.3, 0.5])
  assert math.isnan(matched[2])
  # Every part matched: K_g^- is empty, PS_g undefined.
  _, ps_all = part_metrics.part_specificity(map_matrix, np.ones((3, 3), bool))
  assert math.isnan(ps_all)


def test_mppo_hand_computed():
  # 3 samples, 2 parts, 2 attributes, 2 masks; attribute a's mask is a.
  logits = np.array([[[2.0, 0.0], [1.0, 5.0]],     # a0 -> part 0, a1 -> part 1
                     [[0.0, 3.0], [1.0, 1.0]],     # a0 -> part 1, a1 -> part 0
                     [[0.0, 0.0], [1.0, 0.0]]])    # a0 -> part 1
  overlap = np.array([[[1, 0], [0, 1]],            # part 0 meets mask 0, part 1 meets mask 1
                      [[1, 1], [0, 0]],
                      [[1, 0], [1, 0]]], bool)
  present = np.array([[1, 1], [1, 1], [1, 0]], bool)
  per, value = part_metrics.mppo(logits, overlap, present, [0, 1])
  # a0: s0 part 0 meets mask 0 (hit), s1 part 1 misses mask 0, s2 part 1 meets mask 0 -> 2/3.
  # a1: s0 part 1 meets mask 1 (hit), s1 part 0 meets mask 1 (hit) -> 1.
  np.testing.assert_allclose(per, [2 / 3, 1.0])
  assert value == pytest.approx(5 / 6)
  per_w, _ = part_metrics.mppo(logits, overlap, present, [0, 1], weights=np.array([0, 1, 1.0]))
  np.testing.assert_allclose(per_w, [0.5, 1.0])


# ------------------------------------------------------------------------------------------------
# NMI / ARI.


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nmi_ari_match_sklearn(seed):
  rng = np.random.default_rng(seed)
  truth = rng.integers(0, 5, 400)
  pred = np.where(rng.random(400) < 0.6, truth, rng.integers(0, 6, 400))
  counts = np.zeros((5, 6))
  np.add.at(counts, (truth, pred), 1)
  nmi, ari = part_metrics.nmi_ari_from_counts(counts)
  assert nmi == pytest.approx(skm.normalized_mutual_info_score(truth, pred), abs=1e-12)
  assert ari == pytest.approx(skm.adjusted_rand_score(truth, pred), abs=1e-12)


def test_nmi_ari_edge_cases_match_sklearn():
  for truth, pred in (([0, 0, 0], [1, 1, 1]), ([0, 0, 1, 1], [0, 0, 0, 0]),
                      ([0, 0, 1, 1], [0, 1, 0, 1]), ([0, 1, 2], [0, 1, 2])):
    counts = np.zeros((3, 3))
    np.add.at(counts, (np.array(truth), np.array(pred)), 1)
    nmi, ari = part_metrics.nmi_ari_from_counts(counts)
    assert nmi == pytest.approx(skm.normalized_mutual_info_score(truth, pred))
    assert ari == pytest.approx(skm.adjusted_rand_score(truth, pred))


def test_keypoint_nmi_ari_with_and_without_background():
  rng = np.random.default_rng(0)
  groups = 4
  kp = np.tile(np.arange(groups), (60, 1))  # part k under keypoint k: perfect
  kp[rng.random(kp.shape) < 0.2] = groups  # some on the background (id K = 4)
  kp[rng.random(kp.shape) < 0.1] = -1  # some invisible
  visible = kp >= 0
  truth = np.broadcast_to(np.arange(groups), kp.shape)[visible]
  with_bg = part_metrics.keypoint_nmi_ari(kp, groups, include_background=True)
  assert with_bg["nmi"] == pytest.approx(100 * skm.normalized_mutual_info_score(truth, kp[visible]))
  assert with_bg["ari"] == pytest.approx(100 * skm.adjusted_rand_score(truth, kp[visible]))
  fg = part_metrics.keypoint_nmi_ari(kp, groups, include_background=False)
  assert fg["nmi"] == pytest.approx(100.0) and fg["ari"] == pytest.approx(100.0)
  assert fg["num_points"] == (visible & (kp < groups)).sum()
  # Soft maps give a foreground argmax for every visible keypoint.
  kp_fg = np.where(kp >= 0, np.broadcast_to(np.arange(groups), kp.shape), -1)
  soft = part_metrics.keypoint_nmi_ari(kp, groups, include_background=False,
                                       keypoint_part_foreground=kp_fg)
  assert soft["num_points"] == visible.sum()


def test_keypoint_nmi_ari_two_points_per_group_hand_computed():
  # Two groups of two keypoints each (wing: left + right, leg: left + right), K = 2 parts.
  keypoint_group = [0, 0, 1, 1]
  # Each group has one point on each part: the parts say nothing about the group.
  # n = [[1, 1], [1, 1]]: MI = 0 -> NMI = 0. Pairs: N = 4, sum C(n_ij, 2) = 0,
  # A = B = 2 C(2, 2) = 2, E = A B / C(4, 2) = 2/3, ARI = (0 - 2/3) / ((2 + 2) / 2 - 2/3) = -1/2.
  r = part_metrics.keypoint_nmi_ari(np.array([[0, 1, 0, 1]]), 2, keypoint_group=keypoint_group)
  assert r["nmi"] == pytest.approx(0.0, abs=1e-9) and r["ari"] == pytest.approx(-50.0)
  assert r["num_points"] == 4
  # Were every keypoint its own group (4 singletons against 2 parts): MI = H(parts) = log 2,
  # NMI = log 2 / ((log 4 + log 2) / 2) = 2/3; A = 0 so E = 0 and ARI = 0.
  r = part_metrics.keypoint_nmi_ari(np.array([[0, 1, 0, 1]]), 2)
  assert r["nmi"] == pytest.approx(200 / 3) and r["ari"] == pytest.approx(0.0, abs=1e-9)

  # Two birds: wings on parts (0, 0) and (0, 1), legs on (1, 1) and (1, 1), one leg on the
  # background (id 2) in the second bird. Points per (group, part): wing 0: 3, wing 1: 1,
  # leg 1: 3, leg background: 1; N = 8, groups a = (4, 4), parts b = (3, 4, 1).
  kp = np.array([[0, 0, 1, 1],
                 [0, 1, 1, 2]])
  log = np.log
  mi = (3 / 8 * log(8 * 3 / (4 * 3)) + 1 / 8 * log(8 * 1 / (4 * 4))
        + 3 / 8 * log(8 * 3 / (4 * 4)) + 1 / 8 * log(8 * 1 / (4 * 1)))
  h_groups = log(2)
  h_parts = -(3 / 8 * log(3 / 8) + 4 / 8 * log(4 / 8) + 1 / 8 * log(1 / 8))
  nmi = mi / ((h_groups + h_parts) / 2)
  # sum C(n_ij, 2) = 3 + 0 + 3 + 0 = 6; A = 2 C(4, 2) = 12; B = C(3, 2) + C(4, 2) = 9;
  # E = 12 * 9 / C(8, 2) = 27/7; ARI = (6 - 27/7) / ((12 + 9) / 2 - 27/7) = 30/93.
  ari = 30 / 93
  r = part_metrics.keypoint_nmi_ari(kp, 2, include_background=True, keypoint_group=keypoint_group)
  assert r["nmi"] == pytest.approx(100 * nmi) and r["ari"] == pytest.approx(100 * ari)
  assert r["num_points"] == 8
  # Without the background the leg point on it is dropped: wing (3, 1), leg (0, 3), N = 7.
  fg = part_metrics.keypoint_nmi_ari(kp, 2, include_background=False,
                                     keypoint_group=keypoint_group)
  truth, pred = [0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1]
  assert fg["num_points"] == 7
  assert fg["nmi"] == pytest.approx(100 * skm.normalized_mutual_info_score(truth, pred))
  assert fg["ari"] == pytest.approx(100 * skm.adjusted_rand_score(truth, pred))


# ------------------------------------------------------------------------------------------------
# Mask coverage (Fig. 4).


def test_mask_coverage_half_a_part_and_a_part_that_spills_over_twice_its_area():
  # One image on a 4 x 4 patch grid; G = 3 true parts (background id 3), K = 3 discovered parts
  # (background id 3).
  truth = np.array([[0, 0, 1, 3],
                    [0, 0, 1, 3],
                    [2, 2, 3, 3],
                    [2, 2, 3, 3]])
  found = np.array([[1, 1, 0, 0],   # part 1 holds the top half of true part 0;
                    [3, 3, 0, 0],   # part 0 all of true part 1 and as much background again;
                    [3, 3, 3, 3],   # true part 2 is background but for one patch of part 2
                    [3, 2, 3, 3]])
  counts = part_metrics.patch_confusion(truth, found, num_true_parts=3, num_parts=3)
  assert counts.shape == (4, 4) and counts.sum() == 16
  assert counts[0, 1] == 2 and counts[0, 3] == 2 and counts[1, 0] == 2 and counts[3, 0] == 2
  out = part_metrics.mask_coverage(counts)
  # The background column never matches a part: true part 2's best match is part 2 (1 patch),
  # not the background (3 patches).
  np.testing.assert_array_equal(out["best_part"], [1, 0, 2])
  np.testing.assert_allclose(out["coverage"], [0.5, 1.0, 0.25])
  np.testing.assert_allclose(out["area_ratio"], [0.5, 2.0, 0.25])
  # Pooled over a set: the counts add, and a part never present has no coverage.
  twice = part_metrics.patch_confusion(np.stack([truth, truth]), np.stack([found, found]), 3, 3)
  np.testing.assert_allclose(part_metrics.mask_coverage(twice)["coverage"], out["coverage"])
  absent = part_metrics.mask_coverage(part_metrics.patch_confusion(
      np.where(truth == 2, 3, truth), found, 3, 3))
  assert np.isnan(absent["coverage"][2]) and np.isnan(absent["area_ratio"][2])
  with pytest.raises(ValueError, match="same patch grid"):
    part_metrics.patch_confusion(truth, found[:2], 3, 3)
  with pytest.raises(ValueError, match="discovered part ids must lie in"):
    part_metrics.patch_confusion(truth, found + 1, 3, 3)


# ------------------------------------------------------------------------------------------------
# Bootstrap and seeds.


def test_bootstrap_interval_covers_the_mean():
  rng = np.random.default_rng(0)
  x = rng.normal(1.0, 1.0, 400)
  r = bootstrap.bootstrap(lambda w: (w * x).sum() / w.sum(), len(x), num_resamples=300, seed=0)
  assert r["value"] == pytest.approx(x.mean())
  assert r["low"] < x.mean() < r["high"]
  # About 2 standard errors each side.
  assert r["high"] - r["low"] == pytest.approx(2 * 1.96 * x.std() / 20, rel=0.25)
  counts = bootstrap.resample_counts(10, 5, seed=0, groups=np.repeat([0, 1], 5))
  assert counts.shape == (5, 10) and (counts[:, :5] == counts[:, :1]).all()
  none = bootstrap.bootstrap(lambda w: w.sum(), 5, num_resamples=0)
  assert none["value"] == 5 and math.isnan(none["low"])


def test_over_seeds_and_format():
  s = bootstrap.over_seeds([1.0, 2.0, 3.0])
  assert s["mean"] == pytest.approx(2.0) and s["std"] == pytest.approx(1.0) and s["n"] == 3
  assert math.isnan(bootstrap.over_seeds([1.0])["std"])
  arr = bootstrap.over_seeds([np.array([1.0, np.nan]), np.array([3.0, 4.0])])
  np.testing.assert_allclose(arr["mean"], [2.0, 4.0])
  agg = bootstrap.aggregate_scalars([{"a": 1.0, "b": 2.0}, {"a": 3.0}])
  assert list(agg) == ["a"]
  assert bootstrap.format_ci(0.5, 0.4, 0.6) == "0.500 [0.400, 0.600]"
  assert bootstrap.format_ci(float("nan"), 0, 1) == "n/a"


# ------------------------------------------------------------------------------------------------
# PS end to end on constructed features (probes + metrics).


def _constructed_features(leaky: bool, seed: int = 0, n: int = 1200, parts: int = 4, dim: int = 16):
  """Attributes: per group a one-hot colour out of 4. Leak-free: part k's feature encodes group
  k's colour only. Leaky: every part's feature encodes every group's colour."""
  rng = np.random.default_rng(seed)
  colours = rng.integers(0, 4, (n, parts))
  onehot = np.eye(4)[colours].reshape(n, parts * 4)  # [n, A = 16]
  x = np.zeros((n, parts, dim))
  for k in range(parts):
    if leaky:
      code = onehot @ rng.standard_normal((parts * 4, dim))
    else:
      code = onehot[:, 4 * k:4 * k + 4] @ rng.standard_normal((4, dim))
    x[:, k] = code + 0.3 * rng.standard_normal((n, dim))
  groups = np.repeat(np.arange(parts), 4)
  return x.astype(np.float32), onehot.astype(np.float32), groups


@pytest.mark.parametrize("leaky", [False, True])
def test_ps_of_constructed_features(leaky):
  x, y, groups = _constructed_features(leaky)
  cfg = linear.ProbeConfig(weight_decays=(1e-2, 1e-3))
  probes = linear.train_probes(x[:800], y[:800], None, x[800:1000], y[800:1000], None, cfg)
  m = metrics.map_matrix(probes.logits(x[1000:]), y[1000:], None, groups, 4)
  _, ps = part_metrics.part_specificity(m, np.eye(4, dtype=bool))
  if leaky:
    assert abs(ps) < 0.05, m  # every part predicts every group as well as its own
  else:
    assert ps > 0.5, m  # own group near 1, others at chance (0.25)
