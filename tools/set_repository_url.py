"""Records the repository's URL in the one place it lives and everywhere it is shown.

  python tools/set_repository_url.py https://github.com/OWNER/metonymy

pyproject.toml's `[project.urls] Repository` is the one record; this rewrites it, and from it the
"Open in Colab" links (README.md, colabs/README.md, the notebook's first cell) and the notebook
set-up cell's `REPOSITORY`, which clones the repository under Colab. tests/test_colab.py checks
that they agree. Only GitHub URLs: Colab opens notebooks from GitHub.
"""

import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join("colabs", "explore_attention_masks.ipynb")
URL = re.compile(r"^https://github\.com/([\w.-]+)/([\w.-]+?)(\.git)?/?$")
PYPROJECT_URL = re.compile(r'^Repository = "(https://github\.com/[^"]+)"$', re.MULTILINE)
COLAB_LINK = re.compile(r"https://colab\.research\.google\.com/github/[\w.-]+/[\w.-]+/blob/main/")
NOTEBOOK_REPOSITORY = re.compile(r'REPOSITORY = "https://github\.com/[^"]+"')


def recorded_url() -> str:
  """The Repository URL of pyproject.toml."""
  with open(os.path.join(ROOT, "pyproject.toml")) as f:
    found = PYPROJECT_URL.search(f.read())
  if not found:
    raise ValueError("pyproject.toml has no `Repository = \"https://github.com/...\"` line under "
                     "[project.urls]")
  return found.group(1)


def colab_prefix(url: str) -> str:
  owner, name = URL.match(url).group(1, 2)
  return f"https://colab.research.google.com/github/{owner}/{name}/blob/main/"


def _rewrite(path: str, url: str) -> None:
  full = os.path.join(ROOT, path)
  with open(full) as f:
    text = f.read()
  text = COLAB_LINK.sub(colab_prefix(url), text)
  if path == "pyproject.toml":
    text = PYPROJECT_URL.sub(f'Repository = "{url}"', text)
  if path == NOTEBOOK:
    nb = json.loads(text)
    for cell in nb["cells"]:
      source = "".join(cell["source"])
      source = NOTEBOOK_REPOSITORY.sub(f'REPOSITORY = "{url}"', COLAB_LINK.sub(
          colab_prefix(url), source))
      lines = source.split("\n")
      cell["source"] = [line + "\n" for line in lines[:-1]] + [lines[-1]]
    text = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
  with open(full, "w") as f:
    f.write(text)


def main(argv) -> int:
  if len(argv) != 2 or not URL.match(argv[1]):
    print("usage: python tools/set_repository_url.py https://github.com/OWNER/NAME",
          file=sys.stderr)
    return 2
  url = URL.match(argv[1]).group(0).rstrip("/")
  url = url[:-4] if url.endswith(".git") else url
  for path in ("pyproject.toml", "README.md", os.path.join("colabs", "README.md"), NOTEBOOK):
    _rewrite(path, url)
  print(f"recorded {url} in pyproject.toml, README.md, colabs/README.md and {NOTEBOOK}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
