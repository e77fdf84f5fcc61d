"""The synthetic parts world: determinism, ground truth consistency, correlation knob, tables."""

import pickle

import numpy as np
import pytest

from metonymy import data
from metonymy.data import base
from metonymy.data import synthetic

SMALL = synthetic.SyntheticConfig(image_size=48, splits=(("train", 500), ("val", 50)))


def _mutual_information(a: np.ndarray, b: np.ndarray) -> float:
  """Plug-in mutual information (bits) of two discrete samples."""
  joint = np.zeros((a.max() + 1, b.max() + 1))
  np.add.at(joint, (a, b), 1)
  joint /= joint.sum()
  pa, pb = joint.sum(1, keepdims=True), joint.sum(0, keepdims=True)
  nz = joint > 0
  return float((joint[nz] * np.log2(joint[nz] / (pa @ pb)[nz])).sum())


def test_example_keys_dtypes_shapes():
  src = synthetic.SyntheticParts(SMALL, "train")
  ex = src[3]
  g, a, n = SMALL.num_parts, src.info.num_attributes, SMALL.image_size
  expected = {"image": (np.uint8, (n, n, 3)), "attributes": (np.float32, (a,)),
              "attribute_valid": (np.bool_, (a,)), "keypoints": (np.float32, (g, 2)),
              "keypoint_visible": (np.bool_, (g,)), "part_segmentation": (np.uint8, (n, n)),
              "label": (np.int32, ()), "index": (np.int64, ())}
  assert set(ex) == set(expected)
  for key, (dtype, shape) in expected.items():
    assert ex[key].dtype == dtype and ex[key].shape == shape, key
  assert int(ex["index"]) == 3
  assert len(src) == 500 and len(synthetic.SyntheticParts(SMALL, "val")) == 50


def test_deterministic_and_random_access():
  a, b = synthetic.SyntheticParts(SMALL, "train"), synthetic.SyntheticParts(SMALL, "train")
  first = [a[i] for i in (7, 2, 7)]
  again = pickle.loads(pickle.dumps(b))[7]  # a worker's unpickled copy agrees too
  for key in first[0]:
    np.testing.assert_array_equal(first[0][key], first[2][key])
    np.testing.assert_array_equal(first[0][key], again[key])
  assert not np.array_equal(first[0]["image"], first[1]["image"])
  val = synthetic.SyntheticParts(SMALL, "val")[7]
  assert not np.array_equal(first[0]["image"], val["image"])
  other_seed = synthetic.SyntheticParts(SMALL.replace(seed=1), "train")[7]
  assert not np.array_equal(first[0]["image"], other_seed["image"])
  with pytest.raises(IndexError):
    a[500]
  with pytest.raises(base.DataError):
    synthetic.SyntheticParts(SMALL, "nope")


def test_attributes_are_one_hot_groups_matching_latents():
  cfg = SMALL.replace(num_shapes=3)
  src = synthetic.SyntheticParts(cfg, "train")
  per_part = cfg.num_colors + len(cfg.patterns) + cfg.num_shapes
  bounds = np.cumsum([0, cfg.num_colors, len(cfg.patterns), cfg.num_shapes])
  for i in range(20):
    ex, lat = src[i], src.latents(i)
    assert set(np.unique(ex["attributes"])) <= {0.0, 1.0} and ex["attribute_valid"].all()
    groups = ex["attributes"].reshape(cfg.num_parts, per_part)
    for k, name in enumerate(("color", "pattern", "shape")):
      block = groups[:, bounds[k]:bounds[k + 1]]
      np.testing.assert_array_equal(block.sum(1), 1)
      np.testing.assert_array_equal(block.argmax(1), lat[name])
    assert int(ex["label"]) == lat["species"]


def test_visible_keypoints_lie_on_their_part_and_show_its_colour():
  # Without noise a visible keypoint's pixel is exactly one of its part's two tones.
  cfg = synthetic.SyntheticConfig(image_size=64, noise=0.0, occlusion_prob=0.5,
                                  border_cut_prob=0.5)
  src = synthetic.SyntheticParts(cfg, "train")
  tones = np.clip(src._palette, 0, 255).astype(np.uint8)  # [colours, 2, 3]
  counts = np.zeros(2, int)
  for i in range(120):
    ex, lat = src[i], src.latents(i)
    for g, ((x, y), vis) in enumerate(zip(ex["keypoints"], ex["keypoint_visible"])):
      inside = 0 <= x < 64 and 0 <= y < 64
      if not vis:
        counts[1] += 1
        # Invisible: out of frame, or its pixel shows something else (occluder / other part).
        assert not inside or ex["part_segmentation"][int(y), int(x)] != g + 1
        continue
      counts[0] += 1
      assert ex["part_segmentation"][int(y), int(x)] == g + 1
      pixel = ex["image"][int(y), int(x)]
      assert (pixel == tones[lat["color"][g]]).all(1).any(), (i, g)
  assert counts[0] > 300 and counts[1] > 20  # both cases were exercised


def test_unoccluded_uncut_objects_show_every_keypoint():
  for size in (32, 64):
    cfg = synthetic.SyntheticConfig(image_size=size, occlusion_prob=0.0, border_cut_prob=0.0,
                                    num_shapes=3)
    src = synthetic.SyntheticParts(cfg, "train")
    assert all(src[i]["keypoint_visible"].all() for i in range(100)), size


def test_patterns_and_shapes_are_rendered():
  cfg = synthetic.SyntheticConfig(image_size=64, noise=0.0, occlusion_prob=0.0,
                                  border_cut_prob=0.0, num_shapes=3)
  src = synthetic.SyntheticParts(cfg, "train")
  head_area = {0: [], 1: [], 2: []}
  checked = 0
  for i in range(150):
    ex, lat = src[i], src.latents(i)
    head_area[int(lat["shape"][0])].append((ex["part_segmentation"] == 1).sum())
    for g in (0, 1, 2):  # head, body, wing: large enough to show a pattern
      pixels = ex["image"][ex["part_segmentation"] == g + 1]
      if len(pixels) < 40:
        continue
      checked += 1
      num_tones = len(np.unique(pixels, axis=0))
      if lat["pattern"][g] == 0:
        assert num_tones == 1, (i, g)
      else:
        assert num_tones == 2, (i, g)
  assert checked > 200
  # Square > round > pointed (areas 4ab, pi ab, 2ab).
  means = [np.mean(head_area[k]) for k in range(3)]
  assert means[1] > means[0] > means[2]


def test_correlation_zero_independent_one_dependent():
  n = 2000
  def stats(correlation):
    src = synthetic.SyntheticParts(SMALL.replace(correlation=correlation,
                                                 splits=(("train", n),)), "train")
    lats = [src.latents(i) for i in range(n)]
    head = np.array([l["color"][0] for l in lats])
    wing = np.array([l["color"][2] for l in lats])
    tail_pattern = np.array([l["pattern"][3] for l in lats])
    species = np.array([l["species"] for l in lats])
    return (_mutual_information(head, wing), _mutual_information(head, tail_pattern),
            _mutual_information(species, head))
  # Plug-in bias for 8x8 cells over 2000 samples is ~0.03 bits.
  independent = stats(0.0)
  assert max(independent) < 0.06, independent
  dependent = stats(1.0)
  assert dependent[0] > 1.0 and dependent[2] > 1.5, dependent
  assert 0.06 < stats(0.5)[0] < dependent[0]


def test_info_tables_consistent():
  cfg = synthetic.SyntheticConfig(num_shapes=0, part_names=("head", "wing", "legs"))
  src = synthetic.SyntheticParts(cfg, "train")
  info = src.info
  assert info.part_names == ("head", "wing", "legs") == info.keypoint_groups
  assert info.num_attributes == len(info.attribute_part) == 3 * (8 + 3)
  assert len(set(info.attribute_names)) == info.num_attributes
  assert info.attribute_groups() == {"head": 11, "wing": 11, "legs": 11}
  for name, part in zip(info.attribute_names, info.attribute_part):
    assert name.startswith(f"has_{info.part_names[part]}_")
  ex = src[0]
  assert ex["attributes"].shape == (info.num_attributes,) and ex["keypoints"].shape == (3, 2)
  assert set(np.unique(ex["part_segmentation"])) <= {0, 1, 2, 3}

  report = data.check("synthetic", None)
  assert report.dataset == "synthetic" and report.num_attributes == 65
  assert report.splits == {"train": 10000, "val": 1000, "test": 2000}
  assert report.keypoint_groups == list(synthetic.SyntheticConfig().part_names)
  assert list(report.attribute_groups.values()) == [13] * 5


def test_registry_and_config_validation():
  src = data.make_source("synthetic", "/ignored", "val", image_size=32, correlation=0.0,
                         splits={"train": 10, "val": 4})
  assert isinstance(src, synthetic.SyntheticParts) and len(src) == 4
  assert src[0]["image"].shape == (32, 32, 3)
  with pytest.raises(ValueError):
    data.make_source("synthetic", None, "train", not_an_option=1)
  with pytest.raises(ValueError):
    data.make_source("mnist", None, "train")
  for bad in ({"correlation": 1.5}, {"num_colors": 11}, {"part_names": ("head", "beak")},
              {"num_shapes": 1}, {"patterns": ("plaid",)}):
    with pytest.raises(ValueError):
      synthetic.SyntheticConfig.from_options(**bad)


def test_benchmark_runs():
  assert synthetic.benchmark_examples_per_second(SMALL, num_examples=20) > 0


def test_evidence_fraction_confines_the_attributes_to_a_disc_of_each_part():
  base_config = synthetic.SyntheticConfig(image_size=64, noise=0.0, occlusion_prob=0.0,
                                          border_cut_prob=0.0, correlation=0.0)
  config = base_config.replace(evidence_fraction=0.2)
  src, whole = synthetic.SyntheticParts(config, "train"), synthetic.SyntheticParts(base_config)
  tones = np.clip(src._palette, 0, 255).astype(np.uint8)  # [colours, 2, 3]
  shares = []
  for i in range(60):
    ex, lat = src[i], src.latents(i)
    assert "part_evidence" not in whole[i]  # evidence_fraction 1: every pixel is evidence
    # The knob moves no other draw: the same pose, parts and attributes.
    assert (ex["part_segmentation"] == whole[i]["part_segmentation"]).all()
    assert (ex["attributes"] == whole[i]["attributes"]).all()
    evidence = ex["part_evidence"]
    assert not (evidence & (ex["part_segmentation"] == 0)).any()
    for g in range(config.num_parts):
      part = ex["part_segmentation"] == g + 1
      if part.sum() < 30:
        continue
      colours = ex["image"][part & evidence]
      plain = ex["image"][part & ~evidence]
      # Inside the disc: the part's colour (and its pattern's tone); outside: one plain tone,
      # which is no palette colour of any part of the image.
      assert (colours[:, None] == tones[lat["color"][g]][None]).all(-1).any(-1).all(), (i, g)
      assert len(np.unique(plain, axis=0)) == 1, (i, g)
      assert not (plain[:1, None, None] == tones[None]).all(-1).any(), (i, g)
      shares.append((part & evidence).sum() / part.sum())
  # The disc covers the chosen fraction of the part's unit frame; overlaps shift it a little.
  assert 0.12 < np.mean(shares) < 0.3, np.mean(shares)


def test_pose_options_are_checked():
  with pytest.raises(ValueError, match="evidence_fraction"):
    synthetic.SyntheticConfig(evidence_fraction=0.0)
  with pytest.raises(ValueError, match="max_rotation"):
    synthetic.SyntheticConfig(max_rotation=190.0)
  with pytest.raises(ValueError, match="min_translation"):
    synthetic.SyntheticConfig(min_translation=1.5)


def test_part_plain_tones_tell_the_parts_apart_and_no_attribute():
  config = synthetic.SyntheticConfig(image_size=64, noise=0.0, occlusion_prob=0.0,
                                     border_cut_prob=0.0, correlation=0.0,
                                     evidence_fraction=0.2, plain_tone="part")
  src = synthetic.SyntheticParts(config, "train")
  centred = []  # per image: each part's plain tone minus the image's mean over its parts
  for i in range(40):
    ex = src[i]
    tone = [ex["image"][(ex["part_segmentation"] == g + 1) & ~ex["part_evidence"]]
            for g in range(config.num_parts)]
    if all(len(t) for t in tone):
      tone = np.stack([t[0].astype(float) for t in tone])
      centred.append(tone - tone.mean(0))
  centred = np.stack(centred)  # [images, parts, 3]
  # The lighting moves every part of an image alike: relative to each other the parts keep their
  # own tones (within the per-part shade), far enough apart to tell them from one another.
  assert len(centred) > 20 and centred.std(0).max() < 8, centred.std(0).max()
  means = centred.mean(0)
  nearest = min(np.abs(means[a] - means[b]).max() for a in range(5) for b in range(a + 1, 5))
  assert nearest > 15, nearest
  with pytest.raises(ValueError, match="plain_tone"):
    synthetic.SyntheticConfig(plain_tone="random")
