"""Test setup. Nothing here may touch a JAX backend before the test modules configure it."""

import os
import pickle
import sys

import filelock
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

# Parity tests compare float32 against PyTorch: on GPUs JAX would otherwise use TF32 matmuls.
import jax  # noqa: E402

from tests.helpers import compile_cache  # noqa: E402
from tests.helpers import shared_runs  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
# The persistent compilation cache in this process and in every process a test starts (the
# many `python -m metonymy.main` runs compile the same programs again): a hit is the same
# executable, so no result changes.
compile_cache.enable()
os.environ.update(compile_cache.ENV)
# Before any backend starts (JAX reads XLA_FLAGS then); the caller's own flags are kept.
os.environ["XLA_FLAGS"] = " ".join(filter(None, [os.environ.get("XLA_FLAGS"),
                                                 compile_cache.XLA_FLAGS]))


# ------------------------------------------------------------------------------------------------
# Shared runs (tests/helpers/shared_runs.py): made once per pytest command. Under `-n 2` each xdist
# worker has its own session, so the first worker to need a run makes it, under a file lock in
# the folder the workers share, and the other reads it from there.


def _shared_folder(tmp_path_factory):
  base = tmp_path_factory.getbasetemp()
  # An xdist worker's basetemp is a folder of this command's own: its parent is shared by the
  # workers, and by nothing else.
  return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _shared(make, needs=()):
  """A session fixture of `make(folder, *runs)`, checked at the end to be unchanged by its
  readers; `runs` are the shared runs named in `needs` (read, never changed)."""
  def fixture(tmp_path_factory, request):
    folder = _shared_folder(tmp_path_factory) / "shared_runs" / make.__name__
    record = folder.with_suffix(".pickle")
    with filelock.FileLock(f"{folder}.lock"):
      if record.exists():
        run = pickle.loads(record.read_bytes())
      else:
        runs = [request.getfixturevalue(name) for name in needs]
        folder.mkdir(parents=True)
        run = make(os.fspath(folder), *runs)
        record.write_bytes(pickle.dumps(run))
    before = shared_runs.file_states(run.workdir)
    yield run
    assert shared_runs.file_states(run.workdir) == before, (
        f"a test changed the shared {make.__name__} run in {run.workdir}: copy it first")
  fixture.__doc__ = make.__doc__
  return pytest.fixture(scope="session", name=f"{make.__name__}_run")(fixture)


tiny_demo_run = _shared(shared_runs.tiny_demo)
# The Table-3 job starts from the tiny demo's stand-in (the same recipe): pretrained once.
small_table3_run = _shared(shared_runs.small_table3, needs=("tiny_demo_run",))
synthetic_single_run = _shared(shared_runs.synthetic_single)
train_reference_run = _shared(shared_runs.train_reference)
trained_four_steps_run = _shared(shared_runs.trained_four_steps)
two_stage_one_device_run = _shared(shared_runs.two_stage_one_device)
SHARED_RUNS = ("tiny_demo_run", "small_table3_run", "synthetic_single_run", "train_reference_run",
               "trained_four_steps_run", "two_stage_one_device_run")
# Shared runs made from another one: their first reader comes right after the other first
# readers, so that the worker that starts it most likely finds the other run made (rather than
# waiting on its lock) and still starts it before the slow tests.
MADE_FROM_ANOTHER = ("small_table3_run",)


# ------------------------------------------------------------------------------------------------
# The order on xdist workers. Under `--dist loadgroup` (pyproject's addopts) a worker holding two
# tests or fewer is handed the next one in this order, so the workers end together when the last
# tests are short: the slow tests come first. The first reader of each shared run comes before
# them (one worker makes it while the other starts on the slow tests), its other readers after
# them (made by then: no worker waits on another's lock). Shared runs are not kept on one worker
# with xdist_group marks: xdist 3.8 ignores those under pytest 9.2 (pytest-xdist issue 1386).


def _order(item, first_readers):
  if item in first_readers:
    return 0.5 if any(name in item.fixturenames for name in MADE_FROM_ANOTHER) else 0
  if item.get_closest_marker("slow") is None:
    return 3
  return 2 if any(name in item.fixturenames for name in SHARED_RUNS) else 1


def pytest_collection_modifyitems(config, items):
  if not os.environ.get("PYTEST_XDIST_WORKER"):
    return
  first_readers = set()
  for name in SHARED_RUNS:
    first_readers.update([item for item in items if name in item.fixturenames][:1])
  items.sort(key=lambda item: _order(item, first_readers))  # Stable: the same on every worker.
