"""colabs/explore_attention_masks.ipynb runs top to bottom on CPU (so it cannot rot), explores
what the demo ships (world v3 and its shipped stand-in), installs from the checkout it sits in
(no URL), and is committed executed: its outputs come from its committed code (issue 14, part 4;
issue 47). No placeholder URL is shown anywhere, and tools/set_repository_url.py records a real
one when it is known."""

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
  # The set-up cell comes first: it finds the checkout it sits in and installs that (pip
  # install -e REPO) only when metonymy is not importable; no URL to clone or install from.
  setup = code[0].source
  assert "def find_checkout(" in setup and '"install", "-q", "-e", REPO' in setup
  assert "http" not in setup and "git clone" not in setup
  assert "metonymy is installed from this checkout" in "".join(
      o.get("text", "") for o in code[0].outputs)
  # What the project ships today: the demo's world (v3, its default) and its shipped stand-in.
  text = "".join(o.get("text", "") for c in code for o in c.outputs)
  assert "demo_stand_in_v3_dense_world0.npz" in text and "plain tone 'part'" in text
  assert "world=v1" not in "".join(c.source for c in code)


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


def _tool():
  import importlib.util
  spec = importlib.util.spec_from_file_location(
      "set_repository_url", os.path.join(ROOT, "tools", "set_repository_url.py"))
  tool = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(tool)
  return tool


def test_no_placeholder_url_and_the_colab_badge_follows_the_recorded_url():
  """No page, notebook or pyproject.toml shows a placeholder repository URL; the Colab badge of
  colabs/README.md is there exactly when pyproject.toml records the URL, and built from it."""
  from metonymy import reporting
  tool = _tool()
  for path in ("pyproject.toml", "README.md", "CITATION.cff", os.path.join("colabs", "README.md"),
               os.path.join("colabs", "explore_attention_masks.ipynb")):
    with open(os.path.join(ROOT, path)) as f:
      text = f.read()
    assert "OWNER" not in text and "github.com/<" not in text, path
  url = tool.recorded_url()
  block = reporting.read_block(os.path.join(ROOT, tool.COLAB_README), tool.BADGE_BLOCK)[1]
  assert block.strip() == tool.badge_block(url).strip()
  with open(os.path.join(ROOT, "README.md")) as f:  # README's front page links no Colab either
    links = tool.COLAB_LINK.findall(f.read())
  assert set(links) <= ({tool.colab_prefix(url)} if url else set())


def test_set_repository_url_records_the_url_once_and_a_rerun_replaces_it(tmp_path):
  """The tool on a copy of pyproject.toml and colabs/README.md: the URL lands in
  [project.urls] (a table it adds, as pyproject.toml has none yet) and in the badge block; a
  second URL replaces the first instead of adding to it; pyproject.toml stays valid TOML."""
  import shutil
  import tomllib
  tool = _tool()
  (tmp_path / "colabs").mkdir()
  shutil.copy(os.path.join(ROOT, "pyproject.toml"), tmp_path / "pyproject.toml")
  shutil.copy(os.path.join(ROOT, "colabs", "README.md"), tmp_path / "colabs" / "README.md")
  assert tool.main(["set_repository_url.py", "https://example.org/x/y"]) == 2
  for url in ("https://github.com/first/metonymy", "https://github.com/second/metonymy"):
    tool.record(url, str(tmp_path))
    assert tool.recorded_url(str(tmp_path)) == url
    with open(tmp_path / "pyproject.toml", "rb") as f:
      project = tomllib.load(f)["project"]
    assert project["urls"] == {"Repository": url} and project["name"] == "metonymy"
    page = (tmp_path / "colabs" / "README.md").read_text()
    assert tool.COLAB_LINK.findall(page) == [tool.colab_prefix(url)]
    assert page.count(f"!git clone {url} /content/metonymy") == 1
  assert "github.com/first/" not in (tmp_path / "pyproject.toml").read_text()
