"""Console progress of a demo run: one line per step with the elapsed time, so a newcomer sees
where a run of several minutes is, and each step's seconds for the report's timing table."""

import time
from typing import Dict
from metonymy import console


class Steps:
  """Numbered steps; `begin` closes the previous one, `finish` returns {step: seconds, "total"}."""

  def __init__(self, total: int):
    self.total, self.index, self.start = total, 0, time.perf_counter()
    self.seconds: Dict[str, float] = {}
    self._name, self._began = None, None

  def begin(self, name: str, what: str) -> None:
    self._close()
    self.index += 1
    self._name, self._began = name, time.perf_counter()
    console.console(f"\n[demo] ({self.index}/{self.total}) {what}  "
                    f"[{self.elapsed():.0f} s elapsed]")

  def _close(self) -> None:
    if self._name is not None:
      self.seconds[self._name] = time.perf_counter() - self._began
      console.console(f"[demo] {self._name} done in {self.seconds[self._name]:.0f} s")
      self._name = None

  def finish(self) -> Dict[str, float]:
    self._close()
    self.seconds["total"] = self.elapsed()
    return self.seconds

  def elapsed(self) -> float:
    return time.perf_counter() - self.start
