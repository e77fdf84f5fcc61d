"""tools/mutants.py's planted bugs still fit the code: checked in seconds here, so a change that
moves a mutant's target text fails the suite instead of stopping CI's mutation run at its end."""

import importlib.util
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _mutants_module():
  spec = importlib.util.spec_from_file_location("mutants", os.path.join(ROOT, "tools",
                                                                       "mutants.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


MUTANTS = _mutants_module()


@pytest.mark.parametrize("mutant", MUTANTS.MUTANTS, ids=lambda m: m.name)
def test_every_mutant_s_target_text_is_in_its_file_exactly_once(mutant):
  with open(os.path.join(ROOT, mutant.path)) as f:
    source = f.read()
  try:
    mutated = MUTANTS._mutated(source, mutant)  # Exits naming the text when it is not there once.
  except SystemExit as missing:
    pytest.fail(str(missing))
  assert mutated != source, f"mutant {mutant.name} changes nothing in {mutant.path}"


@pytest.mark.parametrize("mutant", MUTANTS.MUTANTS, ids=lambda m: m.name)
def test_every_mutant_s_tests_exist(mutant):
  for node in mutant.tests:
    path, _, name = node.partition("::")
    assert os.path.isfile(os.path.join(ROOT, path)), f"mutant {mutant.name}: no file {path}"
    if name:
      function = re.sub(r"\[.*\]$", "", name.split("::")[-1])
      with open(os.path.join(ROOT, path)) as f:
        assert re.search(rf"^def {re.escape(function)}\(", f.read(), re.M), (
            f"mutant {mutant.name}: no test {function} in {path}")


def test_mutant_names_are_unique():
  names = [m.name for m in MUTANTS.MUTANTS]
  assert len(names) == len(set(names))
