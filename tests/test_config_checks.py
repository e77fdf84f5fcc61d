"""Sizes, counts and rates are checked when a config is loaded, naming the key. (Every shipped
config passing the checks: tests/test_configs.py.)"""

import os
import subprocess
import sys

import pytest

from metonymy import config_checks
from metonymy import config_lib
from tests.helpers import compile_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_out_of_range_values_are_named_by_key():
  config = config_lib.load_config(os.path.join(ROOT, "configs", "synthetic_single.py"), "runlocal")
  config.data.batch_size = 0
  config.trainer.checkpoint_every_steps = -1
  config.optimizer.learning_rates.heads = float("nan")
  config.model.num_parts = 0
  with pytest.raises(ValueError) as raised:
    config_checks.check(config)
  message = str(raised.value)
  for expected in ("config.data.batch_size=0 must be >= 1",
                   "config.trainer.checkpoint_every_steps=-1 must be >= 0",
                   "config.optimizer.learning_rates.heads=nan must be a finite number",
                   "config.model.num_parts=0 must be >= 1"):
    assert expected in message, message
  config.data.batch_size, config.trainer.checkpoint_every_steps = 4, 0
  config.optimizer.learning_rates.heads, config.model.num_parts = 1e40, 5  # Huge, but allowed.
  config_checks.check(config)


def test_main_refuses_a_zero_batch_size_before_writing(tmp_path):
  workdir = tmp_path / "run"
  env = dict(os.environ, **compile_cache.ENV)
  proc = subprocess.run(
      [sys.executable, "-m", "metonymy.main", "--config=configs/synthetic_single.py:runlocal",
       f"--workdir={workdir}", "--config.data.batch_size=0"], cwd=ROOT, env=env,
      capture_output=True, text=True, timeout=120)
  assert proc.returncode != 0
  assert "config.data.batch_size=0 must be >= 1" in proc.stderr, proc.stderr[-3000:]
  assert "ZeroDivisionError" not in proc.stderr and "Traceback" not in proc.stderr
  assert not workdir.exists()
