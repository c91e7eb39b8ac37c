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


def open_dying_once(request):
    """`runs.opened_elsewhere` in an opener process, once the first opener to call it has died of SIGKILL (the file
    $OPTIMIZE_TEST_DIE_ONCE says one did): a killed opener is started again."""
    from pathlib import Path

    marker = Path(os.environ["OPTIMIZE_TEST_DIE_ONCE"])
    if not marker.exists():
        marker.write_text("died")
        os.kill(os.getpid(), signal.SIGKILL)
    from optimize.engine.runs import opened_elsewhere

    return opened_elsewhere(request)
