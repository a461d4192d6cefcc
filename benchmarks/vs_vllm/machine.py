"""How busy the shared machine is, and how much memory an engine's process tree holds (psutil).

A timed run counts as disturbed when processes other than the coordinator, its finished children
(the benchmark client) and the engine under test took a share of the CPUs; the idle engine counts as
"other", so an engine that spins while idle would show up here.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import psutil


def busy_cpu_s() -> float:
    """CPU seconds all CPUs have spent busy since boot."""
    c = psutil.cpu_times()
    return c.user + c.nice + c.system + c.irq + c.softirq + c.steal


def _tree(root: psutil.Process) -> list[psutil.Process]:
    """A process and its live descendants (none if it is gone)."""
    try:
        return [root] + root.children(recursive=True)
    except psutil.Error:
        return []


def tree_cpu_s(root: psutil.Process | None) -> float:
    """CPU seconds of a live process and its descendants: live ones, and those a member has reaped."""
    if root is None:
        return 0.0
    total = 0.0
    for proc in _tree(root):
        try:
            t = proc.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return total


def own_cpu_s() -> float:
    """This process's CPU seconds plus those of its children already waited for (the client runs)."""
    t = psutil.Process().cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def others_share(busy_s: float, own_s: float, wall_s: float, cpus: int) -> float:
    """Share of the machine's CPUs (0..1) that others took: busy time not ours over the wall time."""
    if wall_s <= 0 or cpus < 1:
        raise ValueError(f"need a positive wall time and at least one CPU, got {wall_s} s, {cpus} CPUs")
    return max(0.0, busy_s - own_s) / (cpus * wall_s)


@dataclass
class Window:
    """CPU counters at the start of a timed window; ``share()`` at its end."""

    engine: psutil.Process | None
    busy: float = field(init=False)
    own: float = field(init=False)
    start: float = field(init=False)

    def __post_init__(self) -> None:
        self.busy, self.own, self.start = busy_cpu_s(), own_cpu_s() + tree_cpu_s(self.engine), time.monotonic()

    def share(self) -> float:
        own = own_cpu_s() + tree_cpu_s(self.engine) - self.own
        return others_share(busy_cpu_s() - self.busy, own, time.monotonic() - self.start, psutil.cpu_count())


def wait_quiet(threshold: float, max_wait_s: float, probe_s: float = 3.0) -> tuple[float, float]:
    """Waits until others take less than ``threshold`` of the CPUs over a ``probe_s`` window, or
    ``max_wait_s`` passes; returns (the last window's share, seconds waited)."""
    start = time.monotonic()
    while True:
        window = Window(None)
        time.sleep(probe_s)
        share = window.share()
        if share < threshold or time.monotonic() - start >= max_wait_s:
            return share, time.monotonic() - start
        time.sleep(probe_s)


def tree_rss_bytes(root: psutil.Process) -> int:
    """Resident memory of a process and its descendants, summed (shared pages count in each)."""
    total = 0
    for proc in _tree(root):
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass
    return total


class PeakRss:
    """Samples each watched process tree's summed RSS every ``interval_s`` on a thread; ``peak(pid)``."""

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self.roots: dict[int, psutil.Process] = {}
        self.peaks: dict[int, int] = {}
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def watch(self, pid: int) -> None:
        with self.lock:
            self.roots[pid] = psutil.Process(pid)
            self.peaks.setdefault(pid, 0)

    def peak_mib(self, pid: int) -> float:
        self.sample()
        with self.lock:
            return self.peaks.get(pid, 0) / 2**20

    def sample(self) -> None:
        with self.lock:
            for pid, root in self.roots.items():
                self.peaks[pid] = max(self.peaks[pid], tree_rss_bytes(root))

    def _loop(self) -> None:
        while not self.stopped.wait(self.interval_s):
            self.sample()

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()
