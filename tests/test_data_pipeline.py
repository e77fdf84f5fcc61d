"""Augmentation consistency, Grain pipelines (sharding, shuffling, workers), Orbax iterator state,
and the `python -m metonymy.data check` command line."""

import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from metonymy.data import __main__ as data_main
from metonymy.data import base
from metonymy.data import pipeline
from metonymy.data import synthetic
from metonymy.data import transforms as T

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORLD = synthetic.SyntheticConfig(image_size=48, splits=(("train", 40), ("val", 10)))


def _dot_example(h, w, point, visible=True):
  """Black image with a bright 3x3 dot, a label-1 5x5 block and a task-0 mask around `point`
  (a pixel centre)."""
  x, y = point
  col, row = int(x), int(y)
  image = np.zeros((h, w, 3), np.uint8)
  image[row - 1:row + 2, col - 1:col + 2] = 255
  seg = np.zeros((h, w), np.uint8)
  seg[row - 2:row + 3, col - 2:col + 3] = 1
  masks = np.zeros((2, h, w), bool)
  masks[0, row - 2:row + 3, col - 2:col + 3] = True
  return {"image": image, "part_segmentation": seg, "masks": masks,
          "keypoints": np.array([[x, y]], np.float32), "keypoint_visible": np.array([visible]),
          "attributes": np.ones(3, np.float32)}


GEOMETRIC = [
    T.ResizeShorter(36),                       # downscale, antialiased
    T.ResizeShorter(96),                       # upscale
    T.Resize((50, 70)),
    T.CenterCrop(40),
    T.RandomCrop((40, 56)),
    T.RandomResizedCrop(48, scale=(0.4, 1.0)),
    T.RandomAffine(degrees=30, scale=(0.8, 1.25), translate=(0.15, 0.15)),
    T.RandomHorizontalFlip(p=1.0),
    T.Compose([T.ResizeShorter(72), T.RandomAffine(20), T.RandomCrop(56),
               T.RandomHorizontalFlip(0.5)]),
]


@pytest.mark.parametrize("transform", GEOMETRIC, ids=repr)
def test_keypoint_dot_segmentation_and_masks_move_together(transform):
  rng = np.random.default_rng(0)
  seen_visible = seen_hidden = 0
  for trial in range(16):
    point = (rng.integers(4, 76) + 0.5, rng.integers(4, 56) + 0.5)
    ex = _dot_example(60, 80, point)
    out = transform(ex, np.random.default_rng(trial))
    h, w = out["image"].shape[:2]
    assert out["part_segmentation"].shape == (h, w) and out["masks"].shape == (2, h, w)
    np.testing.assert_array_equal(out["attributes"], ex["attributes"])
    (x, y), vis = out["keypoints"][0], out["keypoint_visible"][0]
    inside = 0 <= x < w and 0 <= y < h
    assert vis == inside
    if not vis:
      seen_hidden += 1
      continue
    seen_visible += 1
    brightness = out["image"].astype(np.float32).sum(-1)
    # The keypoint's pixel is (one of) the brightest: upscaling turns the dot into a plateau.
    assert brightness[int(y), int(x)] >= 0.8 * brightness.max(), (trial, (x, y))
    # The dot's centre of mass tracks the keypoint to sub-pixel accuracy.
    rows, cols = np.nonzero(brightness > 0.2 * brightness.max())
    weights = brightness[rows, cols]
    centre = np.array([(cols + 0.5) @ weights, (rows + 0.5) @ weights]) / weights.sum()
    if 2 <= x < w - 2 and 2 <= y < h - 2:  # not clipped by the border
      assert np.abs(centre - [x, y]).max() < 0.6, (trial, centre, (x, y))
    assert out["part_segmentation"][int(y), int(x)] == 1
    assert out["masks"][0, int(y), int(x)] and not out["masks"][1].any()
  assert seen_visible >= 4
  if isinstance(transform, T.CenterCrop):
    assert seen_hidden > 0  # some dots fell outside the crop


def test_keypoints_leaving_the_crop_become_invisible_and_stay_so():
  ex = _dot_example(60, 80, (3.5, 3.5))
  out = T.CenterCrop(30)(ex)
  assert not out["keypoint_visible"][0] and out["keypoints"][0, 0] < 0
  ex = _dot_example(60, 80, (40.5, 30.5), visible=False)  # invisible in the source stays so
  assert not T.CenterCrop(30)(ex)["keypoint_visible"][0]
  # A crop larger than the image pads: image with fill, labels with 0.
  padded = T.CenterCrop((70, 90), fill=7)(_dot_example(60, 80, (40.5, 30.5)))
  assert padded["image"].shape == (70, 90, 3) and padded["image"][0, 0, 0] == 7
  assert padded["part_segmentation"][0, 0] == 0 and padded["keypoint_visible"][0]


def test_flip_swaps_pairs_and_their_segmentation_labels():
  h, w = 20, 30
  seg = np.zeros((h, w), np.uint8)
  seg[5, 4], seg[5, 15], seg[5, 25] = 1, 2, 3
  ex = {"image": np.arange(h * w * 3, dtype=np.uint8).reshape(h, w, 3), "part_segmentation": seg,
        "keypoints": np.array([[4.5, 5.5], [15.5, 5.5], [25.5, 5.5]], np.float32),
        "keypoint_visible": np.array([True, True, False])}
  out = T.hflip(ex, flip_pairs=[(0, 2)])
  np.testing.assert_array_equal(out["image"], ex["image"][:, ::-1])
  # Group 0 (left) is now where group 2 (right) was mirrored to, and vice versa.
  np.testing.assert_allclose(out["keypoints"], [[w - 25.5, 5.5], [w - 15.5, 5.5], [w - 4.5, 5.5]])
  np.testing.assert_array_equal(out["keypoint_visible"], [False, True, True])
  for g, (x, y) in enumerate(out["keypoints"]):
    assert out["part_segmentation"][int(y), int(x)] == g + 1
  back = T.hflip(out, flip_pairs=[(0, 2)])
  for key in ex:
    np.testing.assert_array_equal(back[key], ex[key])
  assert T.flip_pairs_by_name(["left_eye", "nose", "right_eye"],
                              [("left_eye", "right_eye"), ("left_leg", "right_leg")]) == ((0, 2),)


def test_synthetic_examples_stay_consistent_under_augmentation():
  src = synthetic.SyntheticParts(synthetic.SyntheticConfig(image_size=64), "train")
  chain = T.Compose([T.RandomResizedCrop(56, scale=(0.5, 1.0)), T.RandomAffine(20),
                     T.RandomHorizontalFlip(0.5)])
  total = agree = 0
  for i in range(40):
    out = chain(src[i], np.random.default_rng(i))
    for g, ((x, y), vis) in enumerate(zip(out["keypoints"], out["keypoint_visible"])):
      if vis:
        total += 1
        agree += out["part_segmentation"][int(y), int(x)] == g + 1
  assert total > 100 and agree / total > 0.97


def test_normalize_uses_backbone_constants_and_transforms_pickle():
  from metonymy.models import vit
  config = vit.get_config("vit_tiny_test")
  image = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
  out = T.Normalize.from_config(config)({"image": image})["image"]
  assert out.dtype == np.float32
  expected = (image / 255.0 - np.array(config.image_mean)) / np.array(config.image_std)
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)

  chain = T.standard(40, train=True, mean=config.image_mean, std=config.image_std,
                     affine_degrees=10)
  copy = pickle.loads(pickle.dumps(chain))
  ex = synthetic.SyntheticParts(WORLD, "train")[0]
  a, b = chain(ex, np.random.default_rng(5)), copy(ex, np.random.default_rng(5))
  for key in a:
    np.testing.assert_array_equal(a[key], b[key])
  assert a["image"].shape == (40, 40, 3) and a["image"].dtype == np.float32
  evaluated = T.standard(40, train=False, mean=config.image_mean, std=config.image_std)(ex)
  assert evaluated["image"].shape == (40, 40, 3)


def _indices(ds):
  return [int(i) for batch in ds for i, v in zip(batch["index"], batch["valid"]) if v]


def test_shards_are_disjoint_and_cover_the_split():
  val = synthetic.SyntheticParts(WORLD, "val")  # 10 examples
  shards = [pipeline.make_pipeline(val, batch_size=4, train=False, shard_index=k, shard_count=3)
            for k in range(3)]
  batches = [list(ds) for ds in shards]
  assert [len(b) for b in batches] == [1, 1, 1]  # padded to equal, whole batches
  seen = [_indices(b) for b in batches]
  assert sorted(sum(seen, [])) == list(range(10))
  assert all(set(a).isdisjoint(b) for i, a in enumerate(seen) for b in seen[i + 1:])
  assert pipeline.num_batches(10, 4, train=False, shard_count=3) == 1
  # Training shards: equal length, disjoint, one epoch each.
  train = synthetic.SyntheticParts(WORLD, "train")  # 40 examples
  seen = [_indices(pipeline.make_pipeline(train, batch_size=5, train=True, num_epochs=1,
                                          shard_index=k, shard_count=2)) for k in range(2)]
  assert len(seen[0]) == len(seen[1]) == 20
  assert set(seen[0]).isdisjoint(seen[1]) and set(seen[0]) | set(seen[1]) == set(range(40))
  assert seen[0] != sorted(seen[0])  # shuffled
  unpadded = pipeline.make_pipeline(val, batch_size=4, train=False, shard_index=0, shard_count=1,
                                    pad_remainder=False)
  assert [len(b["index"]) for b in unpadded] == [4, 4, 2]


def test_global_batches_do_not_depend_on_the_process_count():
  # One process with batch 8, or 2 / 4 processes with 4 / 2 each: the same global batches, in
  # the same order, with the same augmentations (keyed by stream position, not by process).
  train = synthetic.SyntheticParts(WORLD, "train")  # 40 examples: batches straddle epochs
  chain = T.standard(40, train=True, mean=(0.5,) * 3, std=(0.25,) * 3)

  def global_batches(processes):
    its = [iter(pipeline.make_pipeline(train, batch_size=8 // processes, train=True, seed=5,
                                       transforms=chain, shard_index=k, shard_count=processes))
           for k in range(processes)]
    out = []
    for _ in range(7):  # 56 examples: into the second epoch
      shares = [next(it) for it in its]
      out.append({key: np.concatenate([s[key] for s in shares]) for key in ("index", "image")})
    return out

  one = global_batches(1)
  for processes in (2, 4):
    for step, (a, b) in enumerate(zip(one, global_batches(processes))):
      np.testing.assert_array_equal(a["index"], b["index"], err_msg=f"step {step}")
      np.testing.assert_array_equal(a["image"], b["image"], err_msg=f"step {step}")
  epoch = np.concatenate([b["index"] for b in one])[:40]
  assert sorted(epoch.tolist()) == list(range(40))
  assert pipeline.num_batches(40, 4, train=True, shard_count=2) == 5


def test_shuffle_is_seeded_and_reshuffles_every_epoch():
  train = synthetic.SyntheticParts(WORLD, "train")
  def order(seed):
    ds = pipeline.make_pipeline(train, batch_size=8, train=True, seed=seed, num_epochs=2,
                                shard_index=0, shard_count=1)
    return _indices(ds)
  first = order(0)
  assert first == order(0) and first != order(1)
  assert sorted(first[:40]) == sorted(first[40:]) == list(range(40))
  assert first[:40] != first[40:]


def test_iterator_checkpoint_round_trip_with_orbax(tmp_path):
  import grain
  import orbax.checkpoint as ocp
  train = synthetic.SyntheticParts(WORLD, "train")
  chain = T.standard(40, train=True, mean=(0.5,) * 3, std=(0.25,) * 3)

  def make():
    return pipeline.make_pipeline(train, batch_size=6, train=True, seed=3, transforms=chain,
                                  shard_index=0, shard_count=1)

  it = iter(make())
  for _ in range(8):  # past the first epoch boundary (40 // 6 = 6 batches an epoch)
    next(it)
  mngr = ocp.CheckpointManager(tmp_path / "ckpt")
  mngr.save(8, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
  mngr.wait_until_finished()
  expected = [next(it) for _ in range(3)]

  restored = iter(make())
  next(restored)  # a fresh iterator elsewhere in its stream, to show restore moves it
  mngr.restore(8, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(restored)))
  for want in expected:
    got = next(restored)
    assert set(got) == set(want)
    for key in want:
      np.testing.assert_array_equal(got[key], want[key], err_msg=key)
  mngr.close()


@pytest.mark.slow
def test_worker_processes_match_in_process_loading():
  train = synthetic.SyntheticParts(WORLD, "train")
  chain = T.standard(40, train=True, mean=(0.5,) * 3, std=(0.25,) * 3)
  def take(workers, n=5):
    ds = pipeline.make_pipeline(train, batch_size=4, train=True, seed=1, transforms=chain,
                                worker_count=workers, shard_index=0, shard_count=1)
    it = iter(ds)
    batches = [next(it) for _ in range(n)]
    state = it.get_state()
    return batches, state, it
  local, _, _ = take(0, 7)
  remote, state, it = take(2)
  for a, b in zip(local, remote):
    for key in a:
      np.testing.assert_array_equal(a[key], b[key], err_msg=key)
  # The multi-worker iterator state restores to the same next batches.
  ds = pipeline.make_pipeline(train, batch_size=4, train=True, seed=1, transforms=chain,
                              worker_count=2, shard_index=0, shard_count=1)
  resumed = iter(ds)
  resumed.set_state(state)
  for want in local[5:7]:
    np.testing.assert_array_equal(next(resumed)["image"], want["image"])


def test_check_cli_prints_json_last_line():
  result = subprocess.run([sys.executable, "-m", "metonymy.data", "check", "--dataset",
                           "synthetic", "--root", "/nonexistent"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  lines = result.stdout.strip().splitlines()
  assert len(lines) > 1  # human-readable lines come first
  report = json.loads(lines[-1])
  assert report["dataset"] == "synthetic" and report["num_attributes"] == 65
  assert report["splits"] == {"train": 10000, "val": 1000, "test": 2000}
  assert list(report["attribute_groups"]) == ["head", "body", "wing", "tail", "legs"]
  assert report["keypoint_groups"] == ["head", "body", "wing", "tail", "legs"]
  assert report["masks"] == 0 and report["warnings"] == []


def test_check_cli_data_error_exits_nonzero(monkeypatch, capsys):
  def broken(dataset, root, **options):
    assert options == {"uncertainty": "zeros"}
    raise base.DataError(f"{root}/train.csv: line 3: bad label 'x'")
  monkeypatch.setattr(data_main.data, "check", broken)
  code = data_main.main(["check", "--dataset", "chexpert", "--root", "/d",
                         "--chexpert-uncertainty", "zeros"])
  captured = capsys.readouterr()
  assert code == 1 and "/d/train.csv: line 3" in captured.err
  assert not captured.out.strip().splitlines()[-1].startswith("{")


_TWO_PROCESS_SCRIPT = """
import json, sys
import jax
jax.config.update("jax_platforms", "cpu")
jax.distributed.initialize(f"127.0.0.1:{sys.argv[1]}", num_processes=2, process_id=int(sys.argv[2]))
from metonymy.data import pipeline, synthetic
config = synthetic.SyntheticConfig(image_size=32, splits=(("val", 11),))
ds = pipeline.make_pipeline(synthetic.SyntheticParts(config, "val"), batch_size=4, train=False)
batches = list(ds)
indices = [int(i) for b in batches for i, v in zip(b["index"], b["valid"]) if v]
print(json.dumps({"process": jax.process_index(), "batches": len(batches), "indices": indices}))
jax.distributed.shutdown()
"""


@pytest.mark.slow
def test_two_jax_processes_see_disjoint_examples():
  import socket
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  procs = [subprocess.Popen([sys.executable, "-c", _TWO_PROCESS_SCRIPT, str(port), str(k)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True) for k in range(2)]
  outputs = []
  for proc in procs:
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    outputs.append(json.loads(out.strip().splitlines()[-1]))
  assert sorted(o["process"] for o in outputs) == [0, 1]
  assert outputs[0]["batches"] == outputs[1]["batches"] == 2  # 6 slots each, padded to 8
  a, b = (set(o["indices"]) for o in outputs)
  assert a.isdisjoint(b) and a | b == set(range(11))
