"""A user's own dataset in the folder format (metonymy/data/folder.py, issue 14 part 2)."""

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from metonymy import config_lib
from metonymy import data as data_lib
from metonymy.data import __main__ as data_cli
from metonymy.data import base, folder, pipeline, synthetic, transforms

ROOT = Path(__file__).resolve().parents[1]
WORLD = {"image_size": 32, "correlation": 0.3}
N = 4


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  root = tmp_path_factory.mktemp("folder") / "synthetic"
  folder.export_synthetic(root, N, **WORLD)
  return root


def _world(split):
  config = synthetic.SyntheticConfig.from_options(
      **WORLD, splits={"train": N, "val": N, "test": N})
  return synthetic.SyntheticParts(config, split)


def _assert_same_examples(got, want):
  assert len(got) == len(want)
  for i in range(len(want)):
    a, b = got[i], want[i]
    assert sorted(a) == sorted(b), (i, sorted(a), sorted(b))
    for key in b:
      assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, (i, key)
      np.testing.assert_array_equal(a[key], b[key], err_msg=f"{got.split}[{i}] {key}")


def test_exported_folder_reads_back_as_the_built_in_source(exported):
  for split in ("train", "val", "test"):
    got = data_lib.make_source("folder", exported, split)
    want = _world(split)
    _assert_same_examples(got, want)
  fields = ("attribute_names", "part_names", "attribute_part", "keypoint_groups",
            "keypoint_group_ids")
  assert all(getattr(got.info, f) == getattr(want.info, f) for f in fields)


def test_same_grain_pipeline_and_augmentations_as_the_built_in_source(exported):
  def batches(source):
    augment = transforms.standard(24, train=True, mean=(0.5,) * 3, std=(0.25,) * 3)
    it = iter(pipeline.make_pipeline(source, batch_size=3, train=True, seed=7,
                                     transforms=augment, shard_index=0, shard_count=1))
    return [next(it) for _ in range(2)]
  for got, want in zip(batches(data_lib.make_source("folder", exported, "train")),
                       batches(_world("train"))):
    assert sorted(got) == sorted(want)
    for key in want:
      np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_jsonl_annotations_read_like_csv(exported, tmp_path):
  root = tmp_path / "jsonl"
  root.mkdir()
  for name in ("images", "masks"):
    (root / name).symlink_to(exported / name)
  for name in ("attributes.csv", "keypoints.csv"):
    (root / name).write_text((exported / name).read_text())
  with open(exported / "annotations.csv", newline="") as f, \
       open(root / "annotations.jsonl", "w") as out:
    for row in csv.DictReader(f):
      obj = {k: (None if v == "" else json.loads(v) if k not in ("image", "split", "mask") else v)
             for k, v in row.items()}
      out.write(json.dumps(obj) + "\n")
  _assert_same_examples(data_lib.make_source("folder", root, "val"), _world("val"))


def _small_folder(root: Path) -> Path:
  """A hand-written two-part folder: 3 images of 6x5 pixels, keypoints and masks."""
  (root / "images").mkdir(parents=True)
  (root / "masks").mkdir()
  for i in range(3):
    Image.fromarray(np.full((5, 6, 3), 40 * i, np.uint8)).save(root / "images" / f"{i}.png")
    Image.fromarray(np.full((5, 6), i, np.uint8)).save(root / "masks" / f"{i}.png")
  (root / "attributes.csv").write_text("attribute,part\nred_head,head\nlong_tail,tail\n")
  (root / "keypoints.csv").write_text("keypoint,part\nk1,head\nk2,tail\n")
  (root / "annotations.csv").write_text(
      "image,split,red_head,long_tail,k1_x,k1_y,k2_x,k2_y,mask\n"
      "0.png,train,1,0,1.5,2.5,3,4,0.png\n"
      "1.png,train,,1,,,5.5,1,1.png\n"
      "2.png,test,0,,9,1,0,0,2.png\n")
  return root


def test_blank_labels_keypoints_and_masks_follow_the_documented_format(tmp_path):
  root = _small_folder(tmp_path / "d")
  train = data_lib.make_source("folder", root, "train")
  assert train.info.part_names == ("head", "tail")
  assert train.info.attribute_part == (0, 1)
  assert train.info.keypoint_groups == ("head", "tail")
  first, second = train[0], train[1]
  np.testing.assert_array_equal(first["attributes"], [1, 0])
  np.testing.assert_array_equal(first["attribute_valid"], [True, True])
  np.testing.assert_array_equal(second["attributes"], [0, 1])
  np.testing.assert_array_equal(second["attribute_valid"], [False, True])  # blank = unknown
  np.testing.assert_array_equal(first["keypoints"], [[1.5, 2.5], [3, 4]])
  np.testing.assert_array_equal(first["keypoint_visible"], [True, True])
  np.testing.assert_array_equal(second["keypoint_visible"], [False, True])  # not annotated
  test = data_lib.make_source("folder", root, "test")[0]
  np.testing.assert_array_equal(test["keypoint_visible"], [False, True])  # x = 9 is outside
  assert test["part_segmentation"].shape == (5, 6) and int(test["part_segmentation"].max()) == 2
  assert "label" not in first and int(second["index"]) == 1


@pytest.mark.parametrize("bug, expected", [
    ("missing_image", "missing image: {root}/images/1.png ({root}/annotations.csv:3)"),
    ("unknown_group", "{root}/keypoints.csv:3: unknown part group 'wing'"),
    ("label_2", "{root}/annotations.csv:4: column 'long_tail': label '2' is not 0, 1 or blank"),
    ("label_minus_1", "{root}/annotations.csv:2: column 'red_head': label '-1' is not 0, 1"),
    ("mask_size", "mask {root}/masks/0.png ({root}/annotations.csv:2): size 4x5, the image is 6x5"),
    ("mask_label", "mask {root}/masks/2.png ({root}/annotations.csv:4): label 3 but there are 2"),
    ("unknown_column", "{root}/annotations.csv:1: unknown column 'red_haed'"),
])
def test_bad_input_is_named_by_file_and_line(tmp_path, capsys, bug, expected):
  root = _small_folder(tmp_path / "d")
  if bug == "missing_image":
    (root / "images" / "1.png").unlink()
  elif bug == "unknown_group":
    (root / "keypoints.csv").write_text("keypoint,part\nk1,head\nk2,wing\n")
  elif bug.startswith("label"):
    text = (root / "annotations.csv").read_text()
    text = (text.replace("2.png,test,0,,", "2.png,test,0,2,") if bug == "label_2"
            else text.replace("0.png,train,1,", "0.png,train,-1,"))
    (root / "annotations.csv").write_text(text)
  elif bug == "mask_size":
    Image.fromarray(np.zeros((5, 4), np.uint8)).save(root / "masks" / "0.png")
  elif bug == "mask_label":
    Image.fromarray(np.full((5, 6), 3, np.uint8)).save(root / "masks" / "2.png")
  elif bug == "unknown_column":
    text = (root / "annotations.csv").read_text()
    (root / "annotations.csv").write_text(text.replace("red_head", "red_haed", 1))
  expected = expected.format(root=root)
  with pytest.raises(base.DataError) as raised:
    data_lib.check("folder", root)
  assert expected in str(raised.value)
  # The command line reports it the same way (exit status 1, the message on stderr).
  assert data_cli.main(["check", "--dataset", "folder", "--root", str(root)]) == 1
  assert expected in capsys.readouterr().err


def test_check_reports_like_the_other_datasets(exported, capsys):
  assert data_cli.main(["check", "--dataset", "folder", "--root", str(exported)]) == 0
  report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  world = synthetic.dataset_info(synthetic.SyntheticConfig(**WORLD))
  assert report == {"dataset": "folder", "splits": {"train": N, "val": N, "test": N},
                    "num_attributes": world.num_attributes,
                    "attribute_groups": world.attribute_groups(),
                    "keypoint_groups": list(world.keypoint_groups), "masks": 3 * N,
                    "warnings": [], "images_decoded": 3 * N}


def test_export_command_writes_a_folder_check_accepts(tmp_path, capsys):
  root = tmp_path / "out"
  assert data_cli.main(["export-synthetic", "--root", str(root), "--examples", "2",
                        "--image-size", "32"]) == 0
  assert data_lib.check("folder", root).splits == {"train": 2, "val": 2, "test": 2}
  # Never over an existing dataset.
  assert data_cli.main(["export-synthetic", "--root", str(root), "--examples", "2"]) == 1
  assert "already holds a folder dataset" in capsys.readouterr().err


def test_folder_configs_read_the_folder_given_as_data_root(exported):
  from metonymy.probe import benchmark
  from metonymy.training import inputs
  for name in ("folder_single", "folder_ste"):
    config = config_lib.load_sibling_config(str(ROOT / "configs" / "x.py"), name, "runlocal")
    assert config.data.dataset == "folder" and config.data.root == ""
    with pytest.raises(ValueError, match="config.data.root is empty"):
      inputs.sources(config.data)
    config.data.root = str(exported)
    train, evaluation = inputs.sources(config.data)
    assert (len(train), len(evaluation)) == (N, N)
  probe = config_lib.load_sibling_config(str(ROOT / "configs" / "x.py"), "probe_folder", "tiny")
  with pytest.raises(ValueError, match="config.data.root is empty"):  # The trainer's check.
    benchmark.open_split(probe.data, "test", 0)
  probe.data.root = str(exported)
  source, info, _ = benchmark.open_split(probe.data, "test", 0)
  assert len(source) == N and info.part_names == _world("test").info.part_names
