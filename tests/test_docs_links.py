"""No page of the documentation points at a file a clone does not have.

Every markdown link of README.md, docs/**/*.md and the folders' READMEs must resolve inside the
repository to a file or folder that exists; every backticked relative path (inline code and
fenced blocks, where commands are typed from the repository root) must stay inside the
repository. Links resolve from the page's folder, as GitHub renders them; backticked paths from
the repository root, where README's commands run.
"""

import os
import re
from pathlib import Path
from typing import List, Tuple

import pytest

ROOT = Path(__file__).resolve().parent.parent

_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
# The target of an inline link or image, `[text](target "title")`; the text may itself hold an
# image (a badge), so only the `](` that ends it is matched.
_LINK_TARGET = re.compile(r"\]\(\s*<?([^)\s>]*)>?")
_REFERENCE_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s+<?([^\s>]+)>?", re.M)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
# What separates the paths in a command line: blanks, quotes, brackets, `--flag=PATH`, lists.
_TOKEN_SEPARATORS = re.compile(r"[\s\"'(){}\[\]<>=,;|]+")


def pages(root: Path = ROOT) -> List[Path]:
  found = [root / "README.md"] + sorted((root / "docs").glob("**/*.md"))
  found += [p for p in (root / d / "README.md" for d in ("colabs", "launch")) if p.is_file()]
  return [p for p in found if p.is_file()]


def split_code(text: str) -> Tuple[str, List[str]]:
  """(the page's prose, code spans removed; the code: fenced blocks and inline spans)."""
  prose, code, fenced = [], [], None
  for line in text.splitlines():
    fence = _FENCE.match(line)
    if fenced is None and fence:
      fenced = fence.group(1)
      continue
    if fenced is not None:
      if fence and fence.group(1) == fenced:
        fenced = None
      else:
        code.append(line)
      continue
    prose.append(line)
  prose_text = "\n".join(prose)
  code += [m.group(2) for m in _CODE_SPAN.finditer(prose_text)]
  return _CODE_SPAN.sub(" ", prose_text), code


def _inside(path: Path, root: Path) -> bool:
  return os.path.normpath(path) == os.path.normpath(root) or os.path.normpath(path).startswith(
      os.path.normpath(root) + os.sep)


def _resolve(base: Path, target: str) -> Path:
  return Path(os.path.normpath(base / target))


def problems(page: Path, root: Path = ROOT) -> List[str]:
  """One line per link or backticked path of `page` that leaves `root` or (links) is missing."""
  prose, code = split_code(page.read_text(encoding="utf-8"))
  name = os.path.relpath(page, root)
  found = []
  targets = _LINK_TARGET.findall(prose) + _REFERENCE_DEFINITION.findall(prose)
  for target in targets:
    if not target or target.startswith("#") or _SCHEME.match(target):
      continue  # An anchor on the same page, or a URL.
    file_part = target.split("#", 1)[0].split("?", 1)[0]
    resolved = _resolve(root if file_part.startswith("/") else page.parent,
                        file_part.lstrip("/"))
    if not _inside(resolved, root):
      found.append(f"{name}: link ({target}) points outside the repository")
    elif not resolved.exists():
      found.append(f"{name}: link ({target}) names a file the repository does not have")
  for span in code:
    for token in _TOKEN_SEPARATORS.split(span):
      if not token or token.startswith(("/", "~", "$")) or _SCHEME.match(token):
        continue  # Absolute paths and URLs are the user's own places, not the clone's.
      if ".." in Path(token).parts and not _inside(_resolve(root, token), root):
        found.append(f"{name}: `{token}` points outside the repository")
  return found


@pytest.mark.parametrize("page", pages(), ids=lambda p: os.path.relpath(p, ROOT))
def test_page_points_only_inside_the_repository(page):
  assert problems(page) == []


def test_the_check_catches_what_it_is_for(tmp_path):
  """The checker on a planted page: each kind of bad reference is reported, the good ones not."""
  (tmp_path / "docs").mkdir()
  (tmp_path / "launch").mkdir()
  (tmp_path / "launch" / "README.md").write_text("# launch\n")
  page = tmp_path / "docs" / "page.md"
  page.write_text(
      "Good: [launch](../launch/README.md#section), [top](#top), [web](https://example.org/a),\n"
      "[![badge](https://example.org/b.svg)](https://example.org/c), `/data/CUB_200_2011`,\n"
      "`configs/demo.py:small`, `DIR/report.md`, `~/tensorflow_datasets`.\n"
      "Bad: [away](../../elsewhere/notes.md), [gone](missing.md#x), the spec\n"
      "(`../shared/paper/spec.txt`), and a link in code `[not a link](../nope.md)` is a path.\n"
      "[ref]: ../../outside.md\n\n"
      "```bash\n"
      "python -m metonymy.main --config=../shared/configs/x.py --workdir=/tmp/w\n"
      "[fenced](../../not/a/link.md)\n"
      "```\n")
  assert problems(page, tmp_path) == [
      "docs/page.md: link (../../elsewhere/notes.md) points outside the repository",
      "docs/page.md: link (missing.md#x) names a file the repository does not have",
      "docs/page.md: link (../../outside.md) points outside the repository",
      "docs/page.md: `../shared/configs/x.py` points outside the repository",
      "docs/page.md: `../../not/a/link.md` points outside the repository",
      "docs/page.md: `../shared/paper/spec.txt` points outside the repository",
      "docs/page.md: `../nope.md` points outside the repository",
  ]
  assert pages(tmp_path) == [page, tmp_path / "launch" / "README.md"]
