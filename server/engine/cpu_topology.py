"""How many CPU threads ggml gets by default: one per physical core this process
may run on, as llama.cpp's default (`cpu_get_num_math`). Hyperthread siblings
share a core's vector units, so a second thread on one core only adds barrier
waits; a core the process may not use (taskset, a container's cpuset) is no help."""
from __future__ import annotations

import os


def physical_cores(cpus=None, sysfs: str = "/sys/devices/system/cpu") -> int:
    """Physical cores among `cpus` (default: the CPUs this process may use), at least 1."""
    if cpus is None:
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    cores = set()
    for cpu in cpus:
        try:
            with open(f"{sysfs}/cpu{cpu}/topology/thread_siblings_list") as f:
                cores.add(f.read().strip())
        except OSError:          # no topology (not Linux, a restricted /sys): one core per CPU
            cores.add(f"cpu{cpu}")
    return max(1, len(cores))


def default_threads(n_threads: int) -> int:
    """-t as given, or (0 or less) the physical cores."""
    return n_threads if n_threads > 0 else physical_cores()
