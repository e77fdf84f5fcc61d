"""metonymy/runs/machine_load.py: the cores and load averages a job records; and
reporting.wall_time_text: the blocks' wall-time sentence that says whether other jobs shared
the cores."""

import os

from metonymy import reporting
from metonymy.runs import machine_load


def test_cores_and_load_averages_come_from_the_system():
  assert 1 <= machine_load.usable_cores() <= (os.cpu_count() or 1)
  load = machine_load.load_average()
  assert load is None or (len(load) == 3 and min(load) >= 0.0)
  record = machine_load.at_end([0.5, 0.4, 0.3])
  assert record["cores"] == machine_load.usable_cores()
  assert record["load_average_start"] == [0.5, 0.4, 0.3]
  assert record["load_average_end"] is None or len(record["load_average_end"]) == 3
  assert record["processes"] == 1 and machine_load.at_end(None, 2)["processes"] == 2
  assert record["allocator"] in ("jemalloc", "tcmalloc", "mimalloc", "system malloc")


def test_wall_time_names_the_host_allocator_it_was_measured_on():
  machine = {"cores": 2, "load_average_start": [0.3, 0.2, 0.1],
             "load_average_end": [1.9, 1.1, 0.5], "allocator": "jemalloc"}
  assert reporting.wall_time_text("300 s", 300, machine).endswith(
      "machine otherwise idle; host allocator: jemalloc)")
  del machine["allocator"]  # results.json files older than the record: nothing said
  assert "allocator" not in reporting.wall_time_text("300 s", 300, machine)


def test_wall_time_says_when_the_cores_were_shared():
  shared = {"cores": 2, "load_average_start": [0.3, 0.2, 0.1],
            "load_average_end": [3.9, 3.1, 2.0]}
  assert reporting.wall_time_text("484 s", 484, shared) == (
      "Wall time 484 s on 2 CPU cores (load average 3.9 at the end: the cores were shared with "
      "other jobs)")
  alone = dict(shared, load_average_end=[2.2, 2.0, 1.0])  # the demo's own threads, nothing else
  assert "machine otherwise idle" in reporting.wall_time_text("320 s", 320, alone)
  idle = dict(shared, load_average_end=[1.9, 1.7, 1.0])
  assert reporting.wall_time_text("484 s", 484, idle) == (
      "Wall time 484 s on 2 CPU cores (load average 1.9 at the end: machine otherwise idle)")
  # Two worker processes of the job bring a thread each: 3.5 is their own load, not a neighbour.
  two_workers = dict(shared, load_average_end=[1.5, 2.5, 3.5], processes=2)
  assert "machine otherwise idle" in reporting.wall_time_text("83 min", 4980, two_workers)
  assert "shared with other jobs" in reporting.wall_time_text(
      "83 min", 4980, dict(two_workers, processes=1))
  assert "shared with other jobs" in reporting.wall_time_text(
      "83 min", 4980, dict(two_workers, load_average_end=[1.5, 2.5, 4.6]))
  # Already busy when the job began, quiet by its end.
  busy_start = {"cores": 2, "load_average_start": [5.2, 4.0, 3.0],
                "load_average_end": [1.5, 1.6, 1.7]}
  assert reporting.wall_time_text("60 s", 60, busy_start).endswith(
      "(load average 5.2 at the start: the cores were shared with other jobs)")


def test_only_load_windows_inside_the_run_count_at_its_end():
  # A 15-minute average after a 5-minute run is mostly what ran before the run.
  machine = {"cores": 2, "load_average_start": [1.0, 1.0, 6.0],
             "load_average_end": [1.8, 1.9, 4.5]}
  assert reporting.peak_load(machine, 300) == (1.9, "at the end")
  assert reporting.peak_load(machine, 30) == (1.8, "at the end")
  assert reporting.peak_load(machine, 3600) == (4.5, "at the end")
  assert "machine otherwise idle" in reporting.wall_time_text("5 min", 300, machine)
  assert "shared with other jobs" in reporting.wall_time_text("60 min", 3600, machine)


def test_without_a_recorded_load_only_the_cores_are_said():
  # results.json written before the load was recorded, and a system without load averages.
  assert reporting.wall_time_text("92 min", 5511, {"cpu_count": 2}) == (
      "Wall time 92 min on 2 CPU cores")
  no_load = {"cores": 1, "backend": "cpu x 1", "load_average_start": None,
             "load_average_end": None}
  assert reporting.wall_time_text("852 s", 852, no_load) == (
      "Wall time 852 s on 1 CPU core (cpu x 1)")
  assert reporting.peak_load(no_load, 852) is None
