"""The table of checkpoint layouts: how each family's keys map to `ViTConfig` + params.

A layout module registers `Layout`s at import; `find_layout` picks the one that fits a checkpoint,
restricted to a family (or `family/layout`) when the user names one.
"""

import dataclasses
from typing import Callable, Dict, List, Optional, Tuple

from metonymy.converters.io import CheckpointError, RawCheckpoint
from metonymy.converters.mapping import KeyReader
from metonymy.models.vit import ViTConfig

ConvertFn = Callable[[KeyReader, RawCheckpoint], Tuple[ViTConfig, dict]]


@dataclasses.dataclass(frozen=True)
class Layout:
  family: str  # e.g. "dinov2"
  name: str  # e.g. "original", "timm", "hf"
  detect: Callable[[RawCheckpoint], bool]
  convert: ConvertFn
  description: str = ""

  @property
  def full_name(self) -> str:
    return f"{self.family}/{self.name}"


_LAYOUTS: List[Layout] = []


def register(layout: Layout) -> Layout:
  if any(l.full_name == layout.full_name for l in _LAYOUTS):
    raise ValueError(f"Layout {layout.full_name} registered twice.")
  _LAYOUTS.append(layout)
  return layout


def layouts() -> List[Layout]:
  return list(_LAYOUTS)


def families() -> List[str]:
  return sorted({l.family for l in _LAYOUTS})


def find_layout(raw: RawCheckpoint, family: Optional[str] = None) -> Layout:
  """The first registered layout that detects `raw`, within `family` ("f" or "f/layout")."""
  candidates = _LAYOUTS
  if family:
    fam, _, name = family.partition("/")
    candidates = [l for l in _LAYOUTS if l.family == fam and (not name or l.name == name)]
    if not candidates:
      known = sorted(l.full_name for l in _LAYOUTS)
      raise CheckpointError(f"Unknown family {family!r}; known families/layouts: {known}")
    if name:  # An explicit layout is taken as given; the key check reports what does not fit.
      return candidates[0]
  for layout in candidates:
    if layout.detect(raw):
      return layout
  if family:  # The user named the family: convert with it and let the key check speak.
    return candidates[0]
  sample = sorted(raw.tensors)[:12]
  raise CheckpointError(
      f"{raw.path}: no known layout{' of family ' + repr(family) if family else ''} matches this "
      f"checkpoint. First keys: {sample}. Known layouts: {[l.full_name for l in candidates]}. "
      "Pass --family (or family/layout) if detection picked wrongly.")


def describe() -> Dict[str, str]:
  return {l.full_name: l.description for l in _LAYOUTS}
