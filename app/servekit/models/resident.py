"""How much resident memory a model's load took, measured as the process's resident set size
(RSS) before and after it.

Why RSS and not what a runtime reports: ONNX Runtime, numpy, the tabular libraries and user
Python code each allocate their own way and only some can say how much, while the kernel counts
every page the load touched, whoever allocated it. The delta is the model's when loads do not
overlap, which the on-demand loader ensures for its loads (app/servekit/services/memory.py); a
model in child processes (``isolation: process``) adds its children's RSS. Linux only
(``/proc``); elsewhere nothing is measured (None).

Freed memory must leave the process for either number to mean anything: glibc keeps what a
model freed in its heaps, resident, and the next load reuses it without the RSS moving. Two
things make it leave: ``exact_frees`` fixes glibc's mmap threshold at 1 MiB (by default it
rises to the size of the largest block freed, up to 32 MiB, after which a model's large arrays
come from a thread's heap whose top glibc never gives back), so each large block is its own
mapping, returned when freed; and ``give_back`` (``malloc_trim``) returns the free pages of the
heaps, after an unload and before a measured load. Neither does anything but on glibc.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable, Iterable

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes(pid: int | str = "self") -> int | None:
    """The resident set size of process ``pid`` (this one by default), or None where it
    cannot be read (not Linux, or the process has gone)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as file:
            return int(file.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return None


def children_bytes(pids: Iterable[int]) -> int:
    """The resident set sizes of ``pids`` added up (those gone count 0)."""
    return sum(rss_bytes(pid) or 0 for pid in pids)


def physical_bytes() -> int | None:
    """The memory this process may use: the machine's RAM, or its container's limit (cgroup
    v2 ``memory.max``, or v1's ``limit_in_bytes``) when lower; None when unknown."""
    try:
        ram: int | None = os.sysconf("SC_PHYS_PAGES") * PAGE
    except (ValueError, OSError, AttributeError):
        ram = None
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as file:
                text = file.read().strip()
        except OSError:
            continue
        if text.isdigit():
            limit = int(text)
            ram = limit if ram is None else min(ram, limit)
    return ram


MMAP_THRESHOLD = 1024 * 1024
"""Blocks this large or larger get a mapping of their own (``exact_frees``)."""
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


_EXACT: list[bool] = []
"""Holds True once ``exact_frees`` has set the threshold (``give_back`` does nothing before)."""


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)  # the process's own symbols: glibc's, where it is glibc
        libc.malloc_trim, libc.mallopt  # noqa: B018 (glibc has both; others may not)
    except (OSError, AttributeError, TypeError):
        return None
    return libc


@functools.cache
def exact_frees() -> bool:
    """Fix glibc's mmap threshold at :data:`MMAP_THRESHOLD` for this process (once; see the
    module docstring): a large block then leaves the process as soon as it is freed. Called
    when models load on demand; False where it cannot be set (not glibc)."""
    libc = _libc()
    done = libc is not None and bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    if done:
        _EXACT.append(True)
    return done


def _malloc_trim() -> Callable[[int], int] | None:
    libc = _libc()
    return None if libc is None else libc.malloc_trim


def give_back() -> None:
    """Return the heap memory freed so far to the system (glibc ``malloc_trim``), once
    ``exact_frees`` is in force (a server with on-demand models; nothing otherwise): what an
    unloaded model held stops counting in the RSS, and a load that follows is measured from
    real pages, not from freed ones it reuses. Milliseconds: call it from a worker thread."""
    trim = _malloc_trim() if _EXACT else None
    if trim is not None:
        trim(0)
