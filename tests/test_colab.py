"""colabs/explore_attention_masks.ipynb runs top to bottom on CPU (so it cannot rot), opens in
Colab (a set-up cell installs the package there and nothing elsewhere), and is committed executed:
its outputs come from its committed code (issue 14, part 4)."""

import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "colabs", "explore_attention_masks.ipynb")


def _output_kinds(cell):
  """What a code cell shows, not its pixels or numbers: ('stream', 'stdout') for printed text (runs
  of prints merged, since how a kernel splits a stream varies), ('display_data', mime types) for a
  figure, ... stderr (library warnings, which vary by machine) is left out."""
  kinds = []
  for out in cell.get("outputs", []):
    if out["output_type"] == "stream":
      if out["name"] == "stderr":
        continue
      kind = ("stream", out["name"])
      if kinds and kinds[-1] == kind:
        continue
    elif out["output_type"] == "error":
      kind = ("error", out.get("ename"))
    else:
      kind = (out["output_type"], tuple(sorted(out.get("data", {}))))
    kinds.append(kind)
  return kinds


def _figures(nb):
  return [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])
          if o.get("output_type") == "display_data" and "image/png" in o.get("data", {})]


def test_committed_notebook_is_executed_top_to_bottom_with_its_figures():
  import nbformat
  nb = nbformat.read(NOTEBOOK, as_version=4)
  code = [c for c in nb.cells if c.cell_type == "code"]
  # One kernel run, in order: execution counts 1..n (a cell edited and rerun, or never run,
  # breaks the sequence).
  assert [c.execution_count for c in code] == list(range(1, len(code) + 1))
  assert not [o for c in code for o in c.outputs if o.output_type == "error"]
  assert len(_figures(nb)) >= 4  # part maps, masks, attention, late vs early: visible on GitHub
  # The set-up cell comes first and installs only under Colab.
  setup = code[0].source
  assert 'if "google.colab" in sys.modules:' in setup and "pip" in setup
  assert "not under Colab" in "".join(o.get("text", "") for o in code[0].outputs)
  assert "colab.research.google.com/github/" in nb.cells[0].source  # the Open in Colab badge


@pytest.mark.slow
def test_explore_attention_masks_notebook_runs_and_its_committed_outputs_match(monkeypatch):
  import nbclient
  import nbformat
  # Train the notebook's own tiny model, whatever the caller's environment points at.
  monkeypatch.delenv("METONYMY_TWO_STAGE_WORKDIR", raising=False)
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  committed = nbformat.read(NOTEBOOK, as_version=4)
  nb = nbformat.read(NOTEBOOK, as_version=4)
  client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                   resources={"metadata": {"path": os.path.dirname(NOTEBOOK)}})
  client.execute()  # raises CellExecutionError naming the failing cell
  outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
  assert len(_figures(nb)) >= 4  # part maps, masks, attention, late vs early
  text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
  assert "relative change of the" in text and "early 0.0000" in text
  # The committed outputs come from the committed code: same cells, and each cell shows the same
  # kinds of output (text, figures) as it does when run now.
  assert len(nb.cells) == len(committed.cells)
  for i, (fresh, saved) in enumerate(zip(nb.cells, committed.cells)):
    assert fresh.cell_type == saved.cell_type, i
    if fresh.cell_type == "code":
      assert _output_kinds(fresh) == _output_kinds(saved), (
          f"cell {i}: the committed outputs are not what its code shows now; re-execute and "
          f"commit the notebook (see colabs/README.md)\n{fresh.source[:200]}")


def test_every_link_and_clone_uses_the_one_recorded_repository_url():
  import importlib.util
  import json
  spec = importlib.util.spec_from_file_location(
      "set_repository_url", os.path.join(ROOT, "tools", "set_repository_url.py"))
  tool = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(tool)
  url = tool.recorded_url()
  prefix = tool.colab_prefix(url)
  # colabs/README.md links the notebook; README's front page does not, until the URL is real.
  for path, required in (("README.md", False), (os.path.join("colabs", "README.md"), True)):
    with open(os.path.join(ROOT, path)) as f:
      links = tool.COLAB_LINK.findall(f.read())
    assert set(links) <= {prefix} and (links or not required), (path, links)
  with open(NOTEBOOK) as f:
    text = "".join("".join(c["source"]) for c in json.load(f)["cells"])
  assert set(tool.COLAB_LINK.findall(text)) == {prefix}
  assert tool.NOTEBOOK_REPOSITORY.findall(text) == [f'REPOSITORY = "{url}"']
