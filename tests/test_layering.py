"""The package's import graph: no cycle inside metonymy/, models/ imports only models/, and a
config loads without JAX (imports inside functions count: they are arrows too)."""

import ast
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "metonymy")


def _modules(package_dir=PACKAGE):
  """{dotted module name: file path} of every .py file under `package_dir`."""
  modules = {}
  for folder, _, files in os.walk(package_dir):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        dotted = os.path.relpath(path, os.path.dirname(package_dir))[:-3].replace(os.sep, ".")
        modules[dotted[:-len(".__init__")] if dotted.endswith(".__init__") else dotted] = path
  return modules


def import_graph(package_dir=PACKAGE):
  """{module: set of package modules it imports}, at any depth of the file (functions too)."""
  modules = _modules(package_dir)
  graph = {}
  for module, path in modules.items():
    with open(path) as f:
      tree = ast.parse(f.read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    targets = set()
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          parts = package.split(".")
          base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
        # `from a import b` imports module a.b when it is one, else a (b is an attribute).
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                 for a in node.names]
      else:
        continue
      targets.update(n for n in names if n in modules and n != module)
    graph[module] = targets
  return graph


def find_cycle(graph):
  """One import cycle as a list of modules (first == last), or None."""
  state, stack = {}, []

  def visit(node):
    state[node] = "open"
    stack.append(node)
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == "open":
        return stack[stack.index(nxt):] + [nxt]
      if nxt not in state:
        found = visit(nxt)
        if found:
          return found
    stack.pop()
    state[node] = "done"
    return None

  for node in sorted(graph):
    if node not in state:
      found = visit(node)
      if found:
        return found
  return None


def test_the_package_has_no_import_cycle():
  cycle = find_cycle(import_graph())
  assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_models_import_only_models():
  outside = {m: sorted(t for t in targets if not t.startswith("metonymy.models"))
             for m, targets in import_graph().items() if m.startswith("metonymy.models")}
  assert not {m: t for m, t in outside.items() if t}, outside


# Layers below training/: what a trained model is read back with must not depend on how it was
# trained. The workdir package sits under all of them (it imports nothing of metonymy's).
BELOW_TRAINING = ("metonymy.loading", "metonymy.trained_part_model", "metonymy.models",
                  "metonymy.data", "metonymy.converters", "metonymy.workdir")


def _in(module, prefixes):
  return any(module == p or module.startswith(p + ".") for p in prefixes)


def upward_imports(graph):
  """{module: [training modules it imports]} for the modules of BELOW_TRAINING, plus
  {workdir module: [non-workdir metonymy modules]}."""
  found = {}
  for module, targets in graph.items():
    if _in(module, BELOW_TRAINING):
      up = sorted(t for t in targets if _in(t, ("metonymy.training",)))
      if _in(module, ("metonymy.workdir",)):
        up = sorted(t for t in targets if not _in(t, ("metonymy.workdir",)))
      if up:
        found[module] = up
  return found


def test_nothing_below_training_imports_training():
  assert upward_imports(import_graph()) == {}


def _planted_package(tmp_path, folders, files):
  """tmp_path/metonymy with the sub-packages `folders` and the modules {relative path: text}."""
  package = tmp_path / "metonymy"
  for folder in folders:
    (package / folder).mkdir(parents=True)
    (package / folder / "__init__.py").write_text("")
  (package / "__init__.py").write_text("")
  for path, text in files.items():
    (package / path).write_text(text)
  return package


def test_the_upward_check_sees_a_planted_import(tmp_path):
  package = _planted_package(tmp_path, ("training", "data", "workdir"), {
      "training/run_state.py": "",
      "loading.py": "def f():\n  from metonymy.training import run_state\n",
      "data/x.py": "import metonymy.training.run_state\n",
      "workdir/layout.py": "from metonymy import loading\n"})
  assert upward_imports(import_graph(str(package))) == {
      "metonymy.data.x": ["metonymy.training.run_state"],
      "metonymy.loading": ["metonymy.training.run_state"],
      "metonymy.workdir.layout": ["metonymy.loading"]}


# The leakage benchmark measures; it trains nothing. A backbone it probes is pretrained by the
# floor above (runs/probe.py), and part discovery's training reads no probe module.
TRAINERS = ("metonymy.training.pretraining", "metonymy.training.self_supervised",
            "metonymy.training.trainer")


def crossings(graph):
  """{module: [imports]} of probe/ modules importing a trainer, and training/ modules importing
  probe/."""
  found = {}
  for module, targets in graph.items():
    if _in(module, ("metonymy.probe",)):
      bad = sorted(t for t in targets if _in(t, TRAINERS))
    elif _in(module, ("metonymy.training",)):
      bad = sorted(t for t in targets if _in(t, ("metonymy.probe",)))
    else:
      continue
    if bad:
      found[module] = bad
  return found


def test_probe_imports_no_trainer_and_training_no_probe():
  assert crossings(import_graph()) == {}


def test_the_crossing_check_sees_a_planted_import(tmp_path):
  package = _planted_package(tmp_path, ("training", "probe"), {
      "probe/masks.py": "", "training/pretraining.py": "",
      "training/evaluate.py": "from metonymy.probe import masks\n",
      "probe/job.py": "def f():\n  from metonymy.training import pretraining\n"})
  assert crossings(import_graph(str(package))) == {
      "metonymy.probe.job": ["metonymy.training.pretraining"],
      "metonymy.training.evaluate": ["metonymy.probe.masks"]}


def test_the_checks_see_a_planted_cycle_and_a_function_level_import(tmp_path):
  # The check must find arrows hidden in functions, or it passes on the cycle it exists for.
  package = tmp_path / "pkg"
  (package / "models").mkdir(parents=True)
  (package / "__init__.py").write_text("")
  (package / "models" / "__init__.py").write_text("")
  (package / "models" / "a.py").write_text("def f():\n  from pkg import b\n")
  (package / "b.py").write_text("from pkg.models import a\n")
  graph = import_graph(str(package))
  assert graph["pkg.models.a"] == {"pkg.b"}
  assert find_cycle(graph) in (["pkg.b", "pkg.models.a", "pkg.b"],
                               ["pkg.models.a", "pkg.b", "pkg.models.a"])


# The floors of docs/configs.md ("Layout"): read from its ```floors block, so the picture a
# newcomer reads is the one the test holds the code to.
DOCS = os.path.join(ROOT, "docs", "configs.md")


def floors(path=DOCS):
  """{top-level name under metonymy/ (module or package): floor number}, from the doc's block."""
  with open(path) as f:
    text = f.read()
  block = text.split("```floors\n", 1)[1].split("```", 1)[0]
  table = {}
  for line in block.strip().splitlines():
    number, names = line.split(None, 1)
    table.update({name.strip(): int(number) for name in names.split(",")})
  return table


def floor_of(module, table):
  """The floor of a dotted module name; option tables (`*_options`) are floor 0; None: unplaced."""
  if module.rsplit(".", 1)[-1].endswith("_options"):
    return 0
  top = module.split(".")[1] if "." in module else module
  return table.get(top)


def climbing_imports(graph, table):
  """{module: [imports on a higher floor, or "unplaced"]}."""
  found = {}
  for module, targets in graph.items():
    if module == "metonymy":
      continue
    own = floor_of(module, table)
    if own is None:
      found[module] = ["unplaced"]
      continue
    up = sorted(t for t in targets if t != "metonymy" and (floor_of(t, table) or 0) > own)
    if up:
      found[module] = up
  return found


def test_no_import_climbs_a_floor():
  assert climbing_imports(import_graph(), floors()) == {}


def test_an_option_table_imports_nothing_of_the_package():
  tables = {m: sorted(t) for m, t in import_graph().items() if m.endswith("_options") and t}
  assert tables == {}


def test_the_floor_check_sees_a_planted_climb_and_an_unplaced_module(tmp_path):
  package = _planted_package(tmp_path, ("training", "probe", "data", "runs"), {
      "training/evaluate.py": "from metonymy.probe import masks\n",  # same floor: fine here
      "probe/masks.py": "",
      "data/__main__.py": "def f():\n  from metonymy.runs import stand_in\n",
      "runs/stand_in.py": "",
      "extra.py": ""})
  table = {"training": 3, "probe": 3, "data": 1, "runs": 4}
  assert climbing_imports(import_graph(str(package)), table) == {
      "metonymy.data.__main__": ["metonymy.runs.stand_in"], "metonymy.extra": ["unplaced"]}


# Imports sit at the top of a file, where a reader sees what a module depends on. A function may
# import only what is deferred for a reason a test holds: an optional dependency (absent from
# requirements.txt; its module names the package to install), or an import cost a named test
# measures.
DEFERRED_IMPORTS = {
    "torch": None, "timm": None, "tensorflow_datasets": None,  # optional dependencies
    "safetensors.torch": None,  # needs torch
    # (the test that measures it, the module whose import it keeps out of a process)
    "sklearn": ("tests/test_writers.py", "sklearn"),  # imported at the first evaluation
    "tensorboardX": ("tests/test_writers.py", "torch"),  # imported with torch hidden from it
    "clu.periodic_actions": ("tests/test_writers.py", "tensorflow"),  # after a placeholder
}


def function_level_imports(package_dir=PACKAGE):
  """[(file, line, imported module)] of the imports inside functions or classes."""
  found = []
  for path in _modules(package_dir).values():
    with open(path) as f:
      tree = ast.parse(f.read(), path)
    for top in tree.body:
      if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        for node in ast.walk(top):
          if isinstance(node, ast.Import):
            found += [(path, node.lineno, alias.name) for alias in node.names]
          elif isinstance(node, ast.ImportFrom):
            found += [(path, node.lineno, f"{node.module}.{alias.name}" if node.level == 0
                       and node.module in ("clu", "safetensors") else node.module or "")
                      for alias in node.names]
  return found


def _allowed(module):
  return any(module == name or module.startswith(name + ".") for name in DEFERRED_IMPORTS)


def test_imports_sit_at_the_top_unless_a_test_holds_the_reason():
  stray = [f"{os.path.relpath(path, ROOT)}:{line} imports {module}"
           for path, line, module in function_level_imports() if not _allowed(module)]
  assert not stray, stray


def test_each_deferred_import_has_its_reason():
  with open(os.path.join(ROOT, "requirements.txt")) as f:
    required = f.read()
  for module, reason in DEFERRED_IMPORTS.items():
    if reason is None:  # optional: not a requirement of the package
      assert module.rsplit(".", 1)[-1] not in required, module
    else:
      test_file, kept_out = reason
      with open(os.path.join(ROOT, test_file)) as f:
        assert f"'{kept_out}' not in sys.modules" in f.read(), (module, reason)


def test_the_import_check_sees_a_planted_function_level_import(tmp_path):
  package = _planted_package(tmp_path, ("training",), {
      "training/x.py": "import numpy\n\ndef f():\n  from metonymy.training import y\n"
                       "  from sklearn import cluster\n",
      "training/y.py": ""})
  found = [(os.path.basename(p), line, m) for p, line, m in
           function_level_imports(str(package))]
  assert found == [("x.py", 4, "metonymy.training"), ("x.py", 5, "sklearn")]
  assert [m for _, _, m in found if not _allowed(m)] == ["metonymy.training"]


def test_a_config_loads_without_jax_or_flax():
  code = ("import sys\n"
          "from metonymy import config_lib\n"
          "config = config_lib.load_sibling_config('configs/x.py', 'celeba_ste')\n"
          "heavy = sorted(m for m in ('jax', 'flax', 'orbax', 'torch') if m in sys.modules)\n"
          "assert not heavy, heavy\n")
  subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


def test_importing_the_package_leaves_matplotlibs_backend_alone():
  # A notebook (colabs/) shows figures inline: a library that switches the backend to Agg on
  # import silently hides every figure after it.
  code = ("import matplotlib\n"
          "matplotlib.use('svg')\n"
          "import metonymy.demo, metonymy.probe.plots, metonymy.training.evaluate\n"
          "assert matplotlib.get_backend() == 'svg', matplotlib.get_backend()\n")
  subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=300)
