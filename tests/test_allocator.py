"""The host allocator (metonymy/allocator.py): when a command re-executes itself on jemalloc, with
what environment, and that the allocator changes the time of a training step, never its numbers
(`python -m metonymy.bench allocator`)."""

import os
import subprocess
import sys

import pytest

from metonymy import allocator
from metonymy.bench import allocator as allocator_bench

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def library(tmp_path):
  path = tmp_path / "libjemalloc.so.2"
  path.write_bytes(b"")
  return str(path)


def test_reexecutes_on_jemalloc_with_the_command_and_an_environment_that_keeps_its_pages(library):
  argv, env = allocator.reexec_command(["--config=configs/demo.py", "--workdir=W"],
                                       {"PATH": "/bin", "LD_PRELOAD": "libfoo.so"},
                                       "metonymy.main", "linux", paths=[library])
  assert argv == [sys.executable, "-m", "metonymy.main", "--config=configs/demo.py",
                  "--workdir=W"]
  assert env["LD_PRELOAD"].split() == [library, "libfoo.so"]  # what was preloaded stays
  assert env["MALLOC_CONF"] == allocator.MALLOC_CONF and env["PATH"] == "/bin"
  # The re-executed process does not re-execute again.
  assert env[allocator.SWITCH] == "jemalloc"
  assert allocator.reexec_command([], env, "metonymy.main", "linux", paths=[library]) is None
  # A MALLOC_CONF of the user's own is kept.
  _, env = allocator.reexec_command([], {"MALLOC_CONF": "narenas:2"}, "m", "linux",
                                    paths=[library])
  assert env["MALLOC_CONF"] == "narenas:2"


@pytest.mark.parametrize("env,platform,found", [
    ({allocator.SWITCH: "system"}, "linux", True),   # the user's choice
    ({"LD_PRELOAD": "/usr/lib/libtcmalloc_minimal.so.4"}, "linux", True),  # one already chosen
    ({}, "darwin", True),                            # LD_PRELOAD is Linux's
    ({}, "linux", False),                            # not installed
])
def test_goes_on_as_it_is_where_it_should(library, env, platform, found):
  paths = [library] if found else [library + ".missing"]
  assert allocator.reexec_command(["a"], env, "metonymy.main", platform, paths=paths) is None


def test_the_conda_environment_library_comes_first(tmp_path, library):
  conda = tmp_path / "env"
  (conda / "lib").mkdir(parents=True)
  (conda / "lib" / "libjemalloc.so.2").write_bytes(b"")
  assert allocator.find_jemalloc({"CONDA_PREFIX": str(conda)}, [library]) == str(
      conda / "lib" / "libjemalloc.so.2")
  assert allocator.find_jemalloc({}, [library]) == library
  assert allocator.find_jemalloc({}, []) == ""


def _clean_env(**extra):
  env = {k: v for k, v in os.environ.items()
         if k not in ("LD_PRELOAD", "MALLOC_CONF", allocator.SWITCH)}
  return dict(env, **extra)


def test_a_command_runs_on_jemalloc_where_it_is_installed_and_on_malloc_when_told():
  """`python -m metonymy.allocator` goes through the same re-execution as `metonymy.main` and
  prints what its own memory map holds."""
  installed = allocator.find_jemalloc(os.environ)
  seen = subprocess.run([sys.executable, "-m", "metonymy.allocator"], cwd=ROOT, env=_clean_env(),
                        capture_output=True, text=True, check=True).stdout
  assert seen.startswith("jemalloc (MALLOC_CONF=dirty_decay_ms:-1") == bool(installed), seen
  told = subprocess.run([sys.executable, "-m", "metonymy.allocator"], cwd=ROOT,
                        env=_clean_env(**{allocator.SWITCH: "system"}), capture_output=True,
                        text=True, check=True).stdout
  assert told.strip() == "the system's malloc"


@pytest.mark.slow
@pytest.mark.skipif(not allocator.find_jemalloc(os.environ), reason="jemalloc not installed")
def test_the_allocator_bench_gives_the_same_weights_on_both():
  results = allocator_bench.run(steps=3, batch_size=2, image_size=16)
  assert results["jemalloc"]["checksum"] == results["system"]["checksum"]
  assert "final weights identical" in allocator_bench.format_result(results)
