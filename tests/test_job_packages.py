"""The demo and the Table-3 job share metonymy/runs/ and nothing else of each other's: neither
reaches the other's package through any chain of imports, and runs/ reaches neither."""

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


def test_the_shared_runs_reach_neither_job():
  reached = _reached(test_layering.import_graph(), "metonymy.runs")
  assert not sorted(m for m in reached if m.startswith(("metonymy.demo", "metonymy.table3")))
