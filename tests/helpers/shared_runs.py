"""Runs that several test files read, made once per pytest command (tests/conftest.py makes each
a session fixture, `<name>_run`, that the xdist workers share).

Each is a whole job (a demo, a Table-3 job, a training run), and
the tests that read it ask different questions of the same files: a second copy per test file
or per worker would only repeat the job. The demo and the Table-3 job are written in one folder
and moved (`mv`) to another before any test sees them, so every reader also checks that a moved
workdir is complete where it is, and tests/test_workdir_records.py that no file names the folder
it was written in.

Readers must not change a shared run. A test that writes into one (a rerun, a kill, a refused
config) copies it first (`shutil.copytree`); the fixture checks at the end of the session that
its files are as the job left them.
"""

import dataclasses
import os
import shutil
import subprocess
import sys
from typing import Callable, Dict

from metonymy import reporting

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO_CONFIG = os.path.join(ROOT, "configs", "demo.py")
TABLE3_CONFIG = os.path.join(ROOT, "configs", "synthetic_table3.py")
# The uninterrupted synthetic run's steps: enough for a signal or a kill to land mid-run.
SYNTHETIC_SINGLE_STEPS = 40
# The tiny demo's run seed: not the default 0, so that a sub-job keeping its own config's seed
# shows (tests/test_demo.py).
TINY_DEMO_SEED = 3


@dataclasses.dataclass(frozen=True)
class Run:
  workdir: str
  output: str = ""  # A `python -m metonymy.main` run's console output (stdout).


@dataclasses.dataclass(frozen=True)
class TrainedRun:
  workdir: str
  scalars: Dict[str, float]  # What trainer.run returned: the last evaluation's scalars.


@dataclasses.dataclass(frozen=True)
class MovedRun:
  workdir: str  # Where the job's files are now.
  written: str  # Where the job wrote them (gone: moved to `workdir`).
  results: Dict  # What the job's run() returned.
  readme: str  # The README copy whose blocks the job rewrote (beside the workdir, not in it).


def _readme_with_blocks(path, *blocks) -> str:
  markers = [line for block in blocks for line in reporting.markers(block)]
  with open(path, "w") as f:
    f.write("# x\n" + "\n".join(markers) + "\ntail\n")
  return os.fspath(path)


def _written_then_moved(base, config, run: Callable[..., Dict]) -> MovedRun:
  written, moved = os.path.join(base, "written"), os.path.join(base, "moved")
  results = run(config, written)
  shutil.move(written, moved)
  return MovedRun(workdir=moved, written=written, results=results, readme=config.readme)


def tiny_demo(base) -> MovedRun:
  """configs/demo.py:tiny, run seed TINY_DEMO_SEED, with README's results and seeds blocks."""
  from metonymy import config_lib
  from metonymy import demo
  from metonymy.demo import readme
  config = config_lib.load_sibling_config(DEMO_CONFIG, "demo", "tiny")
  config.readme = _readme_with_blocks(os.path.join(base, "README_copy.md"), readme.RESULTS_BLOCK,
                                      readme.SEEDS_BLOCK)
  config.seed = TINY_DEMO_SEED
  return _written_then_moved(base, config, demo.run)


def small_table3(base, tiny_demo_run: MovedRun) -> MovedRun:
  """configs/synthetic_table3.py:small, with README's Table-3 block, started from the tiny
  demo's stand-in: the same recipe (the demo's world and backbone_pretraining), so the job reuses
  it as it reuses DIR/backbone on a rerun, and the stand-in is pretrained once per pytest
  command. (The demo's tests read that pretraining's record and files.)"""
  from metonymy import config_lib
  from metonymy import table3
  from metonymy.training import pretraining as pretrain
  from metonymy.runs import stand_in
  from metonymy.table3 import report
  config = config_lib.load_config(TABLE3_CONFIG, "small")
  config.readme = _readme_with_blocks(os.path.join(base, "README_copy.md"), report.README_BLOCK)
  backbone = os.path.join(tiny_demo_run.workdir, stand_in.BACKBONE_DIR)
  # The check stand_in.pretrained_backbone makes of a shipped stand-in: the recorded recipe.
  recorded = pretrain.read_stand_in_record(os.path.join(backbone, stand_in.STAND_IN_FILE))
  assert recorded.get("recipe") == stand_in.stand_in_recipe(config, config.world), (
      "configs/synthetic_table3.py:small no longer has the tiny demo's stand-in recipe")
  shutil.copytree(backbone, os.path.join(base, "written", stand_in.BACKBONE_DIR))
  return _written_then_moved(base, config, table3.run)


def synthetic_single(base) -> Run:
  """An uninterrupted `python -m metonymy.main --config=configs/synthetic_single.py:runlocal`
  of SYNTHETIC_SINGLE_STEPS steps, checkpointed at the end only: what the runs killed and
  preempted at other moments, and checkpointed at other steps, must end at bit for bit
  (tests/test_faults.py, tests/test_preemption.py)."""
  workdir = os.path.join(base, "reference")
  proc = subprocess.run(
      [sys.executable, "-m", "metonymy.main", "--config=configs/synthetic_single.py:runlocal",
       f"--workdir={workdir}", f"--config.trainer.num_steps={SYNTHETIC_SINGLE_STEPS}",
       "--config.trainer.checkpoint_every_steps=1000", "--config.trainer.eval_every_steps=1000",
       "--config.trainer.keep_checkpoints=100"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  return Run(workdir, output=proc.stdout)


def train_reference(base) -> TrainedRun:
  """tests/test_train.py's config trained for its STEPS steps, uninterrupted, in this process
  (checkpoints every 10 steps): what its killed, resumed and 8-device runs must reproduce."""
  from metonymy.training import trainer
  from tests import test_train
  workdir = os.path.join(base, "run")
  config = test_train._config()  # pylint: disable=protected-access
  return TrainedRun(workdir, trainer.run(config, workdir))


def trained_four_steps(base) -> Run:
  """tests/test_faults.py's synthetic_single.py:runlocal config trained for 4 steps in this
  process (checkpoints at steps 2 and 4): a finished run to break, resume or export from."""
  from metonymy.training import trainer
  from tests import test_faults
  workdir = os.path.join(base, "run")
  trainer.run(test_faults._config(4), workdir)  # pylint: disable=protected-access
  return Run(workdir)


def two_stage_one_device(base) -> Run:
  """tests/test_two_stage.py's soft, hard and STE configs trained on one device in this process,
  in `<workdir>/<mask>`: the 8-device runs must match them, and one is a two-stage workdir to
  read a backbone from."""
  from metonymy.training import trainer
  from tests import test_two_stage
  for mask in ("soft", "hard", "ste"):
    config = test_two_stage._config(mask)  # pylint: disable=protected-access
    trainer.run(config, os.path.join(base, mask))
  return Run(base)


def file_states(workdir) -> Dict[str, tuple]:
  """{path under `workdir`: (size, modification time)} of every file."""
  states = {}
  for folder, _, files in os.walk(workdir):
    for name in files:
      stat = os.stat(os.path.join(folder, name))
      states[os.path.relpath(os.path.join(folder, name), workdir)] = (stat.st_size,
                                                                      stat.st_mtime_ns)
  return states
