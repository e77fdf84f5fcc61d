"""Numbers as text, one way for every report of the runs (report.md, README's blocks, the
console): a fixed number of decimals, "n/a" for what was not measured."""

import math
from typing import Dict


def fmt(value, digits: int = 3) -> str:
  """`value` to `digits` decimals; "n/a" for None and non-finite values."""
  if value is None or (isinstance(value, float) and not math.isfinite(value)):
    return "n/a"
  return f"{value:.{digits}f}"


def fmt_int(value) -> str:
  return "n/a" if value is None else str(int(value))


def with_ci(results_block: Dict, key: str, digits: int = 3) -> str:
  """`results_block[key]` followed by its `<key>_ci` interval when there is one."""
  value, ci = results_block.get(key), results_block.get(f"{key}_ci")
  if ci and all(c is not None for c in ci):
    return f"{fmt(value, digits)} [{fmt(ci[0], digits)}, {fmt(ci[1], digits)}]"
  return fmt(value, digits)
