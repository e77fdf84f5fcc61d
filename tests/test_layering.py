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
