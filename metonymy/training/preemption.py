"""Preemption and time-based checkpoints: saves besides every N steps, agreed by every process.

A scheduler warns before it takes the machines: SLURM sends a signal ahead of the time limit or a
preemption (SIGUSR1 with `--signal`, SIGTERM otherwise), Cloud TPU spot and maintenance events
send SIGTERM. On SIGTERM or SIGUSR1 the run finishes its step, every process saves a checkpoint at
the same step (parameters, optimizer, step, RNG, data position), waits until the save is final,
and exits with REQUEUE_EXIT_CODE, which launch/ scripts treat as "requeue me". A JAX preemption
notice (`multihost_utils.reached_preemption_sync_point`, from the coordination service's own
notifier) stops the run the same way. That notifier listens for SIGTERM too, from
`jax.distributed.initialize` on; while the loop runs, these handlers take SIGTERM over, so a
signal is handled the same way on one process and on many (the JAX notice still counts when a
platform's notifier raises it by other means, or when SIGTERM came before the loop).

How the processes agree without an extra collective: every step takes this process's wishes as
an input ([local devices, 2] int32: a signal arrived / checkpoint_every_minutes elapsed) and
returns their maximum over all processes beside its metrics. The loop reads a step's metrics on
the host one step later anyway, so every process sees the same wishes for step s while it runs
step s + 1, and saves at s + 1. A signal that reaches one process saves the same step on all.

Signals during the save (SLURM repeats them; an impatient user) only set the flag again: nothing
is interrupted, and the save either completes or, under SIGKILL, is never finalized, leaving the
previous checkpoint as the newest (run_state.py). The handlers replace the defaults while the
training loop runs; a preempted run leaves the two signals ignored, as it is on its way out.

Time-based checkpoints (`config.trainer.checkpoint_every_minutes`, 0 = off) bound the work a hard
kill (SIGKILL, a node failure) loses whatever the epoch length: a process asks for a save when
that long has passed since the last save; the wish is agreed like a signal's.
"""

import signal
import threading
import time
from typing import Optional, Tuple

from absl import logging
import jax
from jax.experimental import multihost_utils
import numpy as np

from metonymy import console

# The exit status of a run that saved after a preemption notice and should be started again: 75
# is EX_TEMPFAIL in sysexits.h ("temporary failure, the user is invited to retry"). launch/
# scripts requeue on it; any other status is a finished or failed run.
REQUEUE_EXIT_CODE = 75
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

# Columns of the wishes each step reduces across processes.
_SIGNALLED, _TIME_DUE = 0, 1


class Preempted(SystemExit):
  """The run saved at `step` after a preemption notice; exits the program with REQUEUE_EXIT_CODE."""

  def __init__(self, step: int, reason: str):
    super().__init__(REQUEUE_EXIT_CODE)
    self.step, self.reason = step, reason

  def __str__(self):
    return (f"Preempted ({self.reason}): saved at step {self.step}; exit status "
            f"{REQUEUE_EXIT_CODE} asks the launcher to requeue the run.")


def _jax_notice(step: int) -> bool:
  """Whether JAX's preemption service says every process reached its sync point at `step`
  (its notifier, when the platform has one; False on one process or with the service off)."""
  if jax.process_count() == 1:
    return False
  try:
    return bool(multihost_utils.reached_preemption_sync_point(step))
  except RuntimeError:  # jax_enable_preemption_service is off.
    return False


class Watch:
  """Signal handlers and the save clock of one training loop (a context manager).

    with preemption.Watch(config.trainer.checkpoint_every_minutes, start_step=step) as watch:
      ...
      state, metrics, agreed = train_step(state, frozen, batch, watch.wishes(batch_sharding))
      stop, timed = watch.decide(step, previous_agreed)   # step: the one just dispatched
      ... save if stop or timed; watch.saved(step) after every save ...
  """

  def __init__(self, checkpoint_every_minutes: float = 0.0, start_step: int = 0):
    self.every_s = float(checkpoint_every_minutes) * 60.0
    # The first handled signal's name (signals pending together are handled in number order).
    self.received: Optional[str] = None
    self.count = 0
    self._last_save_step = start_step
    self._last_save_time = time.monotonic()
    self._previous = {}

  # -- signals ----------------------------------------------------------------------------------

  def _handle(self, signum, frame):  # pylint: disable=unused-argument
    # Runs on the main thread between bytecodes: only set flags here, log at the step boundary.
    self.count += 1
    if self.received is None:
      self.received = signal.Signals(signum).name

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
    else:  # signal.signal only works on the main thread.
      logging.warning("Training off the main thread: SIGTERM/SIGUSR1 do not save the run.")
    return self

  def __exit__(self, exc_type, exc, traceback):
    for signum, handler in self._previous.items():
      # A preempted run is on its way out: a signal from here on (the scheduler repeats them)
      # must not turn exit status 75 into a kill, so none gets the default action back.
      # (None: the previous handler was not set from Python; the default is the safe choice.)
      restored = handler if handler is not None else signal.SIG_DFL
      signal.signal(signum, signal.SIG_IGN if isinstance(exc, Preempted) else restored)
    self._previous = {}
    return False

  # -- the agreement ----------------------------------------------------------------------------

  def wishes(self, batch_sharding) -> jax.Array:
    """This process's wishes for the step about to run, as a global [devices, 2] int32 array
    split like the batch (the step reduces it with `agree`)."""
    time_due = self.every_s > 0 and time.monotonic() - self._last_save_time >= self.every_s
    row = np.array([[self.received is not None, time_due]], np.int32)
    local = np.repeat(row, len(batch_sharding.addressable_devices), axis=0)
    return jax.make_array_from_process_local_data(batch_sharding, local)

  @staticmethod
  def agree(wishes: jax.Array) -> jax.Array:
    """Inside the jitted step: int32 [2], every process's wishes or-ed (replicate the output)."""
    return wishes.max(axis=0)

  def decide(self, step: int, previous_agreed) -> Tuple[bool, bool]:
    """(stop, timed) for `step`, the step just dispatched, from the agreed wishes of step - 1
    (`previous_agreed`, None on a loop's first step). Same answer on every process: stop means
    save at `step` and exit with REQUEUE_EXIT_CODE; timed means save at `step` because
    checkpoint_every_minutes passed."""
    jax_notice = _jax_notice(step)  # Called at every step on every process, as JAX requires.
    if previous_agreed is None:
      return jax_notice, False
    agreed = np.asarray(jax.device_get(previous_agreed))
    stop = bool(agreed[_SIGNALLED]) or jax_notice
    # Wishes of step - 1 were made before a save at step - 1 reset the clock: stale then.
    timed = bool(agreed[_TIME_DUE]) and step - 1 > self._last_save_step
    return stop, timed

  def saved(self, step: int) -> None:
    """Restarts the save clock: call after every checkpoint save of the loop."""
    self._last_save_step = step
    self._last_save_time = time.monotonic()

  def reason(self) -> str:
    if self.received is None:
      return "a signal to another process, or JAX's preemption notice"
    return f"{self.received}" + (f", {self.count} signals" if self.count > 1 else "")

  def exit_after_save(self, step: int, mngr) -> None:
    """Waits until the checkpoint of `step` is final on every process, then raises Preempted.

    The barrier keeps a process from exiting while another still writes: `srun
    --kill-on-bad-exit` would kill that one at the first exit status 75."""
    mngr.wait_until_finished()
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices(f"metonymy_preempted_{step}")
    error = Preempted(step, self.reason())
    if jax.process_index() == 0:
      console.console(str(error))
    else:
      logging.warning("Process %d: %s", jax.process_index(), error)
    raise error
