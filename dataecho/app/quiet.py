"""Whether the demo's machine was quiet: its figures of merit hold only where nothing else competes.

    watch = CpuWatch.start()                  # before the calibration
    ...                                       # calibrate, train the three runs
    check = QuietCheck(aim=4.0, lived_ratio=lived, others_cores=watch.others_cores(),
                       load_per_core=load_before)
    for line in check.problems(): print(line)

The demo aims at an upstream ratio R and compares runs that must live the same R. Another job
on the cores slows the training step and the loader worker by different amounts, so R drifts
from the aim and the figures of merit compare unlike runs. Two signs are read: the R the
no-echo run lived against the aim, and the CPU time other programs took while the demo ran
(the machine's busy time in ``/proc/stat`` less this process tree's), with the load average
before the start as a third where ``/proc/stat`` is missing.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass

# A lived R within this fraction of the aim is taken as the aim; the calibration's own spread
# on an idle machine is about 5%, and the figures of merit survive 25% (docs/demo.md).
RATIO_TOLERANCE = 0.25
# Other programs' average use, in cores, above which the machine counts as busy: a quarter of
# one of the demo's two cores is more than its loader worker's slack.
OTHERS_CORES_LIMIT = 0.25
# The 1-minute load average per usable core before the start above which the machine is busy.
LOAD_PER_CORE_LIMIT = 0.5
RERUN = (
    "rerun on an idle machine (stop other jobs; `uptime` shows the load), or give "
    "--bandwidth BYTES_PER_S to keep the cap fixed"
)


def usable_cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def load_per_core() -> float | None:
    """The 1-minute load average over the usable cores, or None where the OS has none."""
    if not hasattr(os, "getloadavg"):
        return None
    return os.getloadavg()[0] / usable_cores()


def machine_busy_seconds() -> float | None:
    """CPU seconds all programs have run since boot (all cores), or None without /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal ...: all but idle and iowait are busy.
    ticks = [int(x) for x in fields[1:]]
    busy = sum(ticks) - ticks[3] - (ticks[4] if len(ticks) > 4 else 0)
    return busy / os.sysconf("SC_CLK_TCK")


def own_seconds() -> float:
    """CPU seconds of this process and the children it has waited for (workers, nginx)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@dataclass(frozen=True)
class CpuWatch:
    """The machine's and this process tree's CPU time at a start, to share out what came after."""

    wall: float
    machine: float | None
    own: float

    @classmethod
    def start(cls) -> CpuWatch:
        return cls(time.monotonic(), machine_busy_seconds(), own_seconds())

    def others_cores(self) -> float | None:
        """Cores other programs kept busy on average since the start (children still running
        count as others: read it once they are stopped); None without /proc/stat."""
        machine = machine_busy_seconds()
        if machine is None or self.machine is None:
            return None
        wall = max(time.monotonic() - self.wall, 1e-9)
        return max(0.0, (machine - self.machine) - (own_seconds() - self.own)) / wall


@dataclass(frozen=True)
class QuietCheck:
    """The signs of a busy machine in one demo, and what they mean for its figures."""

    aim: float  # the R the bandwidth cap was chosen for
    lived_ratio: float  # the R the no-echo run lived
    others_cores: float | None = None  # other programs' average use during the demo, in cores
    load_per_core: float | None = None  # the 1-minute load average per core before the start
    calibration_settled: bool = True  # whether the calibration's last probe met its tolerance

    @property
    def quiet(self) -> bool:
        return not self.problems()

    def problems(self) -> list[str]:
        """One line per sign of a busy machine, each saying what it does to the figures."""
        found = []
        off = self.lived_ratio / self.aim - 1
        if abs(off) > RATIO_TOLERANCE:
            found.append(
                f"R lived {self.lived_ratio:.2f} against an aim of {self.aim:.2f} ({off:+.0%}, "
                f"more than the {RATIO_TOLERANCE:.0%} allowed): the runs did not meet the "
                "conditions the figures of merit assume"
            )
        if self.others_cores is not None and self.others_cores > OTHERS_CORES_LIMIT:
            found.append(
                f"other programs kept {self.others_cores:.2f} cores busy on average while the "
                f"demo ran (the limit is {OTHERS_CORES_LIMIT:.2f}): they slow the step and the "
                "loader by different amounts"
            )
        if self.load_per_core is not None and self.load_per_core > LOAD_PER_CORE_LIMIT:
            found.append(
                f"the load average was {self.load_per_core:.2f} per core before the start "
                f"(the limit is {LOAD_PER_CORE_LIMIT:.2f})"
            )
        if not self.calibration_settled:
            found.append("the calibration's probes did not settle on the aim (see its notes)")
        return found

    def summary(self) -> list[str]:
        """The lines the terminal and report.md print: empty on a quiet machine."""
        problems = self.problems()
        if not problems:
            return []
        return [
            "THE MACHINE WAS NOT QUIET; the figures of merit may not hold:",
            *(f"  - {line}" for line in problems),
            f"  what to do: {RERUN}",
        ]
