"""A dataset that kills its process when asked for calibration samples: a stand-in for a segfault in the
converter or interpreter on a hostile model. Importable by spawned worker processes (tests/ is on sys.path)."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from optimize.models.data import Dataset


@dataclass(frozen=True)
class CrashingData(Dataset):
    def calibration(self, n: int):
        os.kill(os.getpid(), signal.SIGSEGV)
