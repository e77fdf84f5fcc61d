"""Generated blocks of markdown files: the text between `<!-- NAME:begin -->` and
`<!-- NAME:end -->` is rewritten by the code that measured it; the rest of the file is left
alone. README.md holds the demo's blocks (demo:results, demo:seeds) and the Table-3 job's
(table3:results for world seed 0, table3:results:worldN for world seed N); docs/benchmarks.md
the benchmarks' (bench:vit, bench:suite)."""

import os
from typing import Tuple


def markers(name: str) -> Tuple[str, str]:
  return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def read_block(path: str, name: str) -> Tuple[str, str, str]:
  """(text before the begin marker, the block between the markers, text from the end marker
  on), markers excluded. FileNotFoundError / ValueError name the file and the markers."""
  begin, end = markers(name)
  if not os.path.exists(path):
    raise FileNotFoundError(f"README {path!r} does not exist.")
  with open(path) as f:
    text = f.read()
  start, stop = text.find(begin), text.find(end)
  if start < 0 or stop < start:
    raise ValueError(f"{path} has no '{begin}' ... '{end}' block (in that order); add the two "
                     "marker lines where the generated text should go.")
  return text[:start], text[start + len(begin):stop], text[stop + len(end):]


def write_block(path: str, name: str, body: str) -> None:
  """Replaces the block `name` of `path` with `body` (one newline after the begin marker and
  before the end marker)."""
  head, _, tail = read_block(path, name)
  begin, end = markers(name)
  with open(path, "w") as f:
    f.write(f"{head}{begin}\n{body.strip(chr(10))}\n{end}{tail}")
