"""K of a part-map file (issue 12, item 5): taken from the file, or a mismatch refused.

The paper's CUB analysis (Fig. S5) has 7 parts. A 7-part label map has labels 0..7 with the
background 7; read with K = 8 its background would silently become an eighth foreground part and
the images would have no background at all.
"""

import os
import re

import numpy as np
import pytest

from metonymy import config_lib
from metonymy.evaluation import patch_grid
from metonymy.probe import masks as masks_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUM_EXAMPLES, SIZE = 3, 8


def _seven_part_labels(background: str = "last") -> np.ndarray:
  """int32 [N, 8, 8] label maps of K = 7 parts: a background border, every part inside."""
  rng = np.random.default_rng(0)
  labels = rng.integers(0, 7, (NUM_EXAMPLES, SIZE, SIZE)).astype(np.int32)
  labels[:, 0, :] = labels[:, -1, :] = labels[:, :, 0] = labels[:, :, -1] = 7  # background
  if background == "first":
    labels = np.where(labels == 7, 0, labels + 1).astype(np.int32)
  return labels


def _batch():
  return {"index": np.arange(NUM_EXAMPLES), "image": np.zeros((NUM_EXAMPLES, SIZE, SIZE, 3))}


def _cub_masks_config(path: str, **overrides):
  """configs/probe_cub.py's masks block, reading `path`."""
  config = config_lib.load_sibling_config(os.path.join(ROOT, "configs", "x.py"), "probe_cub")
  config.masks.path = path
  config.masks.update(overrides)
  return config.masks


def test_probe_cub_takes_k_from_the_file():
  """The CUB config infers K: a 7-part map is read as 7 parts plus the background."""
  path = "/tmp/unused.npy"
  assert _cub_masks_config(path).num_parts == 0


@pytest.mark.parametrize("background", ["last", "first"])
def test_seven_part_map_is_inferred_with_its_background(tmp_path, background):
  labels = _seven_part_labels(background)
  path = str(tmp_path / "cub_maps_test.npy")
  np.save(path, labels)
  source = masks_lib.make_source(
      _cub_masks_config(str(tmp_path / "cub_maps_{split}.npy"), background=background),
      "test", NUM_EXAMPLES, None)
  assert source.num_parts == 7
  maps = source(_batch())
  # The border is the background (id K = 7 in the ViT's convention), and it is the only one.
  reference = _seven_part_labels("last")
  np.testing.assert_array_equal(maps.labels, reference)
  assert np.all(maps.labels[:, 0, :] == 7)
  part_ids, _ = patch_grid.patch_part_ids(maps.labels, source.num_parts, patch_size=1)
  np.testing.assert_array_equal(part_ids == source.num_parts, reference == 7)
  # An explicit, matching K is accepted too.
  explicit = masks_lib.make_source(
      _cub_masks_config(path, background=background, num_parts=7), "test", NUM_EXAMPLES, None)
  np.testing.assert_array_equal(explicit(_batch()).labels, maps.labels)


@pytest.mark.parametrize("background", ["last", "first"])
def test_seven_part_map_under_a_k_of_8_is_refused_naming_both(tmp_path, background):
  path = str(tmp_path / "cub_maps_test.npy")
  np.save(path, _seven_part_labels(background))
  with pytest.raises(ValueError) as error:
    masks_lib.make_source(_cub_masks_config(path, background=background, num_parts=8),
                          "test", NUM_EXAMPLES, None)
  message = str(error.value)
  assert path in message
  assert "masks.num_parts is 8" in message
  assert "largest label is 7" in message and "K = 7" in message, message
  assert "masks.num_parts=0" in message  # How to fix it.


def test_soft_maps_under_a_wrong_k_are_refused(tmp_path):
  soft = np.eye(8, dtype=np.float32)[_seven_part_labels()].transpose(0, 3, 1, 2)  # [N, 8, h, w]
  path = str(tmp_path / "soft.npy")
  np.save(path, soft)
  with pytest.raises(ValueError, match=re.escape("soft maps have 8 channels but "
                                                 "masks.num_parts is 8")):
    masks_lib.FileMasks(path, "test", NUM_EXAMPLES, num_parts=8)
  inferred = masks_lib.FileMasks(path, "test", NUM_EXAMPLES)
  assert inferred.num_parts == 7
  np.testing.assert_array_equal(inferred(_batch()).labels, _seven_part_labels())


def test_npz_num_parts_entry_is_k(tmp_path):
  """A recorded K wins over the largest label: here the background never occurs, so the largest
  label (6) alone would say K = 6."""
  labels = np.random.default_rng(1).integers(0, 7, (NUM_EXAMPLES, SIZE, SIZE)).astype(np.int32)
  path = str(tmp_path / "maps.npz")
  np.savez(path, test=labels, num_parts=np.int64(7))
  source = masks_lib.FileMasks(path, "test", NUM_EXAMPLES)  # One map array besides the entry.
  assert source.num_parts == 7
  np.testing.assert_array_equal(source(_batch()).labels, labels)
  with pytest.raises(ValueError, match="its num_parts entry is 7 but masks.num_parts is 6"):
    masks_lib.FileMasks(path, "test", NUM_EXAMPLES, num_parts=6)
  np.savez(path, test=_seven_part_labels(), num_parts=np.int64(6))
  with pytest.raises(ValueError, match="num_parts entry 6 but a label 7"):
    masks_lib.FileMasks(path, "test", NUM_EXAMPLES)
