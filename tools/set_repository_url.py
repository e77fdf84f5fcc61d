"""Records the repository's URL, once it is known, where it is shown.

  python tools/set_repository_url.py https://github.com/<owner>/<name>

Until then the repository shows no URL at all (no placeholder): pyproject.toml has no
`[project.urls]` table and colabs/README.md's `colab:badge` block is empty, so the notebook is
opened from a checkout (its first cell installs that checkout). This adds, or replaces,
pyproject.toml's `[project.urls] Repository`, the one record, and from it writes the "Open in
Colab" badge and the clone command into colabs/README.md's block (metonymy/reporting.py).
tests/test_colab.py checks that the two agree and that a rerun replaces instead of adding. Only
GitHub URLs: Colab opens notebooks from GitHub.
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = "colabs/explore_attention_masks.ipynb"
COLAB_README = os.path.join("colabs", "README.md")
BADGE_BLOCK = "colab:badge"
URL = re.compile(r"^https://github\.com/([\w.-]+)/([\w.-]+?)(\.git)?/?$")
PYPROJECT_URL = re.compile(r'^Repository = "(https://github\.com/[^"]+)"$', re.MULTILINE)
URLS_TABLE = re.compile(r"^\[project\.urls\]$", re.MULTILINE)
COLAB_LINK = re.compile(r"https://colab\.research\.google\.com/github/[\w.-]+/[\w.-]+/blob/main/")


def _reporting():
  sys.path.insert(0, ROOT)  # metonymy/reporting.py, from this checkout.
  from metonymy import reporting
  return reporting


def recorded_url(root: str = ROOT) -> str:
  """The Repository URL of pyproject.toml, or "" while none is recorded."""
  with open(os.path.join(root, "pyproject.toml")) as f:
    found = PYPROJECT_URL.search(f.read())
  return found.group(1) if found else ""


def colab_prefix(url: str) -> str:
  owner, name = URL.match(url).group(1, 2)
  return f"https://colab.research.google.com/github/{owner}/{name}/blob/main/"


def badge_block(url: str) -> str:
  """The text of colabs/README.md's colab:badge block for `url` ("" for none)."""
  if not url:
    return ""
  return (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
          f"({colab_prefix(url)}{NOTEBOOK})\n(in Colab, first run `!git clone {url} "
          "/content/metonymy` in a cell: the notebook's first cell installs that checkout)")


def set_pyproject_url(text: str, url: str) -> str:
  """pyproject.toml's text with `Repository = "url"` under [project.urls], replaced if there,
  else added (with the table, before the first table after [project])."""
  line = f'Repository = "{url}"'
  if PYPROJECT_URL.search(text):
    return PYPROJECT_URL.sub(line, text)
  if URLS_TABLE.search(text):
    return URLS_TABLE.sub(f"[project.urls]\n{line}", text, count=1)
  project = text.index("[project]\n")
  after = text.find("\n[", project + 1)
  at = len(text) if after < 0 else after + 1
  return text[:at] + f"[project.urls]\n{line}\n\n" + text[at:]


def record(url: str, root: str = ROOT) -> None:
  """Writes `url` into pyproject.toml and colabs/README.md's badge block under `root`."""
  path = os.path.join(root, "pyproject.toml")
  with open(path) as f:
    text = f.read()
  with open(path, "w") as f:
    f.write(set_pyproject_url(text, url))
  _reporting().write_block(os.path.join(root, COLAB_README), BADGE_BLOCK, badge_block(url))


def main(argv) -> int:
  if len(argv) != 2 or not URL.match(argv[1]):
    print("usage: python tools/set_repository_url.py https://github.com/<owner>/<name>",
          file=sys.stderr)
    return 2
  url = URL.match(argv[1]).group(0).rstrip("/")
  url = url[:-4] if url.endswith(".git") else url
  record(url)
  print(f"recorded {url} in pyproject.toml and {COLAB_README}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
