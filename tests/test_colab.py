"""colabs/explore_attention_masks.ipynb runs top to bottom on CPU (so it cannot rot)."""

import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "colabs", "explore_attention_masks.ipynb")


@pytest.mark.slow
def test_explore_attention_masks_notebook_runs(monkeypatch):
  import nbclient
  import nbformat
  # Train the notebook's own tiny model, whatever the caller's environment points at.
  monkeypatch.delenv("METONYMY_TWO_STAGE_WORKDIR", raising=False)
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  nb = nbformat.read(NOTEBOOK, as_version=4)
  client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                   resources={"metadata": {"path": os.path.dirname(NOTEBOOK)}})
  client.execute()  # raises CellExecutionError naming the failing cell
  outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
  figures = [o for o in outputs
             if o.get("output_type") == "display_data" and "image/png" in o.get("data", {})]
  assert len(figures) >= 4  # part maps, masks, attention, late vs early
  text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
  assert "relative change of the" in text and "early 0.0000" in text
