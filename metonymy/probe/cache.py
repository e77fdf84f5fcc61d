"""A resumable on-disk array store, written in chunks.

One folder per stream (e.g. `<cache>/<backbone>/<dataset>/<split>/early/`) holding `meta.json`
(what the arrays are a function of, and the chunking) and `chunk_<i>.npz`, each the arrays of
examples [i * chunk_size, min((i + 1) * chunk_size, N)). A chunk is written to a temporary file
and renamed into place, so a chunk file that exists is complete: an interrupted extraction
resumes at the first missing chunk, and nothing already written is recomputed.
"""

import hashlib
import json
import os
import tempfile
from typing import Dict, List, Mapping

import jax
import numpy as np

from metonymy.workdir import layout


def fingerprint(obj) -> str:
  """Short stable hash of a JSON-serializable object (key order does not matter)."""
  text = json.dumps(obj, sort_keys=True, default=str)
  return hashlib.sha256(text.encode()).hexdigest()[:12]


def params_fingerprint(params) -> str:
  """Hash of every parameter's path, shape, dtype and bytes: two backbones share a cache only if
  their weights are bit-identical."""
  digest = hashlib.blake2b(digest_size=8)
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    array = np.ascontiguousarray(np.asarray(leaf))
    digest.update(f"{jax.tree_util.keystr(path)}:{array.shape}:{array.dtype}".encode())
    digest.update(array.view(np.uint8).ravel() if array.size else b"")
  return digest.hexdigest()


class ChunkStore:
  """Chunked arrays of N examples in `directory` (see the module docstring)."""

  def __init__(self, directory: str, meta: Mapping, num_examples: int, chunk_size: int):
    if chunk_size < 1:
      raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    self.directory = directory
    self.num_examples = int(num_examples)
    self.chunk_size = int(chunk_size)
    self.meta = {"meta": dict(meta), "num_examples": self.num_examples,
                 "chunk_size": self.chunk_size}
    os.makedirs(directory, exist_ok=True)
    meta_path = os.path.join(directory, "meta.json")
    if os.path.exists(meta_path):
      with open(meta_path) as f:
        existing = json.load(f)
      if json.loads(json.dumps(self.meta, default=str)) != existing:
        raise ValueError(f"{meta_path} describes different features than requested; delete "
                         f"{directory} (or choose another features.cache_dir). On disk: "
                         f"{existing}; requested: {self.meta}")
    else:
      layout.write_text(meta_path, json.dumps(self.meta, indent=2, sort_keys=True, default=str))

  @property
  def num_chunks(self) -> int:
    return -(-self.num_examples // self.chunk_size)

  def chunk_range(self, i: int):
    start = i * self.chunk_size
    return start, min(start + self.chunk_size, self.num_examples)

  def _path(self, i: int) -> str:
    return os.path.join(self.directory, f"chunk_{i:05d}.npz")

  def has(self, i: int) -> bool:
    return os.path.exists(self._path(i))

  def missing(self) -> List[int]:
    return [i for i in range(self.num_chunks) if not self.has(i)]

  def complete(self) -> bool:
    return not self.missing()

  def write(self, i: int, arrays: Mapping[str, np.ndarray]) -> None:
    start, stop = self.chunk_range(i)
    for name, value in arrays.items():
      if np.shape(value)[0] != stop - start:
        raise ValueError(f"chunk {i} of {self.directory}: {name} has {np.shape(value)[0]} rows, "
                         f"expected {stop - start}")
    fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp.npz")
    os.close(fd)
    try:
      np.savez(tmp, **{k: np.asarray(v) for k, v in arrays.items()})
      os.replace(tmp, self._path(i))
    finally:
      if os.path.exists(tmp):
        os.remove(tmp)

  def read(self, i: int) -> Dict[str, np.ndarray]:
    with np.load(self._path(i)) as archive:
      return {k: archive[k] for k in archive.files}

  def load(self) -> Dict[str, np.ndarray]:
    """All chunks concatenated; every chunk must exist."""
    missing = self.missing()
    if missing:
      raise ValueError(f"{self.directory}: chunks {missing} are missing; run the extraction")
    chunks = [self.read(i) for i in range(self.num_chunks)]
    if not chunks:
      return {}
    return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}
