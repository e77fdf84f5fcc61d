"""Every file in configs/ loads with each argument it documents, the `arg` convention
(`config_lib.parse_arg`) holds, the two-stage configs differ from their single-stage
sibling in `model` only, no config loads a config that loads another, and the two-stage
variants' names and defaults come from one table (models/stage2_options.py)."""

import glob
import importlib.util
import os
import re

import pytest

from metonymy import config_checks
from metonymy import config_lib
from metonymy import launcher
from metonymy.models import stage2_options
from metonymy.models import two_stage as two_stage_model
from metonymy.table3 import variants

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINING = ("celeba", "chexpert", "cub", "folder", "synthetic")
TWO_STAGE = {dataset: ("soft", "hard", "ste") for dataset in TRAINING}
TWO_STAGE["folder"] = ("ste",)

# configs/<name>.py -> the arguments its docstring documents ("" = none).
DOCUMENTED = {
    **{f"{d}_single": ("", "runlocal") for d in TRAINING},
    **{f"{d}_{mask}": ("", "runlocal") for d, masks in TWO_STAGE.items() for mask in masks},
    "backbone_smoke": ("", "preset=vit_b16"),
    "demo": ("", "tiny", "stand_in", "stand_in_objective=attributes_then_dense"),
    "demo_correlation_sweep": ("", "small"),
    "probe_celeba": ("", "preset=vit_b16_dinov3", "runlocal"),
    "probe_chexpert": ("", "preset=vit_b16_dinov3", "runlocal"),
    "probe_cub": ("", "preset=vit_b16_dinov3", "runlocal"),
    "probe_folder": ("", "tiny", "preset=vit_b14_reg4"),
    "probe_suite": ("", "dataset=cub", "dataset=celeba", "dataset=chexpert",
                    "dataset=synthetic"),
    "probe_synthetic": ("", "trained", "tiny", "tiny,trained"),
    "synthetic_table3": ("", "small", "paper_stage2_rate", "priors=paper", "priors=off",
                         "split=val", "demo_length", "split=val,demo_length,priors=paper",
                         "priors=paper,total_variation=1"),
    "world_check": ("", "tiny", "world=v2"),
}
PAIRS = [(name, arg) for name, args in DOCUMENTED.items() for arg in args]


def load(name, arg=""):
  return config_lib.load_config(os.path.join(ROOT, "configs", f"{name}.py"), arg)


def test_every_config_file_is_listed():
  files = {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "configs", "*.py"))}
  assert files == set(DOCUMENTED)


@pytest.mark.parametrize("name,arg", PAIRS)
def test_config_loads_with_each_documented_arg(name, arg):
  config = load(name, arg)
  assert config.job in launcher.JOBS
  assert config_checks.problems(config) == []


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_no_arg_is_the_empty_arg(name):
  # config_flags calls get_config() when --config has no `:arg`, load_config get_config("").
  path = os.path.join(ROOT, "configs", f"{name}.py")
  spec = importlib.util.spec_from_file_location(f"noarg_{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  assert module.get_config().to_dict() == load(name).to_dict()


def test_commands_in_the_docs_load():
  """Every `configs/<name>.py:<arg>` written in README, docs/, launch/, colabs/, configs/ and
  the package's docstrings names an argument the file accepts."""
  files = [os.path.join(ROOT, "README.md")]
  for pattern in ("docs/*.md", "launch/*", "colabs/*.ipynb", "configs/*.py", "metonymy/**/*.py"):
    files += glob.glob(os.path.join(ROOT, pattern), recursive=True)
  found = set()
  for path in files:
    with open(path, encoding="utf-8") as f:
      found |= set(re.findall(r"configs/(\w+)\.py:([\w=.,-]*\w)", f.read()))
  assert len(found) >= 6, found
  for name, arg in sorted(found):
    load(name, arg)


@pytest.mark.parametrize("dataset", TRAINING)
@pytest.mark.parametrize("arg", ["", "runlocal"])
def test_two_stage_configs_differ_from_single_stage_in_model_only(dataset, arg):
  single = load(f"{dataset}_single", arg)
  for mask in TWO_STAGE[dataset]:
    two_stage = load(f"{dataset}_{mask}", arg)
    assert two_stage.to_dict() == config_lib.two_stage(single, mask).to_dict(), mask
    assert two_stage.model.stage2.mask == mask


def test_parse_arg():
  parsed = config_lib.parse_arg("runlocal, preset=vit_b16,steps=3,rate=0.5,shipped=false",
                                runlocal=False, preset="vit_tiny_test", steps=0, rate=1.0,
                                shipped=True, tiny=False)
  assert parsed.to_dict() == {"runlocal": True, "preset": "vit_b16", "steps": 3, "rate": 0.5,
                              "shipped": False, "tiny": False}
  assert config_lib.parse_arg("", runlocal=False).runlocal is False
  with pytest.raises(ValueError, match=r"Unknown config argument 'cub'.*\['dataset'\]"):
    config_lib.parse_arg("cub", dataset="cub")
  with pytest.raises(ValueError, match="needs a value"):
    config_lib.parse_arg("preset", preset="vit_b16")
  with pytest.raises(ValueError, match="expected true or false"):
    config_lib.parse_arg("runlocal=yes please", runlocal=False)


def test_a_config_refuses_an_unknown_arg():
  with pytest.raises(ValueError, match="Unknown config argument 'runlcoal'"):
    load("celeba_ste", "runlcoal")
  with pytest.raises(ValueError, match="unknown dataset 'imagenet'"):
    load("probe_suite", "dataset=imagenet")


@pytest.mark.parametrize("name,arg", PAIRS)
def test_no_config_loads_a_config_that_loads_another(name, arg, monkeypatch):
  """Shared pieces come from config_lib: a config may build on one other file (the demo's world,
  a probe config), never on a chain of them, so each value has one home a reader finds."""
  load_config, depth, deepest = config_lib.load_config, [0], []

  def counting(path, arg=""):
    depth[0] += 1
    deepest.append((depth[0], os.path.basename(path)))
    try:
      return load_config(path, arg)
    finally:
      depth[0] -= 1

  monkeypatch.setattr(config_lib, "load_config", counting)
  config_lib.load_config(os.path.join(ROOT, "configs", f"{name}.py"), arg)
  assert max(d for d, _ in deepest) <= 2, f"configs/{name}.py:{arg} loads a chain: {deepest}"


def test_two_stage_variants_come_from_the_one_table():
  """The mask names and the Stage-2 defaults live in models/stage2_options.py: the two-stage
  config files, config_lib, Table 3's variants and the Stage2 module all read them."""
  assert variants.TWO_STAGE is stage2_options.VARIANTS
  assert set(stage2_options.MASKS) <= set(stage2_options.VARIANTS)
  assert {v["mask"] for v in stage2_options.VARIANTS.values()} == set(stage2_options.MASKS)
  fields = two_stage_model.Stage2.__dataclass_fields__
  assert {k: fields[k].default for k in stage2_options.DEFAULTS} == stage2_options.DEFAULTS
  single = load("synthetic_single", "runlocal")
  for name, options in stage2_options.VARIANTS.items():
    model = config_lib.two_stage(single, name).model
    assert model.stage2.to_dict() == dict(stage2_options.DEFAULTS, **options), name
  for dataset, masks in TWO_STAGE.items():
    assert set(masks) <= set(stage2_options.MASKS)
    for mask in masks:
      assert load(f"{dataset}_{mask}").model.stage2.to_dict() == dict(
          stage2_options.DEFAULTS, **stage2_options.VARIANTS[mask]), (dataset, mask)
  with pytest.raises(ValueError, match=r"Unknown two-stage variant 'late'.*'hard_none'"):
    config_lib.two_stage(single, "late")
