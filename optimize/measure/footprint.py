"""The run's own memory: what its process tree holds (RSS, sampled), what the machine has free, sizes in words.

`optimize.measure.memory` measures a model's peak in the runtime; this is the footprint of optimize itself while
it works: the sweep's process and every process it started (workers, their forked children, the memory probe).
The tree's resident memory is summed over its processes (`tree_rss`: pages a fork shares with its parent are
counted in both, so the sum errs high, never low; a quantizer's check runs in forks of its worker) and so is its
proportional share (`tree_memory`'s PSS: each shared page split among the processes sharing it, what the tree
really holds). `Sampler` keeps both peaks from a thread, as the run goes: recorded in study.json (`Study.memory`)
and printed with `-v`. The scheduler admits work against a budget (`optimize.engine.budget`) by the RSS sum.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time

from optimize.core.errors import RecipeError

#: How often the sampler reads the tree's RSS (seconds): short next to any phase that could raise it by much.
EVERY_S = 0.2
#: How often at most it reads the tree's PSS (seconds). PSS walks every mapping of every process (smaps_rollup): on
#: a tree of TensorFlow processes, read every 0.2 s it took a quarter of a core, 7 of a MobileNetV2 sweep's 47 CPU
#: seconds; it is read only when it could be a new peak (the RSS sum above the PSS peak so far) and this often.
PSS_EVERY_S = 1.0


def available_bytes() -> int:
    """What the machine has free for new work now (MemAvailable: free memory plus caches it can drop)."""
    import psutil

    return int(psutil.virtual_memory().available)


def rss(pid: int | None = None) -> int:
    """One process's resident memory (bytes); 0 when it is gone."""
    import psutil

    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return 0


def tree_rss(pid: int | None = None) -> int:
    """Resident memory of a process and all its descendants, summed (bytes)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


def tree_memory(pid: int | None = None, pss: bool = True) -> tuple[int, int]:
    """(RSS, PSS) of a process and all its descendants, each summed (bytes); PSS falls back to RSS where the system
    does not give it. `pss=False`: the RSS sum alone (cheap: /proc/PID/statm), PSS 0."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0, 0
    rss_sum = pss_sum = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if not pss:
                rss_sum += p.memory_info().rss
                continue
            full = p.memory_full_info()
            rss_sum += full.rss
            pss_sum += getattr(full, "pss", full.rss)
    return rss_sum, pss_sum


class Sampler:
    """The peaks of this process tree's memory (`tree_memory`: RSS and PSS summed) while it runs, read every `every`
    seconds from a thread: the RSS sum each time, the PSS sum where it could pass its peak, at most every `pss_every`
    seconds: where the RSS sum is above the PSS peak (PSS never exceeds RSS) and above every RSS sum PSS was read at
    (the tree's PSS grows where its RSS does: pages a process of the tree lets go, or shares, leave the PSS sum no
    higher). A MobileNetV2 sweep read PSS 26 times in 26 s at once a second, 75 ms each (4 TensorFlow processes)."""

    def __init__(self, every: float = EVERY_S, pss_every: float = PSS_EVERY_S) -> None:
        self.every, self.pss_every = every, pss_every
        self.peak = 0  # of the RSS sum
        self.peak_pss = 0
        self.samples = 0
        self._pss_at = float("-inf")  # when PSS was last read (time.monotonic)
        self._pss_rss = 0  # the highest RSS sum PSS was read at (never below the PSS peak: PSS <= RSS)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="optimize-footprint")

    def __enter__(self) -> Sampler:
        self.sample(force=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sample(force=True)

    def sample(self, force: bool = False) -> int:
        """Read the tree now; `force`: its PSS too, however recently it was read (the first and last samples)."""
        now = tree_memory(os.getpid(), pss=False)[0]
        self.peak = max(self.peak, now)
        due = time.monotonic() - self._pss_at >= self.pss_every
        if force or (now > self._pss_rss and due):  # above it, above the PSS peak too
            self._pss_at = time.monotonic()
            full, pss = tree_memory(os.getpid())  # both in one pass: the PSS peak never above the RSS one
            self._pss_rss = max(self._pss_rss, full)
            self.peak, self.peak_pss = max(self.peak, full), max(self.peak_pss, pss)
        self.samples += 1
        return now

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()


def gb(n: int | float) -> str:
    """Bytes in words: `434 MB`, `5.72 GB` (decimal units, as file sizes are shown)."""
    if n < 1e9:
        return f"{n / 1e6:.0f} MB"
    return f"{n / 1e9:.2f} GB"


_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_DECIMAL = {"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def parse_size(text: str) -> int:
    """`6GB` (10^9 bytes each), `6GiB` or `6g` (2^30, as `docker --memory` reads it), `512MB`, `2.5GB`, or plain
    bytes, into bytes; a RecipeError saying the form for anything else or for a size under 64 MB."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*", text.lower())
    if m is None or (m.group(3) == "i"):
        raise RecipeError(f"{text!r} is not a memory size.", "Give it as 6GB, 6GiB, 512MB or a number of bytes.")
    number, unit, tail = float(m.group(1)), m.group(2), m.group(3)
    scale = _DECIMAL[unit + "b"] if tail == "b" and unit else _UNITS[unit]
    size = int(number * scale)
    if size < 64 * 10**6:
        raise RecipeError(f"A memory budget of {text.strip()} is too small to run a model.", "Give at least 64MB.")
    return size


def high_water() -> int:
    """This process's peak resident memory since the last `reset_high_water` (VmHWM; 0 where not readable)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def reset_high_water() -> None:
    """Start a new peak from the current resident memory (Linux: /proc/self/clear_refs; elsewhere a no-op)."""
    with contextlib.suppress(OSError):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")


class PhasePeaks:
    """This process's peak resident memory in each phase of a candidate (what `optimize.engine.pipeline.timed`
    times), read from the kernel's high-water mark: reset as a phase starts, read as it ends or as a phase inside
    it starts, and counted for every phase open at the time (phases nest: a quantizer's check inside its step)."""

    current: PhasePeaks | None = None  # the candidate being made in this process (set by `collecting`)

    def __init__(self) -> None:
        self.peaks: dict[str, int] = {}
        self.open: list[str] = []

    @contextlib.contextmanager
    def collecting(self):
        before, PhasePeaks.current = PhasePeaks.current, self
        try:
            yield self
        finally:
            PhasePeaks.current = before

    def _close_segment(self) -> None:
        peak = high_water()
        for name in self.open:
            self.peaks[name] = max(self.peaks.get(name, 0), peak)
        reset_high_water()

    @contextlib.contextmanager
    def phase(self, name: str):
        self._close_segment()
        self.open.append(name)
        try:
            yield
        finally:
            self._close_segment()
            self.open.remove(name)


@contextlib.contextmanager
def phase_peak(name: str):
    """The peak of `name` kept by the candidate being made here, if one is collecting (else nothing); the heap the
    phase freed is given back to the system as it ends (`give_back`), so the next phase starts from what is live."""
    peaks = PhasePeaks.current
    try:
        if peaks is None:
            yield
            return
        with peaks.phase(name):
            yield
    finally:
        give_back()


_TRIM: list = []  # glibc's malloc_trim, looked up once (None where the C library has none)


def give_back() -> None:
    """Give the heap this process has freed back to the system (glibc's `malloc_trim`; a no-op elsewhere). The
    allocator keeps freed pages for reuse: a BERT-base-sized float32 conversion (its SavedModel, in a fresh
    process) left 2.24 GB resident where 0.82 GB was live, and the worker measured the model on top of that. About
    a microsecond when there is nothing to give."""
    if not _TRIM:
        import ctypes
        import ctypes.util

        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _TRIM.append(getattr(libc, "malloc_trim", None))
        except OSError:
            _TRIM.append(None)
    if _TRIM[0] is not None:
        _TRIM[0](0)
