"""CelebA from a prepared TFDS `celeb_a` data_dir (metonymy/data/celeba_tfds.py, issue 14 part 3).

The tiny data_dir is prepared offline by TFDS's own celeb_a builder (its real feature spec and
_generate_examples) from the miniature official-layout folder of metonymy/data/fixtures.py: only
the download step is replaced. Neither preparing (the JPEG bytes are stored as they are) nor
reading needs TensorFlow.
"""

import sys
from pathlib import Path

import numpy as np
import pytest

from metonymy import config_lib
from metonymy import data as data_lib
from metonymy.data import base
from metonymy.data import fixtures as data_fixtures

tfds = pytest.importorskip(
    "tensorflow_datasets", reason="tensorflow-datasets is not installed (requirements-test.txt; "
    "the optional `tfds` extra)")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("celeba_tfds")
  fx = data_fixtures.make_celeba(tmp / "official", n_images=10)
  builder = tfds.builder_cls("celeb_a")(data_dir=str(tmp / "tfds"), file_format="array_record")
  files = {"list_eval_partition": fx.eval_dir / "list_eval_partition.txt",
           "list_attr_celeba": fx.anno_dir / "list_attr_celeba.txt",
           "landmarks_celeba": fx.anno_dir / "list_landmarks_align_celeba.txt",
           "identity_celeba": fx.anno_dir / "identity_CelebA.txt"}
  images = {f: (fx.image_dir / f).read_bytes() for f in fx.files}

  def split_generators(dl_manager):  # The builder's own, without the Google Drive download.
    del dl_manager
    return [tfds.core.SplitGenerator(name=name, gen_kwargs={
        "file_id": file_id, "downloaded_dirs": files, "downloaded_images": images})
            for file_id, name in enumerate(("train", "validation", "test"))]

  builder._split_generators = split_generators
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  return fx, tmp / "tfds"


def test_tfds_examples_equal_the_official_layout_readers(prepared):
  fx, data_dir = prepared
  matched = 0
  for split in ("train", "val", "test"):
    got = data_lib.make_source("celeba", data_dir, split, source="tfds")
    want = data_lib.make_source("celeba", fx.root, split)
    assert len(got) == len(want) and got.info == want.info
    # TFDS stores no file names and shuffles records: match each example by its pixels.
    by_pixels = {want[j]["image"].tobytes(): j for j in range(len(want))}
    for i in range(len(got)):
      a = got[i]
      b = want[by_pixels[a["image"].tobytes()]]
      assert sorted(a) == sorted(b)
      for key in b:
        if key != "index":
          assert a[key].dtype == b[key].dtype, key
          np.testing.assert_array_equal(a[key], b[key], err_msg=f"{split}[{i}] {key}")
      assert int(a["index"]) == i
      matched += 1
  assert matched == 10
  assert "tensorflow" not in sys.modules  # Read (and prepared) without TensorFlow.


def test_keypoint_merging_and_invisible_points_survive_tfds(prepared):
  fx, data_dir = prepared
  test = data_lib.make_source("celeba", data_dir, "test", source="tfds")
  # The fixture's last image (a test image) has its nose outside the image.
  lm = fx.landmarks[-1]
  for i in range(len(test)):
    example = test[i]
    if example["keypoints"][2].tolist() == lm[2].tolist():
      assert example["keypoint_visible"].tolist() == [True, True, False, True]
      np.testing.assert_allclose(example["keypoints"][3], (lm[3] + lm[4]) / 2)
      break
  else:
    raise AssertionError("the test image with the outside nose is missing")


def test_config_source_tfds_and_check(prepared, capsys):
  from metonymy.data import __main__ as data_cli
  from metonymy.training import inputs
  _, data_dir = prepared
  config = config_lib.load_sibling_config(
      str(Path(__file__).resolve().parents[1] / "configs" / "x.py"),
      "celeba_single", "runlocal")
  config.data.update({"source": "tfds", "root": str(data_dir)})
  train, evaluation = inputs.sources(config.data)
  assert (len(train), len(evaluation)) == (6, 2)
  assert data_cli.main(["check", "--dataset", "celeba", "--source", "tfds",
                        "--root", str(data_dir)]) == 0
  assert '"splits": {"train": 6, "val": 2, "test": 2}' in capsys.readouterr().out
  with pytest.raises(base.DataError, match="no prepared celeb_a"):
    data_lib.make_source("celeba", data_dir / "nothing_here", "train", source="tfds")
  with pytest.raises(ValueError, match="has no source 'tfds'"):
    data_lib.make_source("cub", data_dir, "train", source="tfds")
