"""Every `:arg` of the demo and the Table-3 job runs to its first training step, or is refused
with one `error:` line before anything is written.

A config that loads can still fail once it runs (`synthetic_table3.py:split=val` once emptied
the benchmark's val split and the stand-in's quality check then opened it). Each run below goes
through the stand-in (pretrained at the tiny sizes: the shipped ones are for the full sizes),
its quality check, the benchmark where the job has one, and stops when the trainer has taken its
first step. Together the runs hold every argument each config accepts and every value of the
arguments that choose between routes (world, stand-in objective, priors, split); the default
(no argument but the size) runs to the end in tests/helpers/shared_runs.py.
"""

import ast
import inspect
import os
import re
import subprocess
import sys

import pytest

from metonymy import config_lib, launcher
from metonymy.workdir import writers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "configs")

# configs/<name>.py -> the `:arg`s run here; `tiny` / `small` keep each to seconds of training.
RUNS = {
    "demo": ("tiny,world=v1", "tiny,world=v2",
             "tiny,world=v3,stand_in_objective=self_supervised",
             "tiny,stand_in_objective=attributes",
             "tiny,stand_in,stand_in_objective=attributes_then_dense,registers=2,dense_stages=2"),
    "synthetic_table3": (
        "small,world=v3,split=val,priors=off,paper_stage2_rate,demo_length,"
        "stand_in_objective=attributes_then_dense,dense_stages=2",
        "small,world=v1,priors=paper,total_variation=1,split=test",
        "small,world=v2,stand_in_objective=attributes,registers=2",
        "small,stand_in_objective=self_supervised"),
}
# The arguments that choose a route, and the values each takes (the configs refuse any other).
ROUTES = {"world": ("v1", "v2", "v3"),
          "stand_in_objective": ("attributes", "self_supervised", "attributes_then_dense"),
          "priors": ("paper", "off"), "split": ("val", "test")}


class _FirstStep(BaseException):
  """Raised when the trainer has taken its first step (not an Exception: no job catches it)."""


def _accepted(name):
  """The argument names configs/<name>.py accepts, as its own error message lists them."""
  with pytest.raises(ValueError) as error:
    config_lib.load_config(os.path.join(CONFIGS, f"{name}.py"), "no_such_argument")
  return set(ast.literal_eval(re.search(r"accepts (\[.*\])", str(error.value)).group(1)))


@pytest.mark.parametrize("name", sorted(RUNS))
def test_the_runs_hold_every_argument_and_every_route(name):
  given = [dict(item.partition("=")[::2] for item in arg.split(",")) for arg in RUNS[name]]
  assert _accepted(name) == {key for args in given for key in args}
  for key, values in ROUTES.items():
    if key in _accepted(name):
      assert {args[key] for args in given if key in args} == set(values), key


def _stop_at_the_trainers_first_step(monkeypatch):
  real = writers.Progress

  def progress(*args, **kwargs):  # made right after the first step (trainer.py)
    if inspect.stack()[1].filename.endswith(os.path.join("training", "trainer.py")):
      raise _FirstStep()
    return real(*args, **kwargs)

  monkeypatch.setattr(writers, "Progress", progress)


@pytest.mark.slow
@pytest.mark.parametrize("name,arg", [(n, a) for n, args in RUNS.items() for a in args],
                         ids=[f"{n}:{a}" for n, args in RUNS.items() for a in args])
def test_each_arg_runs_to_its_first_training_step(name, arg, tmp_path, monkeypatch):
  config = config_lib.load_config(os.path.join(CONFIGS, f"{name}.py"), arg)
  config.run_processes = 1  # in this process, where the trainer's first step is seen
  if config.get("mode") == "stand_in":
    # Step 1 alone is all of that mode: it runs to its end, written here, not to assets/.
    config.stand_in_output = str(tmp_path / "stand_in")
    launcher.launch(config, str(tmp_path / "run"))
    assert os.path.exists(config.stand_in_output + ".npz")
    return
  _stop_at_the_trainers_first_step(monkeypatch)
  with pytest.raises(_FirstStep):
    launcher.launch(config, str(tmp_path / "run"))


def test_a_refused_arg_is_one_error_line_and_writes_nothing(tmp_path):
  for config in ("configs/demo.py:tiny,world=v1,stand_in_objective=self_supervised",
                 "configs/synthetic_table3.py:small,split=train"):
    proc = subprocess.run([sys.executable, "-m", "metonymy.main", f"--config={config}",
                           f"--workdir={tmp_path / 'W'}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0 and len(lines) == 1 and lines[0].startswith("error: "), lines
    assert not (tmp_path / "W").exists()
