"""Where a run's files are in its workdir, and the readers and writers of the small ones.

  WORKDIR/config.json          the resolved config of the run (written by the claim)
  WORKDIR/model.json           what rebuilds the trained model without the data (the trainer)
  WORKDIR/metrics.jsonl        one {"step": s, "<name>": value, ...} object per line; on an
                               object store the lines go to WORKDIR/metrics.jsonl.d/<n>.jsonl
                               instead, one new object per upload, read in the order of n
                               (`Workdir.metric_files`)
  WORKDIR/checkpoints/<step>/  Orbax checkpoints (training/run_state.py)
  WORKDIR/refused_checkpoints/ checkpoints refused on restore, kept for inspection
  WORKDIR/backbone/            a random-init frozen backbone, saved once (converted layout)
  WORKDIR/run.lock             the claim of the run that holds the workdir (claim.py)
  WORKDIR/tensorboard/         event files; WORKDIR/images/ the PNGs logged beside them
  WORKDIR/parameters.txt       the parameter tables of the run's start
  WORKDIR/report.md, results.json, *.png   a job's report, its numbers and its figures
  WORKDIR/cache/               the leakage benchmark's feature cache (unless configured)

A run that records a path to files of the same job's tree (a demo or Table-3 sub-run's backbone
in the parent workdir, a Table-3 probe's masks in its sibling train run, the backbone a job's
results.json names) records it relative to the workdir that holds the record, marked as such:
"workdir:../backbone" (`record_path`). A bare relative path would read as relative to the
current directory, as a user's `--config.backbone.checkpoint=ckpt/vit` does. Read back with
`resolve_path` against wherever that workdir is now, so a workdir moved, copied, or staged in a
local folder and copied back to gs:// still loads. Paths to inputs outside the tree (a user's
checkpoint, a data root) are recorded as given (absolute locally). Records written before this
form are absolute paths, which `resolve_path` returns as they are.

Every path is an `etils.epath.Path`, the path type Orbax itself uses, so a workdir may be a local
folder or a `gs://bucket/...` prefix with the same code. Object stores have no rename that is
atomic and no append: `write_text` writes aside and renames where the filesystem is local, and
writes the object in one request where it is not (a GCS object is replaced whole, so a reader
never sees half of it either way).
"""

import contextlib
import json
import os
import posixpath
import tempfile
import uuid
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from etils import epath
import fsspec

PathLike = Union[str, os.PathLike, epath.Path]

CONFIG_FILE = "config.json"
MODEL_FILE = "model.json"
METRICS_FILE = "metrics.jsonl"
METRICS_CHUNKS_DIR = "metrics.jsonl.d"  # An object store's metrics.jsonl, one object per upload.
CHECKPOINT_DIR = "checkpoints"
REFUSED_DIR = "refused_checkpoints"
BACKBONE_DIR = "backbone"
LOCK_FILE = "run.lock"
TENSORBOARD_DIR = "tensorboard"
IMAGES_DIR = "images"
PARAMETERS_FILE = "parameters.txt"
REPORT_FILE = "report.md"
RESULTS_FILE = "results.json"
CACHE_DIR = "cache"
# The mark of a path recorded relative to the workdir holding the record (the module docstring).
IN_WORKDIR = "workdir:"


def is_local(path: PathLike) -> bool:
  """Whether `path` is on a local (POSIX) filesystem, not an object store (gs://, s3://)."""
  return "://" not in os.fspath(path)


def as_path(path: PathLike) -> epath.Path:
  """`path` as an epath.Path; a local path made absolute (Orbax needs absolute local paths)."""
  text = os.fspath(path)
  if text.startswith(IN_WORKDIR):  # Never a path of the current directory: refused, not guessed.
    raise ValueError(f"{text!r} is a path recorded relative to a workdir; read it with "
                     f"layout.resolve_path(recorded, workdir) against the workdir that holds it.")
  return epath.Path(text if not is_local(text) else os.path.abspath(text))


def record_path(path: PathLike, workdir: PathLike, root: PathLike) -> str:
  """How the files of `workdir` record `path` (the module docstring): "workdir:<path relative
  to workdir>" when `path` lies inside `root`, the workdir of the job that wrote both (a demo's,
  a Table-3 job's); any other path as given (absolute locally)."""
  target, holder, tree = (os.fspath(as_path(p)) for p in (path, workdir, root))
  inside = lambda p: p == tree or p.startswith(tree.rstrip("/") + "/")
  if not (inside(target) and inside(holder)):
    return target
  # posixpath on the text after the scheme: a gs:// URL and a local path alike.
  strip = lambda p: "/" + p.split("://", 1)[-1].lstrip("/")
  return IN_WORKDIR + posixpath.relpath(strip(target), strip(holder))


def resolve_path(recorded: PathLike, workdir: PathLike) -> str:
  """The path a record of `workdir` names: a "workdir:..." record joined to where `workdir` is
  now (`record_path`); any other record (a user's input, an old absolute record) as it is."""
  text = os.fspath(recorded)
  if not text.startswith(IN_WORKDIR):
    return text
  path = as_path(workdir)
  for part in text[len(IN_WORKDIR):].split("/"):
    if part == "..":
      path = path.parent
    elif part not in ("", "."):
      path = path / part
  return os.fspath(path)


class Workdir:
  """The files of one run's workdir (see the module docstring); `path` is local or gs://.

  A sub-run's workdir (`sub`: a demo step, a Table-3 run) knows the workdir of the job whose tree
  it is in, `root`: its records of that tree's files are relative (`record`), and the launcher
  runs it under the root's claim (metonymy/launcher.py). `Workdir(handle)` is the same handle.
  """

  def __init__(self, path: Union[PathLike, "Workdir"], root: Optional["Workdir"] = None):
    if isinstance(path, Workdir):
      path, root = path.path, root or path._root
    self.path = as_path(path)
    self._root = root  # None: this workdir is its own tree's root.

  def __repr__(self) -> str:
    return f"Workdir({os.fspath(self.path)!r})"

  def __str__(self) -> str:
    return os.fspath(self.path)

  def __fspath__(self) -> str:
    return os.fspath(self.path)

  @property
  def root(self) -> "Workdir":
    """The workdir of the job whose tree this one is in; itself unless made by `sub`."""
    return self._root or self

  @property
  def is_sub_run(self) -> bool:
    return self._root is not None

  def record(self, path: PathLike) -> str:
    """How this workdir's files record `path`: relative when it is in the tree (`record_path`)."""
    return record_path(path, self.path, self.root.path)

  def resolve(self, recorded: PathLike) -> str:
    """The path a record of this workdir's files names (`resolve_path`)."""
    return resolve_path(recorded, self.path)

  @property
  def is_local(self) -> bool:
    return is_local(self.path)

  # The layout.
  config_file = property(lambda self: self.path / CONFIG_FILE)
  model_file = property(lambda self: self.path / MODEL_FILE)
  metrics_file = property(lambda self: self.path / METRICS_FILE)
  metrics_chunks = property(lambda self: self.path / METRICS_CHUNKS_DIR)
  checkpoints = property(lambda self: self.path / CHECKPOINT_DIR)
  refused_checkpoints = property(lambda self: self.path / REFUSED_DIR)
  backbone = property(lambda self: self.path / BACKBONE_DIR)
  lock_file = property(lambda self: self.path / LOCK_FILE)
  tensorboard = property(lambda self: self.path / TENSORBOARD_DIR)
  images = property(lambda self: self.path / IMAGES_DIR)
  parameters_file = property(lambda self: self.path / PARAMETERS_FILE)
  report_file = property(lambda self: self.path / REPORT_FILE)
  results_file = property(lambda self: self.path / RESULTS_FILE)
  feature_cache = property(lambda self: self.path / CACHE_DIR)

  def output(self, name: str) -> epath.Path:
    """A job's own output file (a figure, a table): WORKDIR/<name>."""
    return self.path / name

  def image(self, name: str, step: int) -> epath.Path:
    """WORKDIR/images/<name>_<step>.png of a logged image (`name` may hold slashes)."""
    return self.images / f"{name.replace('/', '_')}_{int(step):07d}.png"

  def refused_checkpoint(self, step: int) -> epath.Path:
    """WORKDIR/refused_checkpoints/<step>: where a checkpoint refused on restore is kept."""
    return self.refused_checkpoints / str(int(step))

  def sub(self, name: str) -> "Workdir":
    """The workdir of a sub-run (a demo step, a Table-3 run) inside this one, in its tree."""
    return Workdir(self.path / name, root=self.root)

  def make(self) -> "Workdir":
    self.path.mkdir(parents=True, exist_ok=True)
    return self

  # The small files.

  def write_config_json(self, config) -> epath.Path:
    """config.json: a ConfigDict's resolved values (`to_json_best_effort`) or a plain dict."""
    body = (config.to_json_best_effort(indent=2) if hasattr(config, "to_json_best_effort")
            else json.dumps(config, indent=2, default=str))
    return write_text(self.config_file, body)

  def read_config(self) -> Optional[Dict[str, Any]]:
    """config.json as a dict, None when the workdir has none."""
    return read_json(self.config_file) if self.config_file.exists() else None

  def write_model_info(self, info: Dict[str, Any]) -> epath.Path:
    return write_text(self.model_file, json.dumps(info, indent=2))

  def read_model_info(self) -> Dict[str, Any]:
    """model.json; a FileNotFoundError naming it when the workdir is no training workdir."""
    if not self.model_file.exists():
      raise FileNotFoundError(f"{self.model_file} not found: {self.path} is not a part-discovery "
                              f"training workdir (the train job writes model.json).")
    return read_json(self.model_file)

  def is_training_workdir(self) -> bool:
    return self.model_file.exists()

  def metric_files(self) -> List[epath.Path]:
    """The files of the metrics stream in the order they were written: metrics.jsonl (always,
    locally; on an object store, from a run written before the chunks), then the chunks of
    metrics.jsonl.d/ by number. An object store has no append, and rewriting one object whole
    at each upload would upload bytes growing with the square of the run's length."""
    return ([self.metrics_file] if self.metrics_file.exists() else []) + self.metric_chunks()

  def metric_chunks(self) -> List[epath.Path]:
    """metrics.jsonl.d/<n>.jsonl by n (an object store's metrics; none locally)."""
    if not self.metrics_chunks.is_dir():
      return []
    return sorted(self.metrics_chunks.glob("*.jsonl"), key=metrics_chunk_number)

  def metric_lines(self) -> Iterator[Tuple[epath.Path, int, str]]:
    """(file, line number, line) of every line of the metrics stream (`metric_files`)."""
    for path in self.metric_files():
      for number, line in enumerate(path.read_text().splitlines(keepends=True), 1):
        yield path, number, line

  def metric_records(self, prefix: str = "") -> Dict[int, Dict[str, float]]:
    """{step: {name: value}} of the metrics' entries whose names start with `prefix`
    (dropped), in step order; non-finite values (stored as strings) -> NaN."""
    if not self.metric_files():
      raise FileNotFoundError(f"{self.metrics_file} not found: the training run in {self.path} "
                              f"wrote no metrics.")
    out: Dict[int, Dict[str, float]] = {}
    for path, number, line in self.metric_lines():
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except ValueError as e:
        raise ValueError(f"{path}, line {number}: not JSON ({e}).") from None
      values = {k[len(prefix):]: _float(v) for k, v in record.items()
                if k.startswith(prefix) and k != "step"}
      if values:
        out.setdefault(int(record["step"]), {}).update(values)
    return dict(sorted(out.items()))


def metrics_chunk_number(path: PathLike) -> int:
  """n of a metrics chunk metrics.jsonl.d/<n>.jsonl; a ValueError naming any other file."""
  name = epath.Path(os.fspath(path)).name
  stem = name[:-len(".jsonl")] if name.endswith(".jsonl") else ""
  if not stem.isdigit():
    raise ValueError(f"{path}: not a metrics chunk (<number>.jsonl) in {METRICS_CHUNKS_DIR}/.")
  return int(stem)


def metrics_chunk(directory: PathLike, number: int) -> epath.Path:
  """metrics.jsonl.d/<n>.jsonl, zero-padded so a listing also reads in order."""
  return as_path(directory) / f"{int(number):06d}.jsonl"


def _float(value) -> float:
  try:
    return float(value)
  except (TypeError, ValueError):
    return float("nan")


def write_text(path: PathLike, text: str) -> epath.Path:
  """Replaces the file at `path` with `text` so that no reader or kill sees half of it: written
  aside and renamed locally, one object upload on an object store. Returns the path."""
  path = as_path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  if not is_local(path):
    path.write_text(text)
    return path
  # A name of its own: two writers of one file (processes sharing a cache) never share it.
  aside = path.parent / f"{path.name}.{uuid.uuid4().hex[:8]}.tmp"
  aside.write_text(text)
  os.replace(aside, path)
  return path


def write_json(path: PathLike, obj: Any, **dumps_kwargs) -> epath.Path:
  """`obj` as indented JSON (json.dumps keyword arguments pass through), via `write_text`.
  Strict JSON: a NaN or infinity (which many readers refuse) is a ValueError naming the file;
  probe/report.py's `sanitize` turns them into null first."""
  try:
    text = json.dumps(obj, indent=2, allow_nan=False, **dumps_kwargs)
  except ValueError as e:
    raise ValueError(f"{path}: not written, {e} (sanitize the values first).") from None
  return write_text(path, text)


def read_json(path: PathLike) -> Any:
  """The JSON at `path`; a ValueError naming the file when it is not JSON."""
  path = as_path(path)
  try:
    return json.loads(path.read_text())
  except ValueError as e:
    raise ValueError(f"{path} cannot be read as JSON ({e}).") from None


@contextlib.contextmanager
def staged_locally(path: PathLike, skip=(LOCK_FILE,)) -> Iterator[str]:
  """A local folder for a single-host job whose writers need one (matplotlib figures, NumPy
  feature caches, a demo's sub-runs): `path` itself when it is local. For an object store, a
  temporary folder holding a copy of what `path` already has (so a rerun finds its earlier
  outputs), copied back file by file when the job ends, also when it fails; `skip`: top-level
  names neither copied down nor back (the claim's lock)."""
  path = as_path(path)
  if is_local(path):
    yield os.fspath(path)
    return
  with tempfile.TemporaryDirectory(prefix="metonymy-staged-") as local:
    if path.exists():
      _copy_tree(path, epath.Path(local), skip)
    try:
      yield local
    finally:
      _copy_tree(epath.Path(local), path, skip)


def _copy_tree(source: epath.Path, target: epath.Path, skip=()) -> None:
  for entry in source.iterdir():
    if entry.name in skip or entry.name.endswith(".tmp"):
      continue
    if entry.is_dir():
      _copy_tree(entry, target / entry.name)
    else:
      target.mkdir(parents=True, exist_ok=True)
      (target / entry.name).write_bytes(entry.read_bytes())


def refresh(path: PathLike) -> None:
  """Drops the listings fsspec caches for an object store (gcsfs never expires them), so that
  listing `path` shows what other processes wrote since: a notebook reading a run that is still
  training sees its newest checkpoint. Nothing on a local filesystem."""
  if is_local(path):
    return
  protocol = os.fspath(path).split("://", 1)[0]
  # The same arguments as epath's, so this is the instance epath holds (fsspec caches them).
  kwargs = {"finalize_on_close": True} if protocol in ("gs", "gcs") else {}
  try:
    fsspec.filesystem(protocol, **kwargs).invalidate_cache()
  except (ImportError, ValueError):
    pass  # No fsspec backend for it: epath then uses TensorFlow's, which caches no listings.
