"""Real-dataset readers (CUB, CelebA, CheXpert + CheXlocalize) on miniature official layouts."""

import collections
import json
import pickle
import shutil

import numpy as np
import pytest

from metonymy.data import base, celeba, chexpert, cub, groupings
from metonymy.data import fixtures as fx
from metonymy.evaluation import patch_grid

# ------------------------------------------------------------------------------------------------
# Groupings vs the paper's tables.


def test_cub_table_s9_counts():
  counts = collections.Counter()
  for _, part, values in groupings.CUB_ATTRIBUTE_TABLE:
    counts[part] += len(values)
  assert dict(counts) == groupings.CUB_PART_COUNTS
  assert sum(counts.values()) == groupings.CUB_NUM_ATTRIBUTES == 248
  assert list(groupings.CUB_PART_COUNTS) == list(groupings.CUB_PARTS)
  assert len(set(groupings.CUB_ATTRIBUTES)) == 248
  info = cub.dataset_info()
  assert info.attribute_groups() == groupings.CUB_PART_COUNTS
  # Every Table S9 name exists in CUB's real vocabulary; what is left out is exactly the 64
  # holistic attributes.
  real = set(fx.CUB_FILE_ATTRIBUTE_NAMES)
  assert len(real) == 312 and set(groupings.CUB_ATTRIBUTES) <= real
  left_out = {groupings.cub_attribute_prefix(a) for a in real - set(groupings.CUB_ATTRIBUTES)}
  assert left_out == set(groupings.CUB_EXCLUDED_PREFIXES)
  assert len(real - set(groupings.CUB_ATTRIBUTES)) == 64


# Table S7 written out by hand (not read from groupings): CUB's 15 parts in parts.txt order, each
# with the group whose label it takes; CelebA's keypoints (the mouth is the corners' mean).
CUB_PARTS_TXT_BY_HAND = ("back", "beak", "belly", "breast", "crown", "forehead", "left eye",
                         "left leg", "left wing", "nape", "right eye", "right leg", "right wing",
                         "tail", "throat")
CUB_GROUP_BY_HAND = {
    "back": "back", "belly": "belly", "breast": "breast", "tail": "tail",
    "beak": "head", "crown": "head", "forehead": "head", "left eye": "head", "right eye": "head",
    "nape": "head", "throat": "head",
    "left leg": "leg", "right leg": "leg",
    "left wing": "wing", "right wing": "wing",
}
CELEBA_GROUP_BY_HAND = (("left eye", "eye"), ("right eye", "eye"), ("nose", "nose"),
                        ("mouth", "mouth"))


def _group_names(info):
  return [info.keypoint_groups[g] for g in info.keypoint_group_ids]


def test_cub_keypoint_groups_table_s7():
  info = cub.dataset_info()
  assert groupings.CUB_KEYPOINTS == CUB_PARTS_TXT_BY_HAND
  assert sorted(info.keypoint_groups) == sorted(set(CUB_GROUP_BY_HAND.values()))  # 7 groups
  assert len(info.keypoint_groups) == 7
  assert _group_names(info) == [CUB_GROUP_BY_HAND[name] for name in CUB_PARTS_TXT_BY_HAND]
  assert info.keypoint_groups == groupings.CUB_PARTS  # The groups are the attribute parts.
  for a, b in groupings.CUB_KEYPOINT_FLIP_PAIRS:
    left, right = groupings.CUB_KEYPOINTS[a], groupings.CUB_KEYPOINTS[b]
    assert left.replace("left", "right") == right
    assert CUB_GROUP_BY_HAND[left] == CUB_GROUP_BY_HAND[right]  # A flip never changes a label.


def test_celeba_keypoint_groups_table_s7():
  info = celeba.dataset_info()
  assert info.keypoint_groups == ("eye", "nose", "mouth")
  assert groupings.CELEBA_KEYPOINTS == tuple(name for name, _ in CELEBA_GROUP_BY_HAND)
  assert _group_names(info) == [group for _, group in CELEBA_GROUP_BY_HAND]
  # The official landmark order, and the one averaging Table S7 does.
  lm = np.arange(10, dtype=np.float32).reshape(5, 2)  # left eye, right eye, nose, l/r mouth
  np.testing.assert_allclose(celeba.landmarks_to_keypoints(lm),
                             [[0, 1], [2, 3], [4, 5], [7, 8]])


def test_keypoint_group_ids_rejects_a_bad_table():
  with pytest.raises(ValueError, match="without a group"):
    groupings.keypoint_group_ids({"a": ("x",)}, ("a",), ("x", "y"))
  with pytest.raises(ValueError, match="in groups"):
    groupings.keypoint_group_ids({"a": ("x",), "b": ("x",)}, ("a", "b"), ("x",))
  with pytest.raises(ValueError, match="no keypoint"):
    groupings.keypoint_group_ids({"a": ("x",), "b": ()}, ("a", "b"), ("x",))
  # DatasetInfo: one keypoint per group unless told otherwise; every group needs a keypoint.
  info = base.DatasetInfo("d", ("x",), ("p",), (0,), keypoint_groups=("p", "q"))
  assert info.keypoint_group_ids == (0, 1)
  with pytest.raises(ValueError, match="keypoint_group_ids"):
    base.DatasetInfo("d", ("x",), ("p",), (0,), keypoint_groups=("p", "q"),
                     keypoint_group_ids=(0, 0))


# Tables S8 and S9 written out by hand from the paper (Appendix H), not read from groupings:
# every attribute's part. CUB by name prefix, with each prefix's number of values.
CUB_TABLE_S9_BY_HAND = {
    "has_back_color": ("back", 15), "has_back_pattern": ("back", 4),
    "has_belly_color": ("belly", 15), "has_belly_pattern": ("belly", 4),
    "has_breast_color": ("breast", 15), "has_breast_pattern": ("breast", 4),
    "has_bill_color": ("head", 15), "has_bill_length": ("head", 3), "has_bill_shape": ("head", 9),
    "has_crown_color": ("head", 15), "has_eye_color": ("head", 14),
    "has_forehead_color": ("head", 15), "has_head_pattern": ("head", 11),
    "has_nape_color": ("head", 15), "has_throat_color": ("head", 15),
    "has_leg_color": ("leg", 15),
    "has_tail_pattern": ("tail", 4), "has_tail_shape": ("tail", 6),
    "has_under_tail_color": ("tail", 15), "has_upper_tail_color": ("tail", 15),
    "has_wing_color": ("wing", 15), "has_wing_pattern": ("wing", 4), "has_wing_shape": ("wing", 5),
}
CELEBA_TABLE_S8_BY_HAND = {
    "hair": ("Bald", "Bangs", "Black_Hair", "Blond_Hair", "Brown_Hair", "Gray_Hair",
             "Receding_Hairline", "Straight_Hair", "Wavy_Hair"),
    "hat": ("Wearing_Hat",),
    "eye": ("Arched_Eyebrows", "Bags_Under_Eyes", "Bushy_Eyebrows", "Narrow_Eyes"),
    "eyeglasses": ("Eyeglasses",),
    "nose": ("Big_Nose", "Pointy_Nose"),
    "mouth": ("Big_Lips", "Mouth_Slightly_Open", "Smiling", "Wearing_Lipstick", "5_o_Clock_Shadow",
              "Double_Chin", "Goatee", "Mustache", "No_Beard", "Sideburns", "High_Cheekbones",
              "Rosy_Cheeks"),
    "ear": ("Wearing_Earrings",),
    "neck": ("Wearing_Necklace", "Wearing_Necktie"),
}
# CheXpert's CSV header (after Path, Sex, Age, Frontal/Lateral, AP/PA) and CheXlocalize's 10
# tasks in CheXlocalize's order, as its JSON names them.
CHEXPERT_CSV_OBSERVATIONS_BY_HAND = (
    "No Finding", "Enlarged Cardiomediastinum", "Cardiomegaly", "Lung Opacity", "Lung Lesion",
    "Edema", "Consolidation", "Pneumonia", "Atelectasis", "Pneumothorax", "Pleural Effusion",
    "Pleural Other", "Fracture", "Support Devices")
CHEXLOCALIZE_TASKS_BY_HAND = (
    "Enlarged Cardiomediastinum", "Cardiomegaly", "Lung Lesion", "Airspace Opacity", "Edema",
    "Consolidation", "Atelectasis", "Pneumothorax", "Pleural Effusion", "Support Devices")


def _part_of_each_attribute(info):
  return {name: info.part_names[p] for name, p in zip(info.attribute_names, info.attribute_part)}


def test_cub_attribute_parts_table_s9_by_hand():
  parts = _part_of_each_attribute(cub.dataset_info())
  assert len(parts) == 248
  by_prefix = collections.defaultdict(list)  # prefix -> the part of each of its values
  for name, part in parts.items():
    by_prefix[groupings.cub_attribute_prefix(name)].append(part)
  assert all(len(set(p)) == 1 for p in by_prefix.values())  # A prefix never spans two parts.
  assert {prefix: (p[0], len(p)) for prefix, p in by_prefix.items()} == CUB_TABLE_S9_BY_HAND
  counts = collections.Counter()
  for part, size in CUB_TABLE_S9_BY_HAND.values():
    counts[part] += size
  assert cub.dataset_info().attribute_groups() == dict(counts)


def test_celeba_attribute_parts_table_s8_by_hand():
  info = celeba.dataset_info()
  assert _part_of_each_attribute(info) == {
      name: part for part, names in CELEBA_TABLE_S8_BY_HAND.items() for name in names}
  assert info.part_names == tuple(CELEBA_TABLE_S8_BY_HAND)


def test_chexpert_observations_and_tasks_by_hand():
  assert groupings.CHEXPERT_OBSERVATIONS == CHEXPERT_CSV_OBSERVATIONS_BY_HAND
  assert groupings.CHEXLOCALIZE_TASKS == CHEXLOCALIZE_TASKS_BY_HAND
  csv_names = tuple("Lung Opacity" if t == "Airspace Opacity" else t
                    for t in CHEXLOCALIZE_TASKS_BY_HAND)
  info = chexpert.dataset_info()
  assert info.attribute_names == info.mask_tasks == csv_names


def test_celeba_table_s8_counts():
  counts = {part: len(attrs) for part, attrs in groupings.CELEBA_ATTRIBUTE_TABLE}
  assert counts == groupings.CELEBA_PART_COUNTS
  assert sum(counts.values()) == groupings.CELEBA_NUM_ATTRIBUTES == 32
  assert celeba.dataset_info().attribute_groups() == groupings.CELEBA_PART_COUNTS
  raw = set(groupings.CELEBA_RAW_ATTRIBUTES)
  assert len(raw) == 40 and set(groupings.CELEBA_ATTRIBUTES) <= raw
  assert raw - set(groupings.CELEBA_ATTRIBUTES) == set(groupings.CELEBA_EXCLUDED)


def test_chexpert_tasks():
  assert len(groupings.CHEXPERT_OBSERVATIONS) == 14
  assert len(groupings.CHEXPERT_TASKS) == 10
  assert set(groupings.CHEXPERT_TASKS) <= set(groupings.CHEXPERT_OBSERVATIONS)
  assert "Airspace Opacity" in groupings.CHEXLOCALIZE_TASKS
  assert "Lung Opacity" not in groupings.CHEXLOCALIZE_TASKS
  info = chexpert.dataset_info()
  assert info.mask_tasks == info.attribute_names == groupings.CHEXPERT_TASKS


# ------------------------------------------------------------------------------------------------
# CUB


@pytest.fixture(scope="module")
def cub_data(tmp_path_factory):
  return fx.make_cub(tmp_path_factory.mktemp("cub"))


@pytest.mark.parametrize("split", cub.SPLITS)
def test_cub_source(cub_data, split):
  src = cub.make_source(cub_data.root, split)
  rows = np.flatnonzero(cub_data.is_train == (split == "train"))
  assert len(src) == len(rows) == 12
  assert src.info.num_attributes == 248
  file_col = {name: a for a, name in enumerate(fx.CUB_FILE_ATTRIBUTE_NAMES)}
  cols = [file_col[a] for a in groupings.CUB_ATTRIBUTES]
  for i, n in enumerate(rows):
    ex = src[i]
    w, h = cub_data.image_size
    assert ex["image"].shape == (h, w, 3) and ex["image"].dtype == np.uint8
    assert ex["label"] == cub_data.classes[n] - 1 and ex["label"].dtype == np.int32
    assert ex["index"] == i
    np.testing.assert_array_equal(ex["attributes"], cub_data.present[n, cols])
    assert ex["attribute_valid"].all()
    # Every part.txt point as the file has it (the fixture writes them in parts.txt order).
    np.testing.assert_allclose(ex["keypoints"], cub_data.keypoints[n], atol=1e-5)
    np.testing.assert_array_equal(ex["keypoint_visible"], cub_data.visible[n])
  with pytest.raises(IndexError):
    src[len(src)]


def _cub_example(data, image_id):
  for split in cub.SPLITS:
    src = cub.make_source(data.root, split)
    if image_id in src.image_ids:
      return src[int(np.flatnonzero(src.image_ids == image_id)[0])], src.info
  raise KeyError(image_id)


def test_cub_keypoints_keep_their_own_locations_and_take_the_group_label(cub_data):
  # Image 1: no part visible. Image 2: all 15 visible.
  ex, _ = _cub_example(cub_data, 1)
  assert ex["keypoints"].shape == (15, 2) and not ex["keypoint_visible"].any()
  ex, info = _cub_example(cub_data, 2)
  assert ex["keypoint_visible"].all()
  groups = _group_names(info)
  column = {name: CUB_PARTS_TXT_BY_HAND.index(name) for name in CUB_PARTS_TXT_BY_HAND}
  # The fixture's part_locs.txt line "2 <part id> x y 1" for each part.
  file_xy = {name: cub_data.keypoints[1, k] for k, name in enumerate(CUB_PARTS_TXT_BY_HAND)}
  for pair, group in ((("left wing", "right wing"), "wing"), (("left leg", "right leg"), "leg")):
    a, b = (column[name] for name in pair)
    assert not np.allclose(file_xy[pair[0]], file_xy[pair[1]])  # Two distinct points ...
    np.testing.assert_allclose(ex["keypoints"][[a, b]], [file_xy[pair[0]], file_xy[pair[1]]])
    assert groups[a] == groups[b] == group  # ... with one label, not averaged into one point.
  head = [column[name] for name, group in CUB_GROUP_BY_HAND.items() if group == "head"]
  assert len(head) == 7 and {groups[k] for k in head} == {"head"}
  np.testing.assert_allclose(ex["keypoints"], np.stack(list(file_xy.values())))


def test_cub_keypoints_through_transforms_and_batching(cub_data):
  from metonymy.data import pipeline
  from metonymy.data import transforms as T
  src = cub.make_source(cub_data.root, "train")
  rows = np.flatnonzero(cub_data.is_train)
  w, h = cub_data.image_size  # 32 x 24
  # Twice the size, then the central 32 x 24: x' = 2 x - 16, y' = 2 y - 12.
  zoom = T.Compose([T.Resize((2 * h, 2 * w)), T.CenterCrop((h, w))])
  batch = next(iter(pipeline.make_pipeline(src, batch_size=4, train=False, transforms=zoom,
                                           shard_index=0, shard_count=1)))
  assert batch["keypoints"].shape == (4, 15, 2) and batch["keypoint_visible"].shape == (4, 15)
  for b, n in enumerate(rows[:4]):
    moved = cub_data.keypoints[n] * 2 - [w / 2, h / 2]
    inside = (moved >= 0).all(-1) & (moved < [w, h]).all(-1)
    visible = cub_data.visible[n] & inside
    np.testing.assert_array_equal(batch["keypoint_visible"][b], visible)
    np.testing.assert_allclose(batch["keypoints"][b][visible], moved[visible], atol=1e-4)
  # A flip mirrors every point; the wings swap columns and keep their one label.
  ex, info = _cub_example(cub_data, 2)
  flipped = T.hflip(ex, groupings.CUB_KEYPOINT_FLIP_PAIRS)
  left, right = CUB_PARTS_TXT_BY_HAND.index("left wing"), CUB_PARTS_TXT_BY_HAND.index("right wing")
  x, y = ex["keypoints"][right]
  np.testing.assert_allclose(flipped["keypoints"][left], [w - x, y])
  assert _group_names(info)[left] == _group_names(info)[right] == "wing"


def test_cub_roots_and_attributes_inside(cub_data, tmp_path):
  a = cub.make_source(cub_data.root, "test")
  b = cub.make_source(cub_data.dataset_dir, "test")
  assert a.paths == b.paths
  inside = fx.make_cub(tmp_path, attributes_beside=False, n_images=6, extra_field_lines=0)
  src = cub.make_source(inside.dataset_dir, "train")
  assert len(src) == 3
  report = cub.check(inside.root)
  assert not any("sixth" in w for w in report.warnings)


def test_cub_check(cub_data):
  report = cub.check(cub_data.root, verify_images=-1)
  assert report.dataset == "cub"
  assert report.splits == {"train": 12, "test": 12}
  assert report.num_attributes == 248
  assert report.attribute_groups == groupings.CUB_PART_COUNTS
  assert report.keypoint_groups == list(groupings.CUB_PARTS)
  extra = [w for w in report.warnings if "sixth field" in w]
  assert len(extra) == 1 and f": {cub_data.extra_field_lines} line" in extra[0]
  json.dumps(report.to_dict())


def test_cub_ignore_not_visible(cub_data):
  src = cub.make_source(cub_data.root, "train", ignore_not_visible=True)
  n = np.flatnonzero(cub_data.is_train)[0]
  file_col = {name: a for a, name in enumerate(fx.CUB_FILE_ATTRIBUTE_NAMES)}
  cols = [file_col[a] for a in groupings.CUB_ATTRIBUTES]
  np.testing.assert_array_equal(src[0]["attribute_valid"], cub_data.certainty[n, cols] != 1)


def _replace_line(path, lineno, text):
  lines = path.read_text().splitlines()
  lines[lineno - 1] = text
  path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("rel,lineno,text", [
    ("attributes/image_attribute_labels.txt", 40, "1 40 1"),
    ("attributes/image_attribute_labels.txt", 41, "1 41 x 3 0.0"),
    ("attributes/image_attribute_labels.txt", 42, "1 42 7 3 0.0"),
    ("parts/part_locs.txt", 5, "1 5 abc 2.0 1"),
    ("images.txt", 3, "3"),
    ("train_test_split.txt", 4, "4 2"),
    ("image_class_labels.txt", 2, "2 1 9"),
])
def test_cub_malformed_line_names_file_and_line(tmp_path, rel, lineno, text):
  data = fx.make_cub(tmp_path, n_images=4, extra_field_lines=0)
  _replace_line(data.dataset_dir / rel, lineno, text)
  with pytest.raises(base.DataError, match=rf"{rel.split('/')[-1]}:{lineno}:"):
    cub.make_source(data.root, "train")


@pytest.mark.parametrize("rel", ["parts/part_locs.txt", "bounding_boxes.txt",
                                 "attributes/image_attribute_labels.txt", "../attributes.txt"])
def test_cub_missing_file(tmp_path, rel):
  data = fx.make_cub(tmp_path, n_images=4, extra_field_lines=0)
  (data.dataset_dir / rel).unlink()
  with pytest.raises(base.DataError, match=rf"missing required file.*{rel.split('/')[-1]}"):
    cub.make_source(data.root, "test")


def test_cub_bad_root(tmp_path):
  with pytest.raises(base.DataError, match="images.txt"):
    cub.make_source(tmp_path, "train")
  with pytest.raises(ValueError, match="splits"):
    cub.make_source(fx.make_cub(tmp_path, n_images=4).root, "val")


def test_cub_corrupt_and_missing_image(tmp_path):
  data = fx.make_cub(tmp_path, n_images=4, extra_field_lines=0)
  src = cub.make_source(data.root, "train")
  bad = src.image_path(0)
  fx.corrupt_file(bad)
  with pytest.raises(base.DataError, match=f"corrupt image: {bad}"):
    src[0]
  with pytest.raises(base.DataError, match=str(bad)):
    cub.check(data.root, verify_images=-1)
  bad.unlink()
  with pytest.raises(base.DataError, match=str(bad)):
    cub.check(data.root, verify_images=0)


def test_cub_source_pickles(cub_data):
  src = cub.make_source(cub_data.root, "test")
  again = pickle.loads(pickle.dumps(src))
  np.testing.assert_array_equal(again[2]["attributes"], src[2]["attributes"])


# ------------------------------------------------------------------------------------------------
# CelebA


@pytest.fixture(scope="module", params=["official", "flat"])
def celeba_data(request, tmp_path_factory):
  return fx.make_celeba(tmp_path_factory.mktemp(f"celeba_{request.param}"), layout=request.param)


def test_celeba_splits_attributes_keypoints(celeba_data):
  raw_col = [groupings.CELEBA_RAW_ATTRIBUTES.index(a) for a in groupings.CELEBA_ATTRIBUTES]
  w, h = celeba_data.image_size
  sizes = {}
  for s, split in enumerate(celeba.SPLITS):
    src = celeba.make_source(celeba_data.root, split)
    rows = np.flatnonzero(celeba_data.split == s)
    sizes[split] = len(src)
    assert src.files == [celeba_data.files[r] for r in rows]
    for i, n in enumerate(rows):
      ex = src[i]
      assert ex["image"].shape == (h, w, 3)
      np.testing.assert_array_equal(ex["attributes"], celeba_data.attrs[n, raw_col] > 0)
      assert ex["attributes"].shape == (32,) and ex["attribute_valid"].all()
      lm = celeba_data.landmarks[n]  # left eye, right eye, nose, left mouth, right mouth
      # Both eyes stay two points (labelled eye); only the mouth corners are averaged.
      expected = np.stack([lm[0], lm[1], lm[2], (lm[3] + lm[4]) / 2])
      np.testing.assert_allclose(ex["keypoints"], expected)
      inside = ((expected >= 0) & (expected < [w, h])).all(-1)
      np.testing.assert_array_equal(ex["keypoint_visible"], inside)
      assert ex["label"] == celeba_data.identity[n] - 1
  assert sizes == {"train": 18, "val": 6, "test": 6}
  last = celeba.make_source(celeba_data.root, "test")[-1]
  assert last["keypoint_visible"].tolist() == [True, True, False, True]  # Nose off the image.
  report = celeba.check(celeba_data.root, verify_images=-1)
  assert report.splits == sizes and report.num_attributes == 32
  assert report.attribute_groups == groupings.CELEBA_PART_COUNTS
  assert report.keypoint_groups == ["eye", "nose", "mouth"] and report.warnings == []


def test_celeba_torchvision_parent_root(tmp_path):
  data = fx.make_celeba(tmp_path / "celeba", layout="flat", n_images=10)
  assert len(celeba.make_source(tmp_path, "train")) == len(celeba.make_source(data.root, "train"))


def test_celeba_without_identity(tmp_path):
  data = fx.make_celeba(tmp_path, n_images=10, identity=False)
  src = celeba.make_source(data.root, "train")
  assert "label" not in src[0]
  assert any("identity" in w for w in celeba.check(data.root).warnings)


@pytest.mark.parametrize("name,lineno,text,match", [
    ("list_attr_celeba.txt", 5, "000003.jpg " + " ".join(["1"] * 39 + ["2"]), "1 or -1"),
    ("list_attr_celeba.txt", 6, "000004.jpg " + " ".join(["1"] * 39), "expected 41 fields"),
    ("list_attr_celeba.txt", 1, "11", "count line says 11"),
    ("list_landmarks_align_celeba.txt", 4, "000002.jpg 1 2 3 4 5 6 7 8 9 z", "not a number"),
    ("list_landmarks_align_celeba.txt", 2, "a b c d e f g h i j", "header"),
    ("list_eval_partition.txt", 3, "000003.jpg 5", "partition 5"),
])
def test_celeba_malformed(tmp_path, name, lineno, text, match):
  data = fx.make_celeba(tmp_path, n_images=10)
  folder = data.eval_dir if name == "list_eval_partition.txt" else data.anno_dir
  _replace_line(folder / name, lineno, text)
  with pytest.raises(base.DataError, match=rf"{name}:{lineno}:.*{match}"):
    celeba.make_source(data.root, "train")


def test_celeba_missing_file_and_row(tmp_path):
  data = fx.make_celeba(tmp_path / "a", n_images=10)
  (data.anno_dir / "list_landmarks_align_celeba.txt").unlink()
  with pytest.raises(base.DataError, match="missing required file.*list_landmarks_align"):
    celeba.make_source(data.root, "train")
  data = fx.make_celeba(tmp_path / "b", n_images=10)
  lines = (data.anno_dir / "list_attr_celeba.txt").read_text().splitlines()
  lines[0] = "9"
  del lines[4]  # 000003.jpg has no attribute row.
  (data.anno_dir / "list_attr_celeba.txt").write_text("\n".join(lines) + "\n")
  with pytest.raises(base.DataError, match="list_attr_celeba.txt: no line for '000003.jpg'"):
    celeba.make_source(data.root, "train")


def test_celeba_corrupt_image(tmp_path):
  data = fx.make_celeba(tmp_path, n_images=10)
  src = celeba.make_source(data.root, "val")
  fx.corrupt_file(src.image_path(1))
  with pytest.raises(base.DataError, match=f"corrupt image: {src.image_path(1)}"):
    src[1]


# ------------------------------------------------------------------------------------------------
# RLE


def _random_masks(rng):
  yield np.zeros((5, 7), bool)
  yield np.ones((4, 3), bool)
  m = np.zeros((6, 5), bool)
  m[0, 0] = True  # Starts with a 1: the first run of 0s is empty.
  yield m
  for shape in ((1, 1), (3, 8), (37, 29), (64, 48)):
    for p in (0.05, 0.5, 0.95):
      yield rng.random(shape) < p
  big = np.zeros((300, 250), bool)
  big[40:260, 30:200] = True  # Long runs: multi-group counts and negative deltas.
  big[100:120, :] = False
  yield big


def test_rle_fortran_order_by_hand():
  # Column-major: counts [2, 2] fill column 0 with 0s and column 1 with 1s.
  m = chexpert.rle_decode({"size": [2, 2], "counts": "22"})
  np.testing.assert_array_equal(m, [[False, True], [False, True]])
  assert chexpert.rle_encode(m) == {"size": [2, 2], "counts": "22"}


def test_rle_round_trip():
  rng = np.random.default_rng(0)
  for m in _random_masks(rng):
    rle = chexpert.rle_encode(m)
    assert isinstance(rle["counts"], str)
    np.testing.assert_array_equal(chexpert.rle_decode(rle), m)
    # Uncompressed counts (a list) decode too.
    counts = chexpert.rle_counts_from_string(rle["counts"])
    assert counts.sum() == m.size
    np.testing.assert_array_equal(
        chexpert.rle_decode({"size": list(m.shape), "counts": counts.tolist()}), m)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # pycocotools vs NumPy 2.
def test_rle_matches_pycocotools():
  mask_api = pytest.importorskip("pycocotools.mask")
  rng = np.random.default_rng(1)
  for m in _random_masks(rng):
    theirs = mask_api.encode(np.asfortranarray(m.astype(np.uint8)))
    ours = chexpert.rle_encode(m)
    assert ours["counts"] == theirs["counts"].decode("ascii")
    assert ours["size"] == list(theirs["size"])
    np.testing.assert_array_equal(chexpert.rle_decode(
        {"size": theirs["size"], "counts": theirs["counts"].decode()}), m)
    np.testing.assert_array_equal(mask_api.decode(
        {"size": ours["size"], "counts": ours["counts"].encode()}).astype(bool), m)


def test_rle_resize_nearest():
  rng = np.random.default_rng(2)
  for m in _random_masks(rng):
    rle = chexpert.rle_encode(m)
    for size in ((m.shape[0] * 2, m.shape[1] * 3), (max(1, m.shape[0] // 3), 5), (7, 1)):
      direct = chexpert.rle_decode(rle, size)
      assert direct.shape == size
      np.testing.assert_array_equal(direct, patch_grid.resize_nearest(m, size))
  # Integer upsampling repeats pixels; integer downsampling picks block centres.
  m = rng.random((4, 6)) < 0.5
  np.testing.assert_array_equal(patch_grid.resize_nearest(m, (8, 18)),
                                np.repeat(np.repeat(m, 2, 0), 3, 1))
  big = np.repeat(np.repeat(m, 3, 0), 3, 1)
  np.testing.assert_array_equal(patch_grid.resize_nearest(big, (4, 6)), m)
  stack = np.stack([m, ~m])
  np.testing.assert_array_equal(patch_grid.resize_nearest(stack, (8, 18))[1],
                                ~patch_grid.resize_nearest(m, (8, 18)))


@pytest.mark.parametrize("rle,match", [
    ({"size": [2, 2], "counts": "23"}, "sum"),
    ({"size": [2, 2], "counts": "2\x7f"}, "not an RLE character"),
    ({"size": [2, 2], "counts": "Q"}, "ends inside"),
    ({"counts": "22"}, "size"),
])
def test_rle_malformed(rle, match):
  with pytest.raises(ValueError, match=match):
    chexpert.rle_decode(rle)


# ------------------------------------------------------------------------------------------------
# CheXpert


@pytest.fixture(scope="module")
def chex_data(tmp_path_factory):
  return fx.make_chexpert(tmp_path_factory.mktemp("chexpert"))


def _labels(rows):
  value = {1: 1, 0: 0, -1: -1, None: 0}
  return np.array([[value[r["labels"][t]] for t in groupings.CHEXPERT_TASKS] for r in rows])


def test_chexpert_splits_and_roots(chex_data):
  report = chexpert.check(chex_data.root, verify_images=-1)
  sizes = {s: len(rows) for s, rows in chex_data.splits.items()}
  assert report.splits == sizes == {"train": 9, "valid": 6, "test": 5}
  assert report.num_attributes == 10 and report.keypoint_groups == []
  assert report.attribute_groups == {p: 1 for p in groupings.CHEXPERT_PARTS}
  frontal_with_masks = sum(1 for s in ("valid", "test") for k, r in enumerate(chex_data.splits[s])
                           if r["frontal"] and k > 0)
  assert report.masks == frontal_with_masks
  assert any("uncertain" in w for w in report.warnings)
  for root in (chex_data.root, chex_data.dataset_dir):
    src = chexpert.make_source(root, "test")
    assert src.image_path(0) == chex_data.dataset_dir / chex_data.splits["test"][0]["rel"]


def test_chexpert_test_labels_where_chexlocalize_ships_them(tmp_path):
  # CheXlocalize's download: CheXpert/test_labels.csv and CheXpert/test/ beside CheXlocalize/.
  data = fx.make_chexpert(tmp_path, test_layout="chexlocalize")
  labels_file = data.root / "CheXpert" / "test_labels.csv"
  assert labels_file.is_file() and not (data.dataset_dir / "test.csv").exists()
  rows = data.splits["test"]
  report = chexpert.check(data.root, verify_images=-1)  # Decodes every test image too.
  assert report.splits == {"train": 9, "valid": 6, "test": len(rows)}
  for root in (data.root, data.dataset_dir):
    src = chexpert.make_source(root, "test")
    assert src.csv_file == labels_file
    assert src.image_path(0) == data.root / "CheXpert" / rows[0]["rel"]
    np.testing.assert_array_equal(src.labels, _labels(rows))
    assert src[0]["image"].shape == (24, 20, 3) and src.num_with_masks() > 0
  # Unpacked somewhere else: the CheXpert/ beside the given CheXlocalize/ folder.
  download = tmp_path / "download"
  download.mkdir()
  for name in ("CheXpert", "CheXlocalize"):
    shutil.move(str(data.root / name), str(download / name))
  src = chexpert.make_source(data.root, "test", chexlocalize_dir=download / "CheXlocalize")
  assert src.csv_file == download / "CheXpert" / "test_labels.csv" and src.num_with_masks() > 0
  # Neither where CheXpert nor where CheXlocalize puts it: one error naming both.
  with pytest.raises(base.DataError, match="missing required file") as error:
    chexpert.make_source(data.root, "test")
  assert str(data.dataset_dir / "test.csv") in str(error.value)
  assert str(data.root / "CheXpert" / "test_labels.csv") in str(error.value)
  assert "test" not in chexpert.check(data.root).splits  # An optional split for `check`.


def test_chexpert_full_resolution_name(tmp_path):
  data = fx.make_chexpert(tmp_path, small=False, with_test=False, chexlocalize=False)
  report = chexpert.check(data.root)
  assert report.splits == {"train": 9, "valid": 6} and report.masks == 0
  assert any("no CheXlocalize" in w for w in report.warnings)
  ex = chexpert.make_source(data.root, "valid")[0]
  assert "masks" not in ex and ex["image"].shape == (24, 20, 3)
  with pytest.raises(base.DataError, match="gt_segmentations_val.json"):
    chexpert.make_source(data.root, "valid", masks=True)


@pytest.mark.parametrize("policy", chexpert.UNCERTAINTY_POLICIES)
def test_chexpert_uncertainty_policy(chex_data, policy):
  src = chexpert.make_source(chex_data.root, "train", uncertainty=policy)
  labels = _labels(chex_data.splits["train"])
  assert (labels == -1).any() and (labels == 0).any()
  blank = np.array([[r["labels"][t] is None for t in groupings.CHEXPERT_TASKS]
                    for r in chex_data.splits["train"]])
  assert blank.any()
  fill = {"ignore": 0.0, "zeros": 0.0, "ones": 1.0}[policy]
  for i in range(len(src)):
    ex = src[i]
    expected = np.where(labels[i] == -1, fill, labels[i] == 1)
    np.testing.assert_array_equal(ex["attributes"], expected)
    np.testing.assert_array_equal(ex["attribute_valid"],
                                  labels[i] != -1 if policy == "ignore" else True)
    assert ex["attributes"][blank[i]].sum() == 0 and ex["attribute_valid"][blank[i]].all()
  with pytest.raises(ValueError, match="uncertainty"):
    chexpert.make_source(chex_data.root, "train", uncertainty="three-class")


@pytest.mark.parametrize("split", ["train", "valid", "test"])
def test_chexpert_frontal_only(chex_data, split):
  rows = chex_data.splits[split]
  src = chexpert.make_source(chex_data.root, split, frontal_only=True)
  assert src.csv_paths == [r["path"] for r in rows if r["frontal"]]
  assert 0 < len(src) < len(rows)


@pytest.mark.parametrize("split", ["valid", "test"])
def test_chexpert_masks(chex_data, split):
  src = chexpert.make_source(chex_data.root, split)
  h, w = chex_data.image_size[1], chex_data.image_size[0]
  seen = 0
  for i, r in enumerate(chex_data.splits[split]):
    ex = src[i]
    assert ex["masks"].shape == (10, h, w) and ex["masks"].dtype == bool
    image_id = "_".join(r["rel"][:-4].split("/")[-3:])
    assert src.cxr_ids[i] == image_id
    assert bool(ex["has_masks"]) == (r["frontal"] and i > 0)
    for t, task in enumerate(groupings.CHEXPERT_TASKS):
      full = chex_data.masks.get((split, image_id, task))
      if full is None:  # Task (or image) absent from the JSON: all zero.
        assert not ex["masks"][t].any()
      else:
        np.testing.assert_array_equal(ex["masks"][t], patch_grid.resize_nearest(full, (h, w)))
        seen += int(full.any())
  assert seen > 0
  assert "masks" not in chexpert.make_source(chex_data.root, split, masks=False)[0]


def test_chexpert_masks_options(chex_data, tmp_path):
  # An explicit folder, and "Airspace Opacity" arriving as the CSV's "Lung Opacity".
  moved = tmp_path / "elsewhere"
  shutil.copytree(chex_data.root / "CheXlocalize", moved)
  src = chexpert.make_source(chex_data.dataset_dir, "valid", chexlocalize_dir=moved)
  assert src.mask_file == moved / "gt_segmentations_val.json"
  t = groupings.CHEXPERT_TASKS.index("Lung Opacity")
  found = [k for k in chex_data.masks if k[0] == "valid" and k[2] == "Lung Opacity"]
  assert found
  i = src.cxr_ids.index(found[0][1])
  h, w = chex_data.image_size[1], chex_data.image_size[0]
  np.testing.assert_array_equal(src[i]["masks"][t],
                                patch_grid.resize_nearest(chex_data.masks[found[0]], (h, w)))
  train = chexpert.make_source(chex_data.root, "train", masks=True)
  ex = train[0]
  assert not ex["has_masks"] and not ex["masks"].any()


def test_chexpert_malformed(tmp_path):
  data = fx.make_chexpert(tmp_path, with_test=False, chexlocalize=False)
  path = data.dataset_dir / "train.csv"
  lines = path.read_text().splitlines()
  fields = lines[3].split(",")
  fields[-1] = "2.0"
  lines[3] = ",".join(fields)
  path.write_text("\n".join(lines) + "\n")
  with pytest.raises(base.DataError, match="train.csv:4:.*Support Devices"):
    chexpert.make_source(data.root, "train")
  lines[3] = "CheXpert-v1.0-small/train/x.jpg,Female"
  path.write_text("\n".join(lines) + "\n")
  with pytest.raises(base.DataError, match="train.csv:4: malformed line, expected 19 fields"):
    chexpert.make_source(data.root, "train")
  path.write_text("Path,Sex\n")
  with pytest.raises(base.DataError, match="train.csv:1:.*'Enlarged Cardiomediastinum'"):
    chexpert.make_source(data.root, "train")
  (data.dataset_dir / "valid.csv").unlink()
  with pytest.raises(base.DataError, match="missing required file.*valid.csv"):
    chexpert.make_source(data.root, "valid")


def test_chexpert_malformed_mask_and_corrupt_image(tmp_path):
  data = fx.make_chexpert(tmp_path, with_test=False)
  path = data.root / "CheXlocalize" / "gt_segmentations_val.json"
  entries = json.loads(path.read_text())
  image_id = next(iter(entries))
  entries[image_id]["Edema"]["counts"] = "3"
  path.write_text(json.dumps(entries))
  with pytest.raises(base.DataError, match=f"{image_id}.*Edema"):
    chexpert.check(data.root)
  src = chexpert.make_source(data.root, "valid")
  with pytest.raises(base.DataError, match=f"{image_id}.*Edema"):
    src[src.cxr_ids.index(image_id)]
  fx.corrupt_file(src.image_path(0))
  with pytest.raises(base.DataError, match=f"corrupt image: {src.image_path(0)}"):
    src[0]


def test_celeba_and_chexpert_sources_pickle(celeba_data, chex_data):
  for src in (celeba.make_source(celeba_data.root, "val"),
              chexpert.make_source(chex_data.root, "valid")):
    again = pickle.loads(pickle.dumps(src))
    for key, value in src[1].items():
      np.testing.assert_array_equal(again[1][key], value)


def test_chexpert_cxr_id():
  assert chexpert.cxr_id("CheXpert-v1.0/valid/patient64541/study1/view1_frontal.jpg") == (
      "patient64541_study1_view1_frontal")
  assert chexpert.cxr_id("test/patient64741/study1/view1_frontal.jpg") == (
      "patient64741_study1_view1_frontal")


def test_celeba_attribute_header_with_an_extra_name_says_how_many(tmp_path):
  """41 attribute names (one extra, not a file column) is a count error, not a missing name."""
  data = fx.make_celeba(tmp_path, n_images=10)
  path = data.anno_dir / "list_attr_celeba.txt"
  lines = path.read_text().splitlines()
  lines[1] += " Extra_Attribute"
  path.write_text("\n".join(lines) + "\n")
  with pytest.raises(base.DataError, match=r"list_attr_celeba.txt:2: malformed header, it has 41 "
                                           r"names where 40 are expected"):
    celeba.make_source(data.root, "train")
  lines[1] = "image_id " + lines[1].rsplit(" ", 1)[0]  # A file column's name is dropped.
  path.write_text("\n".join(lines) + "\n")
  assert len(celeba.make_source(data.root, "train")) > 0


def test_data_check_all_images_lists_every_bad_file_and_counts(tmp_path, capsys):
  """The default check decodes the first 16 images of each split; --all-images decodes all, with
  progress, and lists every bad file at the end (issue 13, item 6)."""
  from metonymy.data import __main__ as data_main
  data = fx.make_cub(tmp_path, n_images=48, extra_field_lines=0)
  src = cub.make_source(data.root, "train")
  assert len(src) > 18
  late = [src.image_path(17), src.image_path(len(src) - 1)]  # Past the default 16.
  for path in late:
    fx.corrupt_file(path)
  total = sum(len(cub.make_source(data.root, s)) for s in cub.SPLITS)

  assert data_main.main(["check", "--dataset", "cub", "--root", str(data.root)]) == 0
  out = capsys.readouterr().out
  assert "images decoded: 32 (the first 16 of each split; --all-images for all" in out, out

  assert data_main.main(["check", "--dataset", "cub", "--root", str(data.root),
                         "--all-images"]) == 1
  captured = capsys.readouterr()
  assert f"decoding train: {len(src)}/{len(src)} (100%)" in captured.err, captured.err
  assert f"2 bad image file(s) ({total} image(s) decoded" in captured.err, captured.err
  for path in late:
    assert f"corrupt image: {path}" in captured.err, captured.err

  clean = fx.make_cub(tmp_path / "clean", n_images=48, extra_field_lines=0)
  assert data_main.main(["check", "--dataset", "cub", "--root", str(clean.root),
                         "--all-images"]) == 0
  out = capsys.readouterr().out
  assert f"images decoded: {total} (all;" in out, out
  assert json.loads(out.strip().splitlines()[-1])["images_decoded"] == total
