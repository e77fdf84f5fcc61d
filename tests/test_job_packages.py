"""The job packages (demo, table3, world_check) share metonymy/runs/ and nothing else of each
other's: none reaches another's package through any chain of imports, and runs/ reaches none."""

import pytest

from tests import test_layering


def _reached(graph, start_prefix):
  """Every module reachable by imports from the modules named `start_prefix*`."""
  seen, todo = set(), [m for m in graph if m.startswith(start_prefix)]
  while todo:
    module = todo.pop()
    for target in graph.get(module, ()):
      if target not in seen:
        seen.add(target)
        todo.append(target)
  return seen


def test_the_table3_job_reaches_nothing_of_the_demo():
  reached = _reached(test_layering.import_graph(), "metonymy.table3")
  assert not sorted(m for m in reached if m.startswith("metonymy.demo")), reached
  assert "metonymy.runs.subjobs" in reached  # Its sub-runs are the shared ones.


def test_the_demo_reaches_nothing_of_the_table3_job():
  reached = _reached(test_layering.import_graph(), "metonymy.demo")
  assert not sorted(m for m in reached if m.startswith("metonymy.table3")), reached


JOBS = ("metonymy.demo", "metonymy.table3", "metonymy.world_check")


@pytest.mark.parametrize("job", JOBS)
def test_a_job_package_reaches_no_other_job(job):
  reached = _reached(test_layering.import_graph(), job)
  others = tuple(j for j in JOBS if j != job)
  assert not sorted(m for m in reached if m.startswith(others)), job


def test_the_shared_runs_reach_no_job():
  reached = _reached(test_layering.import_graph(), "metonymy.runs")
  assert not sorted(m for m in reached if m.startswith(JOBS))
