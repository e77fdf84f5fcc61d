"""File helpers shared by the dataset readers: strict line parsing, image decoding, checks.

Every failure is a `base.DataError` naming the file (and line): a dataset is read completely or
not at all, never silently skewed.
"""

import os
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image

from metonymy.data import base



def require_file(path: Path) -> Path:
  if not path.is_file():
    raise base.DataError(f"missing required file: {path}")
  return path


def read_rows(path: Path, *, min_fields: int, max_fields: Optional[int] = None, skip: int = 0,
              maxsplit: int = -1) -> Iterator[Tuple[int, List[str]]]:
  """Yields (1-based line number, fields) for each non-blank line after the first `skip` lines.

  Raises DataError naming the file and line when a line has fewer than `min_fields` or more than
  `max_fields` (default: min_fields) whitespace-separated fields. With `maxsplit` the last field
  keeps its inner spaces (CUB's part names).
  """
  max_fields = min_fields if max_fields is None else max_fields
  require_file(path)
  with open(path, "r", encoding="utf-8", errors="replace") as f:
    for lineno, line in enumerate(f, 1):
      if lineno <= skip:
        continue
      fields = line.split(None, maxsplit) if maxsplit >= 0 else line.split()
      if not fields:
        continue  # Blank lines (a trailing newline or two) carry nothing.
      if not min_fields <= len(fields) <= max_fields:
        want = str(min_fields) if min_fields == max_fields else f"{min_fields}-{max_fields}"
        raise base.DataError(
            f"{path}:{lineno}: malformed line, expected {want} fields, got {len(fields)}: "
            f"{line.rstrip()!r}")
      yield lineno, fields


def parse_int(token: str, path: Path, lineno: int) -> int:
  try:
    return int(token)
  except ValueError:
    raise base.DataError(f"{path}:{lineno}: malformed line, {token!r} is not an integer") from None


def parse_float(token: str, path: Path, lineno: int) -> float:
  try:
    return float(token)
  except ValueError:
    raise base.DataError(f"{path}:{lineno}: malformed line, {token!r} is not a number") from None


def load_rgb(path: Path) -> np.ndarray:
  """Decodes an image file to uint8 [H, W, 3] RGB.

  Any failure raises DataError with the path: a missing, truncated or corrupt image must stop a
  run, never be skipped (a skipped image would silently shift what a split contains).
  """
  try:
    with Image.open(path) as im:
      return np.array(im.convert("RGB"), dtype=np.uint8)
  except FileNotFoundError:
    raise base.DataError(f"missing image: {path}") from None
  except Exception as e:  # PIL raises OSError, SyntaxError, ValueError, ... for broken files.
    raise base.DataError(f"corrupt image: {path} ({type(e).__name__}: {e})") from None


def check_split(split: str, splits: Sequence[str], dataset: str) -> None:
  if split not in splits:
    raise ValueError(f"{dataset} has splits {tuple(splits)}, not {split!r}")


def missing_images(paths: Sequence[Path]) -> List[Path]:
  return [p for p in paths if not os.path.isfile(p)]


def verify_split_images(split_paths: Dict[str, Sequence[Path]], verify: int,
                        progress: Optional[Callable[[str, int, int], None]] = None) -> int:
  """Every listed image must exist; the first `verify` of each split (all if < 0) must decode.

  Returns how many images were decoded. Every bad file is found before anything is raised: the
  DataError lists them all (missing and corrupt), so one pass over a dataset finds every broken
  file, not one per run. `progress(split, done, total)` is called as the decoding goes.
  """
  bad: List[str] = []
  decoded = 0
  for split, paths in split_paths.items():
    gone = set(missing_images(paths))
    bad.extend(f"missing image of split {split!r}: {p}" for p in paths if p in gone)
    todo = [p for p in (paths if verify < 0 else paths[:verify]) if p not in gone]
    for i, p in enumerate(todo):
      try:
        load_rgb(Path(p))
      except base.DataError as e:
        bad.append(f"{e} (split {split!r})")
      decoded += 1
      if progress is not None:
        progress(split, i + 1, len(todo))
  if bad:
    listed = "\n  ".join(bad)
    raise base.DataError(f"{len(bad)} bad image file(s) ({decoded} image(s) decoded, every listed "
                         f"image's existence checked):\n  {listed}")
  return decoded


def example_index(i, length: int, what: str) -> int:
  """i as a non-negative int in [0, length); negative i counts from the end like a list."""
  i = int(i)
  if i < 0:
    i += length
  if not 0 <= i < length:
    raise IndexError(f"index {i} out of range for {what} ({length} examples)")
  return i
