"""Every config's refusals that need no data, through main's own entry point (issue 47): an
unknown key, a bad `:arg`, a missing --workdir, a missing data root or backbone checkpoint. Each
is one `error:` line on stderr, the exit status of its kind (2 for a usage error main catches
before anything runs, 1 for a launcher refusal: NotStarted through `sys.exit("error: ...")`),
and the workdir absent afterwards: a refusal comes before anything is written
(docs/configs.md).

In process, not a subprocess per config: main.run() with sys.argv set, absl's flags of the
previous call's `--config.*` overrides removed after each call (absl refuses to define one
twice) and main's flags reset to their defaults (absl keeps the last value parsed). The jobs themselves are stubbed: a refusal that does not come lets the launcher claim the
workdir and then fails loudly, instead of running a job for minutes.
"""

import os
import sys
import types

import pytest
from absl import flags

from metonymy import config_lib
from metonymy import launcher
from metonymy import main as main_lib
from metonymy import preflight

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(f for f in os.listdir(os.path.join(ROOT, "configs")) if f.endswith(".py"))


class JobStarted(AssertionError):
  pass


def _stub_jobs(monkeypatch):
  """launcher.launch imports the job after the checks, the preflight and the claim: here that
  import gives a job whose run() fails, so a missing refusal cannot run anything."""
  def run(config, workdir):
    raise JobStarted(f"the {config.job!r} job started in {workdir}: nothing refused the run")
  stub = types.SimpleNamespace(import_module=lambda name: types.SimpleNamespace(run=run))
  monkeypatch.setattr(launcher, "importlib", stub)


def _main(capsys, monkeypatch, *args):
  """(exit status, stderr) of `python -m metonymy.main ARGS`, run in this process."""
  monkeypatch.chdir(ROOT)
  monkeypatch.setattr(sys, "argv", ["metonymy.main", *args])
  capsys.readouterr()
  try:
    status = main_lib.run()
  except SystemExit as e:  # As the interpreter does: a string is printed, status 1.
    status = e.code
    if isinstance(status, str):
      print(status, file=sys.stderr)
      status = 1
  finally:
    for name in list(flags.FLAGS):
      if name.startswith("config."):
        delattr(flags.FLAGS, name)
    for name in ("config", "workdir", "print_config"):  # absl keeps the last value given
      flags.FLAGS[name].unparse()
  return (0 if status is None else status), capsys.readouterr().err


def _refusals(name: str, tmp_path):
  """[(what, args, exit status, text the error line holds)] for configs/<name>: each reachable
  without data."""
  config = config_lib.load_config(os.path.join(ROOT, "configs", name), "")
  workdir = f"--workdir={tmp_path / 'W'}"
  spec = f"--config=configs/{name}"
  found = [
      ("unknown key", (spec, "--config.nonexistent_key=1", workdir), 2,
       "Unknown config key 'nonexistent_key'"),
      ("bad :arg", (f"{spec}:no_such_arg", workdir), 2, "no_such_arg"),
  ]
  if config.job not in launcher.DEFAULT_WORKDIRS:
    found.append(("no --workdir", (spec,), 1, "--workdir=DIR is required"))
  data = config.get("data")
  if data is not None and "root" in data and data.get("dataset") != "synthetic":
    # The data root alone missing: the other inputs the config names are given, and exist.
    given = []
    if "backbone" in config and "checkpoint" in config.backbone:
      backbone = tmp_path / "inputs" / "backbone"
      backbone.mkdir(parents=True, exist_ok=True)
      given.append(f"--config.backbone.checkpoint={backbone}")
    if config.get("masks") is not None and config.masks.get("source") == "file":
      for split in preflight._splits(data):
        (tmp_path / "inputs" / f"masks_{split}.npz").parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "inputs" / f"masks_{split}.npz").touch()
      given.append(f"--config.masks.path={tmp_path / 'inputs' / 'masks_{split}.npz'}")
    found.append(("missing data root", (spec, f"--config.data.root={tmp_path / 'no_data'}",
                                        *given, workdir), 1, "config.data.root="))
  elif data is not None and "backbone" in config and "checkpoint" in config.backbone:
    # The synthetic world needs no files; the backbone a training config names does.
    found.append(("missing checkpoint", (
        spec, f"--config.backbone.checkpoint={tmp_path / 'no_backbone'}", workdir), 1,
        "config.backbone.checkpoint="))
  return found


def test_every_config_has_a_refusal_reachable_without_data(tmp_path):
  for name in CONFIGS:
    kinds = [what for what, *_ in _refusals(name, tmp_path)]
    assert kinds[:2] == ["unknown key", "bad :arg"], name
  # Every launcher refusal below is tried on some config.
  kinds = {what for name in CONFIGS for what, *_ in _refusals(name, tmp_path)}
  assert {"no --workdir", "missing data root", "missing checkpoint"} <= kinds


@pytest.mark.parametrize("name", CONFIGS, ids=lambda n: n[:-3])
def test_each_refusal_is_one_error_line_and_leaves_no_workdir(name, tmp_path, capsys,
                                                              monkeypatch):
  _stub_jobs(monkeypatch)
  for what, args, status, says in _refusals(name, tmp_path):
    code, err = _main(capsys, monkeypatch, *args)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == status, (name, what, code, err[-2000:])
    assert len(errors) == 1 and says in errors[0], (name, what, err[-2000:])
    assert "Traceback" not in err, (name, what, err[-2000:])
    workdir = tmp_path / "W"
    assert not workdir.exists() or not any(workdir.iterdir()), (
        name, what, sorted(os.listdir(workdir)))
