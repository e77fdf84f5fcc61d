"""metonymy/reporting.py: one block is replaced, the rest of the file is kept byte for byte."""

import pytest

from metonymy import reporting


def test_write_block_replaces_only_its_block(tmp_path):
  path = tmp_path / "README.md"
  path.write_text("# t\n<!-- a:begin -->\nold a\n<!-- a:end -->\nmid\n<!-- b:begin -->\nold b\n"
                  "<!-- b:end -->\nafter\n")
  reporting.write_block(str(path), "b", "new b\n")
  reporting.write_block(str(path), "b", "newer b")  # Replaced, not appended.
  assert path.read_text() == ("# t\n<!-- a:begin -->\nold a\n<!-- a:end -->\nmid\n"
                              "<!-- b:begin -->\nnewer b\n<!-- b:end -->\nafter\n")
  assert reporting.read_block(str(path), "a")[1] == "\nold a\n"


def test_missing_file_or_markers_name_them(tmp_path):
  with pytest.raises(FileNotFoundError, match="nope.md"):
    reporting.read_block(str(tmp_path / "nope.md"), "a")
  path = tmp_path / "README.md"
  path.write_text("<!-- a:end -->\n<!-- a:begin -->\n")  # Wrong order.
  with pytest.raises(ValueError, match=r"<!-- a:begin --> ... '<!-- a:end -->'|a:begin"):
    reporting.write_block(str(path), "a", "x")
  assert path.read_text() == "<!-- a:end -->\n<!-- a:begin -->\n"  # Nothing lost.


def test_every_generated_block_names_the_file_it_is_in():
  """A block's header gives the command that wrote it; the file that command names
  (`--readme PATH`, `--config.readme=PATH`) is the one the block is in, so rerunning it
  rewrites this block (docs/benchmarks.md's bench:vit once named README.md, where it no longer
  is)."""
  import glob
  import os
  import re
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  begin = re.compile(r"<!-- (\S+):begin -->")
  names = re.compile(r"--(?:config\.)?readme[= ]([^\s`]+)")
  found = 0
  for page in ["README.md"] + sorted(glob.glob("docs/**/*.md", root_dir=root, recursive=True)):
    with open(os.path.join(root, page)) as f:
      text = f.read()
    for name in begin.findall(text):
      block = reporting.read_block(os.path.join(root, page), name)[1]
      for named in names.findall(block):
        found += 1
        assert named == page, (page, name, named)
  assert found >= 5  # demo:results, both Table-3 blocks, bench:vit, bench:suite
