"""Peak resident memory of this process between two points (Linux).

    reset_peak()          # VmHWM := current RSS (writes "5" to /proc/self/clear_refs)
    ...                   # the operation
    peak_rss_mib()        # VmHWM since the reset, MiB
    current_rss_mib()     # VmRSS now, MiB (peak - RSS before = what the operation added)

Where ``clear_refs`` is not writable, the peak is the process's lifetime peak
(``getrusage`` ``ru_maxrss``), which only grows: ``peak_is_reset()`` says which one you got.
"""

from __future__ import annotations

import re
import resource

__all__ = ["current_rss_mib", "peak_is_reset", "peak_rss_mib", "reset_peak"]

_RESET_OK: bool | None = None


def reset_peak() -> bool:
    """Reset this process's peak RSS to its current RSS; False where the kernel refuses."""
    global _RESET_OK
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        _RESET_OK = True
    except OSError:
        _RESET_OK = False
    return _RESET_OK


def peak_is_reset() -> bool:
    return bool(_RESET_OK)


def _status_mib(field: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            m = re.search(rf"{field}:\s+(\d+)\s+kB", f.read())
    except OSError:
        return None
    return int(m.group(1)) / 1024 if m else None


def current_rss_mib() -> float:
    """This process's resident memory now (``VmRSS``), MiB; 0.0 where it is unknown."""
    return _status_mib("VmRSS") or 0.0


def peak_rss_mib() -> float:
    """Peak RSS in MiB since the last ``reset_peak()`` (else since the process started)."""
    peak = _status_mib("VmHWM")
    if peak is not None:
        return peak
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
