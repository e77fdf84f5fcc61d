"""A run's claim on its workdir: one run at a time, and only a run of the workdir's own config.

  lock = claim.claim(workdir, config)   # the launcher, before anything else is written there
  try:
    job.run(config, workdir)
  finally:
    if lock is not None:
      lock.release()

  claim.record_config(sub_workdir, sub_config)  # a sub-run, under its parent's lock

Two runs on one workdir interleave their metrics, race on the backbone folder and the
checkpoints, and can hang each other; a run aimed at another config's workdir overwrites its
config.json and model.json before Orbax notices that the checkpoints do not fit. So, on process 0
only (the others follow its decision):

  lock    WORKDIR/run.lock, created with O_CREAT | O_EXCL (atomic on a local disk and on the
          cluster filesystems a multi-host run shares: NFSv3+, Lustre, GPFS), holding the
          holder's host, PID, process start time and command. A second run refuses at once,
          naming the holder. A lock left by a crash (SIGKILL, OOM, preemption) is stale and
          taken over: on the same host when its PID is gone, is a zombie or is another process
          now (start times differ); from another host, where PIDs cannot be asked about, when
          its heartbeat (the holder touches the file every HEARTBEAT_S) is older than STALE_S.
  config  the new config against WORKDIR/config.json on the keys that decide what the workdir's
          files are (COMPARED_KEYS: job, model, K, backbone shapes, dataset); a mismatch refuses
          with one paragraph naming every differing key, before config.json is rewritten.

On an object store (a `gs://` workdir, where every host of a TPU pod writes) there is no atomic
exclusive create, no rename and no mtime heartbeat to rely on, so the lock is plainer: process 0
reads WORKDIR/run.lock and refuses while it exists, unless its holder is a process of this same
host that is gone; otherwise it writes its own. What cannot be detected there: a holder on
another host that died (its lock stays until removed), and two runs started within the same
second (both may pass the check). The refusal names the holder and the command that removes the
lock (`gcloud storage rm gs://.../run.lock`) once the user knows that run is gone.
"""

import json
import os
import socket
import sys
import threading
import time
import uuid
from typing import Dict, List, Optional, Tuple

from absl import logging
import jax
from jax.experimental import multihost_utils
import numpy as np

from metonymy.workdir import layout

LOCK_FILE = layout.LOCK_FILE
HEARTBEAT_S = 60.0
STALE_S = 600.0  # A lock from another host whose heartbeat is this old is a crashed run's.

# Dotted config keys whose values decide what a workdir's checkpoints, backbone and model.json
# are; a key absent from both configs is skipped. Everything else (steps, rates, intervals) may
# change between a run and its resume.
COMPARED_KEYS = (
    "job", "mode", "model.name", "model.num_parts", "model.stage2", "backbone.preset",
    "backbone.arch", "backbone.image_size", "backbone.checkpoint", "data.dataset",
    "data.image_size", "masks.source", "masks.num_parts",
)


class WorkdirBusyError(RuntimeError):
  """Another live run holds the workdir's lock; the message names its host and PID."""


class ConfigMismatchError(ValueError):
  """The workdir holds a run of another config; the message names the differing keys."""


# ------------------------------------------------------------------------------------------------
# The lock.


def _start_time(pid: int) -> Optional[str]:
  """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22), with its
  state: tells a reused PID from the original. None where /proc does not say."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      fields = f.read().rsplit(")", 1)[1].split()
    return fields[19]
  except (OSError, IndexError):
    return None


def _is_zombie(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] == "Z"
  except (OSError, IndexError):
    return False


def _holder() -> Dict:
  return {"host": socket.gethostname(), "pid": os.getpid(), "start_time": _start_time(os.getpid()),
          "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "command": " ".join(sys.argv)}


def _stale_reason(holder: Dict, lock_age_s: float) -> Optional[str]:
  """Why the lock's holder is gone, or None while it may be alive."""
  if holder.get("host") != socket.gethostname():
    if lock_age_s > STALE_S:
      return f"its heartbeat is {lock_age_s / 60:.0f} minutes old (host {holder.get('host')})"
    return None
  pid = holder.get("pid")
  if not isinstance(pid, int):
    return "it names no PID"
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return f"process {pid} no longer exists"
  except PermissionError:
    pass  # Alive, another user's.
  if _is_zombie(pid):
    return f"process {pid} has exited"
  now = _start_time(pid)
  if holder.get("start_time") and now and now != holder["start_time"]:
    return f"PID {pid} now belongs to another process"
  return None


def _read_lock(path: str) -> Tuple[Dict, float]:
  """(holder, seconds since its last heartbeat); a half-written lock reads as {}."""
  age = time.time() - os.stat(path).st_mtime
  try:
    with open(path) as f:
      return json.load(f), age
  except ValueError:
    return {}, age


def _break_stale(path: str, holder: Dict) -> bool:
  """Removes the stale lock `holder` wrote; False if another run replaced it meanwhile (then it
  is put back). Renamed first, so two runs breaking the same stale lock cannot both win."""
  aside = f"{path}.stale-{uuid.uuid4().hex[:8]}"
  try:
    os.rename(path, aside)
  except FileNotFoundError:
    return True  # Someone else removed it; the next O_EXCL create decides.
  try:
    with open(aside) as f:
      same = json.load(f) == holder
  except ValueError:
    same = holder == {}
  if same:
    os.remove(aside)
    return True
  try:  # A fresh lock, taken between our read and rename: back where it was.
    os.link(aside, path)
  except FileExistsError:
    pass
  os.remove(aside)
  return False


class Lock:
  """Held while the run lasts; `release` removes the file only if it is still this run's. On a
  local filesystem a thread touches the file every HEARTBEAT_S (the age another host reads)."""

  def __init__(self, path, holder: Dict, heartbeat: bool = True):
    self.path, self.holder = layout.as_path(path), holder
    self._stop = threading.Event()
    self._thread = None
    if heartbeat:
      self._thread = threading.Thread(target=self._heartbeat, daemon=True,
                                      name="metonymy-workdir-lock-heartbeat")
      self._thread.start()

  def _heartbeat(self) -> None:
    while not self._stop.wait(HEARTBEAT_S):
      try:
        os.utime(self.path)
      except OSError:
        return

  def release(self) -> None:
    self._stop.set()
    try:
      if layout.is_local(self.path):
        holder, _ = _read_lock(os.fspath(self.path))
      else:
        holder = _read_remote_lock(self.path)
      if holder == self.holder:
        self.path.unlink()
    except (OSError, ValueError):
      pass


def _busy_message(workdir, path, other: Dict, remedy: str) -> str:
  return (f"{workdir} is in use by another run: process {other.get('pid')} on host "
          f"{other.get('host')}, started {other.get('started')} (`{other.get('command')}`). Wait "
          f"for it to finish or use another --workdir. {remedy}")


def acquire(workdir) -> Lock:
  """Takes WORKDIR/run.lock for this process, breaking a stale one; raises WorkdirBusyError
  naming the holder when a live run has it (see the module docstring for object stores)."""
  files = layout.Workdir(workdir)
  if not files.is_local:
    return _acquire_remote(files)
  workdir, path = os.fspath(files.path), os.fspath(files.lock_file)
  holder = _holder()
  for _ in range(5):  # Retries only after a stale lock was broken.
    try:
      fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      try:
        other, age = _read_lock(path)
      except FileNotFoundError:
        continue  # Released in between.
      stale = _stale_reason(other, age)
      if stale is None:
        raise WorkdirBusyError(_busy_message(workdir, path, other, (
            f"If that run is gone (crashed on another host), delete {path}; a lock from another "
            f"host also counts as stale {STALE_S / 60:.0f} minutes after its last heartbeat "
            f"({age:.0f} s ago)."))) from None
      if _break_stale(path, other):
        logging.warning("Took over the stale lock %s of process %s on host %s: %s.", path,
                        other.get("pid"), other.get("host"), stale)
      continue
    with os.fdopen(fd, "w") as f:
      json.dump(holder, f)
    return Lock(path, holder)
  raise WorkdirBusyError(f"Could not take {path}: other runs keep replacing it.")


def _read_remote_lock(path) -> Dict:
  try:
    return json.loads(path.read_text())
  except ValueError:
    return {}


def _acquire_remote(files: layout.Workdir) -> Lock:
  workdir, path = files.path, files.lock_file
  holder = _holder()
  if path.exists():
    other = _read_remote_lock(path)
    # Only a holder on this host can be asked whether it is alive; its age says nothing here.
    stale = _stale_reason(other, 0.0) if other.get("host") == holder["host"] else None
    if stale is None:
      raise WorkdirBusyError(_busy_message(workdir, path, other, (
          f"On an object store a lock left by a run that died on another host cannot be told "
          f"from a live one: once you know that run is gone, remove the lock with `gcloud "
          f"storage rm {path}` and start again.")))
    logging.warning("Took over the stale lock %s of process %s on host %s: %s.", path,
                    other.get("pid"), other.get("host"), stale)
  path.write_text(json.dumps(holder))
  return Lock(path, holder, heartbeat=False)


# ------------------------------------------------------------------------------------------------
# The config check.


def _value(tree: Dict, key: str):
  node = tree
  for part in key.split("."):
    if not isinstance(node, dict) or part not in node:
      return _ABSENT
    node = node[part]
  return node


_ABSENT = "<absent>"


def config_differences(saved: Dict, new: Dict) -> List[str]:
  """`key: saved -> new` for every COMPARED_KEYS key whose values differ (both as JSON)."""
  diffs = []
  for key in COMPARED_KEYS:
    old, now = _value(saved, key), _value(new, key)
    if old != now:
      diffs.append(f"{key}: {json.dumps(old)} -> {json.dumps(now)}")
  return diffs


def check_config(workdir, config) -> None:
  """Raises ConfigMismatchError when WORKDIR/config.json is of another config (see module doc);
  a workdir without one (new, or written by training.trainer.run directly) passes."""
  files = layout.Workdir(workdir)
  path = files.config_file
  try:
    saved = files.read_config()
  except ValueError as e:
    raise ConfigMismatchError(
        f"{e} So this run cannot tell whether the workdir is its own. Fix or remove {path} if "
        f"the workdir is this config's; nothing was written.") from None
  if saved is None:
    return
  new = json.loads(config.to_json_best_effort())
  diffs = config_differences(saved, new)
  if diffs:
    raise ConfigMismatchError(
        f"{files.path} holds a run of another config, so nothing was written there: its "
        f"checkpoints would not fit this run, and its config.json and model.json (what loads it "
        f"as a part-mask source) would be overwritten. Differing keys (the workdir's value -> "
        f"this run's): {'; '.join(diffs)}. Use a new --workdir for this config, or resume that "
        f"run with its own config ({path}).")


def record_config(workdir, config) -> None:
  """Checks `config` against WORKDIR/config.json (check_config) and writes it there: the claim
  minus the lock, for a sub-run inside a tree whose root its parent has locked."""
  files = layout.Workdir(workdir).make()
  check_config(files, config)
  files.write_config_json(config)


def claim(workdir, config) -> Optional[Lock]:
  """Locks `workdir`, checks `config` against its config.json and writes the new one; returns
  the lock to release when the run ends (None on processes other than 0, which hold none). With
  several processes, all raise when process 0 refuses."""
  lock, error = None, None
  if jax.process_index() == 0:
    try:
      files = layout.Workdir(workdir).make()
      lock = acquire(files)
      record_config(files, config)
    except (WorkdirBusyError, ConfigMismatchError, OSError) as e:
      error = e
  if jax.process_count() > 1:  # One decision for all: refused, every process stops.
    refused = bool(multihost_utils.broadcast_one_to_all(np.asarray(error is not None)))
    if refused and error is None:
      error = WorkdirBusyError(f"Process 0 refused {workdir}; its log says why.")
  if error is not None:
    if lock is not None:
      lock.release()
    raise error
  return lock
