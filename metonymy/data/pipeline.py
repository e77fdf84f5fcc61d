"""Grain pipelines over any random-access source (synthetic world, CUB, CelebA, CheXpert).

  ds = make_pipeline(source, batch_size=64, train=True, seed=0,
                     transforms=transforms.standard(64, train=True, mean=cfg.image_mean,
                                                    std=cfg.image_std))
  it = iter(ds)
  batch = next(it)   # {"image": float32 [B, H, W, 3], "attributes": [B, A], ..., "valid": [B]}

Training order: one global stream, the same on every process: the index space is shuffled with
the seed (reshuffled every epoch) and repeated; element i of that stream is loaded and augmented
with a generator derived from (seed, i). Global batch s is elements [s G, (s + 1) G) of the stream
(G = batch_size x process_count) and process p takes its p-th slice of batch_size. So the global
batch, its order and its augmentations do not depend on how many processes share it: one process
with batch G and P processes with batch G / P see the same examples in the same order, and a
multi-host run reproduces the single-process one (tests/test_multiprocess.py). Batches may
straddle epoch boundaries; every example appears exactly once per epoch.

Evaluation: process p of P reads the indices p, p + P, p + 2P, ..., padded to equal length and to
whole batches with copies of a real example marked `valid = False`, so no example is dropped and
every process runs the same number of full, static-shape batches. Every element carries `valid`
(bool); in training it is always True.

Iterator state checkpoints with Orbax next to the model state:

  mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(train_state),
                                          data=grain.checkpoint.CheckpointSave(it)))
  mngr.restore(step, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(it)))

after which `next(it)` is exactly the batch that followed the saved one.
"""

import math
from typing import Callable, Dict, Optional

from absl import flags
import grain
import jax
import numpy as np

Example = Dict[str, np.ndarray]


def _seed_for(*parts: int) -> int:
  # A stable 31-bit seed from several integers (Grain seeds must fit in int32 on some paths).
  return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0] & 0x7FFFFFFF)


class _Load:
  """Element i -> transformed example of the source; picklable (holds the source by value).

  Index -1 is padding: a real example (the shard's first) with `valid` False.
  """

  def __init__(self, source, transforms: Optional[Callable], pad_index: int):
    self.source = source
    self.transforms = transforms
    self.pad_index = pad_index

  def __call__(self, index, rng: np.random.Generator) -> Example:
    index = int(index)
    valid = index >= 0
    example = dict(self.source[index if valid else self.pad_index])
    if self.transforms is not None:
      example = self.transforms(example, rng)
    example["valid"] = np.bool_(valid)
    return example


def shard_indices(num_examples: int, shard_index: int, shard_count: int, *,
                  batch_size: int = 1, pad: bool = True) -> np.ndarray:
  """int64 indices of one evaluation shard; -1 marks padding (see the module docstring)."""
  if not 0 <= shard_index < shard_count:
    raise ValueError(f"shard_index {shard_index} not in [0, {shard_count})")
  indices = np.arange(shard_index, num_examples, shard_count, dtype=np.int64)
  if not pad:
    return indices
  per_shard = math.ceil(num_examples / shard_count)
  per_shard = math.ceil(per_shard / batch_size) * batch_size
  return np.concatenate([indices, np.full(per_shard - len(indices), -1, np.int64)])


class _ProcessShare(grain.MapDataset):
  """Process p's share of a global stream: element j of micro-batch s is stream element
  s * batch_size * shard_count + p * batch_size + j."""

  def __init__(self, parent: grain.MapDataset, batch_size: int, shard_index: int,
               shard_count: int):
    super().__init__(parent)
    self._batch_size, self._shard_index, self._shard_count = batch_size, shard_index, shard_count

  def __len__(self) -> int:
    return len(self._parent) // (self._batch_size * self._shard_count) * self._batch_size

  def __getitem__(self, index):
    if isinstance(index, slice):
      return self.slice(index)
    step, offset = divmod(int(index), self._batch_size)
    global_batch = self._batch_size * self._shard_count
    return self._parent[step * global_batch + self._shard_index * self._batch_size + offset]

  def __str__(self) -> str:
    return (f"_ProcessShare(batch_size={self._batch_size}, shard={self._shard_index}/"
            f"{self._shard_count})")


def make_pipeline(source, *, batch_size: int, train: bool, seed: int = 0,
                  transforms: Optional[Callable] = None, num_epochs: Optional[int] = None,
                  worker_count: int = 0, worker_buffer_size: int = 2,
                  shard_index: Optional[int] = None, shard_count: Optional[int] = None,
                  pad_remainder: bool = True, read_threads: int = 1,
                  prefetch_batches: int = 4) -> grain.IterDataset:
  """A batched Grain IterDataset over `source` (anything with __len__ and __getitem__).

  Args:
    source: random-access source of example dicts (base.py); picklable if worker_count > 0.
    batch_size: examples per batch on this process (the global batch is batch_size x
      shard_count).
    train: one global shuffled stream (reseeded every epoch), of which this process takes its
      slice of every global batch; repeats forever by default. Otherwise keep the source order,
      shard it by striding and pad the last batch (see `pad_remainder`).
    seed: shuffle and augmentation seed; the same on every process.
    transforms: `f(example, rng) -> example`, e.g. `transforms.standard(...)`; must be picklable
      if worker_count > 0.
    num_epochs: passes over the data; None = forever when training, 1 otherwise.
    worker_count: worker processes (Grain mp_prefetch); 0 = load in this process's threads.
    worker_buffer_size: batches each worker may hold ahead.
    shard_index, shard_count: this process's shard; default jax.process_index() / process_count().
    pad_remainder: evaluation only: pad shards to equal, whole batches with `valid = False`
      copies; if False the last batch of a shard may be short.
    read_threads, prefetch_batches: in-process read-ahead (threads, and batches in flight). One
      thread suits NumPy-bound sources like the synthetic world (more threads contend for the
      GIL and read fewer examples a second: docs/experiments.md); I/O- and JPEG-bound sources gain
      from more, since decoding releases the GIL. For CPU-bound work use worker_count.
  """
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  if shard_index is None or shard_count is None:
    shard_index = jax.process_index() if shard_index is None else shard_index
    shard_count = jax.process_count() if shard_count is None else shard_count
  if not 0 <= shard_index < shard_count:
    raise ValueError(f"shard_index {shard_index} not in [0, {shard_count})")
  if num_epochs is None:
    num_epochs = None if train else 1
  if train:
    if len(source) == 0:
      raise ValueError("The training source is empty.")
    ds = grain.MapDataset.source(np.arange(len(source), dtype=np.int64))
    ds = ds.shuffle(seed=_seed_for(seed, 0))
    if num_epochs != 1:
      ds = ds.repeat(num_epochs)
    # Augmentations are keyed by the position in the global stream, not by the process.
    ds = ds.random_map(_Load(source, transforms, 0), seed=_seed_for(seed, 1))
    ds = _ProcessShare(ds, batch_size, shard_index, shard_count)
  else:
    indices = shard_indices(len(source), shard_index, shard_count, batch_size=batch_size,
                            pad=pad_remainder)
    pad_index = int(indices[0]) if len(indices) and indices[0] >= 0 else 0
    ds = grain.MapDataset.source(indices)
    if num_epochs != 1:
      ds = ds.repeat(num_epochs)
    ds = ds.random_map(_Load(source, transforms, pad_index), seed=_seed_for(seed, 1, shard_index))
  ds = ds.batch(batch_size, drop_remainder=train)
  it = ds.to_iter_dataset(grain.ReadOptions(num_threads=read_threads,
                                            prefetch_buffer_size=prefetch_batches))
  if worker_count > 0:
    _allow_unparsed_absl_flags()
    it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=worker_count,
                                                     per_worker_buffer_size=worker_buffer_size))
  return it


def _allow_unparsed_absl_flags():
  """Grain's worker processes read absl flags (profiling options) and raise
  UnparsedFlagAccessError in programs that never parsed them (not started with absl.app) once JAX
  is imported: google/grain#1355, fixed upstream after grain 0.2.18. Marking the flags parsed
  keeps their defaults; programs that did parse their flags are untouched."""
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


def num_batches(num_examples: int, batch_size: int, *, train: bool, shard_count: int = 1) -> int:
  """Batches one epoch yields on each process (on the largest shard when evaluation is unpadded);
  in training, whole global batches of batch_size x shard_count per epoch."""
  if train:
    return num_examples // (batch_size * shard_count)
  return math.ceil(math.ceil(num_examples / shard_count) / batch_size)
