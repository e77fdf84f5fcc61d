"""Executes colabs/explore_attention_masks.ipynb for committing, away from this checkout.

  python tools/execute_notebook.py [NOTEBOOK]

The repository's files (tracked, and new ones git does not ignore) are copied into a temporary
folder and the notebook runs there on the CPU, importing that copy, so the outputs show no path
of this machine (stderr, where libraries warn with their install paths, is dropped); the
executed notebook is written back in place. tests/test_colab.py checks
that the committed outputs come from the committed code.
"""

import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join("colabs", "explore_attention_masks.ipynb")


def main(argv) -> int:
  import nbclient
  import nbformat
  notebook = argv[1] if len(argv) > 1 else DEFAULT
  files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
  with tempfile.TemporaryDirectory(prefix="metonymy-notebook-") as tmp:
    copy = os.path.join(tmp, "metonymy")
    for path in files:
      if os.path.isfile(os.path.join(ROOT, path)):
        os.makedirs(os.path.dirname(os.path.join(copy, path)), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, path), os.path.join(copy, path))
    os.environ.update(JAX_PLATFORMS="cpu", PYTHONPATH=copy)  # the kernel imports the copy
    os.environ.pop("METONYMY_TWO_STAGE_WORKDIR", None)
    nb = nbformat.read(os.path.join(copy, notebook), as_version=4)
    nbclient.NotebookClient(nb, timeout=900, kernel_name="python3", resources={
        "metadata": {"path": os.path.dirname(os.path.join(copy, notebook))}}).execute()
    for cell in nb.cells:  # Library warnings on stderr name this machine's paths; not kept.
      if cell.cell_type == "code":
        cell.outputs = [o for o in cell.outputs
                        if not (o.output_type == "stream" and o.name == "stderr")]
    text = nbformat.writes(nb)
    leaked = ROOT in text
  with open(os.path.join(ROOT, notebook), "w") as f:
    f.write(text)
  print(f"executed {notebook} in a temporary copy and wrote it back"
        + (f"; WARNING: its outputs name {ROOT}" if leaked else ""))
  return 1 if leaked else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
