"""Process-wide settings, as explicit opt-ins: memory for long CPU training and decoding runs
(:func:`tune_memory`), SIGTERM handled like Ctrl-C while a verb runs
(:func:`terminate_as_interrupt`), and torch's thread count checked against the cores
(:func:`apply_threads`). ``fadat``'s command line opts into the first two for every verb
(``fadat.cli.main``); a program that imports fadat as a library keeps its own settings unless it
calls them. Also what
the machine's processor can do (:func:`native_bf16`, :func:`cpu_features`, :func:`cpu_model`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Inside the block, SIGTERM raises KeyboardInterrupt (as Ctrl-C does), so that ``finally``
    blocks remove temporaries (fadat.outputs) and the command line exits 130; the previous
    handler is restored after it. Outside the main thread (where Python cannot set signal
    handlers) it changes nothing."""

    def handle(signum, frame):
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def tune_memory() -> dict[str, bool]:
    """Transparent huge pages for torch's large CPU allocations, and glibc's malloc keeping freed
    blocks below 32 MiB for reuse. Call it before torch allocates anything (best: before
    ``import torch``); both settings are per process.

    - ``THP_MEM_ALLOC_ENABLE=1`` (unless already set; read once by torch at its first
      allocation): the dense ``(B, L, V)`` tensors of every training step are fresh allocations,
      and their 4 KiB page faults dominate: zero-filling a (64, 240, 8000) float32 gradient took
      218 ms with 4 KiB pages and 52 ms with huge pages on the development machine
      (bench/bench_dag.py). Set ``THP_MEM_ALLOC_ENABLE=0`` to keep 4 KiB pages.
    - ``mallopt``: with huge pages on, torch allocates every tensor of 2 MiB or more with a
      2 MiB alignment, which glibc serves by a fresh mmap and unmaps on free, so each such
      temporary (a (B, L, L) transition matrix, a (B, T, L) message table) is page-faulted anew
      at every use. A fixed mmap threshold of 32 MiB (glibc's maximum) keeps those blocks in the
      heap, and a 256 MiB trim threshold keeps the heap from shrinking after every step.
      Measured (bench/bench_dag.py, B = 64, L = 240, one thread): the DAG likelihood's forward +
      backward 333 → 214 ms, a fresh (16, 240, 240) negation 1.26 → 0.17 ms. Larger tensors
      still get fresh huge-page mappings. Linux/glibc only; ``FADAT_MALLOC_TUNING=0`` leaves
      malloc alone.

    Returns:
        ``{"huge_pages": whether THP_MEM_ALLOC_ENABLE is "1", "malloc": whether mallopt was
        applied}``.
    """
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    return {
        "huge_pages": os.environ["THP_MEM_ALLOC_ENABLE"] == "1",
        "malloc": _keep_freed_memory(),
    }


def _keep_freed_memory() -> bool:
    if os.environ.get("FADAT_MALLOC_TUNING", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl): nothing to tune
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    return bool(mallopt(m_mmap_threshold, 32 * 2**20)) and bool(
        mallopt(m_trim_threshold, 256 * 2**20)
    )


def apply_threads(threads: int, force: bool = False) -> None:
    """``torch.set_num_threads(threads)`` when ``threads > 0``, after
    :func:`fadat.options.check_threads`.

    Args:
        threads: torch's intra-op threads; 0 leaves torch's default.
        force: allow more threads than the cores this process may use.

    Warns:
        ThreadsAboveCoresWarning: ``force`` lets more threads than cores through (``fadat``'s
            command line prints it as one ``fadat: warning: ...`` line).

    Raises:
        InputError: ``threads`` negative or above :data:`fadat.options.MAX_THREADS`, or above the
            machine's cores without ``force``.
    """
    from fadat.errors import ThreadsAboveCoresWarning
    from fadat.options import check_threads

    warning = check_threads(threads, force)
    if warning:
        warnings.warn(warning, ThreadsAboveCoresWarning, stacklevel=2)
    if threads:
        import torch

        torch.set_num_threads(threads)


def native_bf16(device_type: str = "cpu") -> bool:
    """Whether bf16 matrix products run in hardware on this machine's ``device_type``.

    CPU: AVX-512 BF16 or AMX tiles (``torch.cpu._is_avx512_bf16_supported`` /
    ``_is_amx_tile_supported``). Without them oneDNN emulates bf16: on an AVX2-only AMD Zen 3 a
    512×512 bf16 matrix product took 33× as long as fp32 (torch 2.13, one thread), so bf16
    autocast there makes training slower, not faster. CUDA: ``torch.cuda.is_bf16_supported()``.
    Other device types: True (no check made).
    """
    import torch

    if device_type == "cpu":
        cpu = torch.cpu
        checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
        return any(getattr(cpu, name, lambda: False)() for name in checks)
    if device_type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    return True


#: The CPU features :func:`cpu_features` reports, each with the torch helper that answers it
#: (``None``: torch has none) and its ``/proc/cpuinfo`` flag.
CPU_FEATURES: dict[str, tuple[str | None, str]] = {
    "amx_tile": ("_is_amx_tile_supported", "amx_tile"),
    "amx_bf16": (None, "amx_bf16"),
    "amx_int8": (None, "amx_int8"),
    "avx512_bf16": ("_is_avx512_bf16_supported", "avx512_bf16"),
    "avx512_vnni": ("_is_vnni_supported", "avx512_vnni"),
    "avx_vnni": (None, "avx_vnni"),
    "avx2": ("_is_avx2_supported", "avx2"),
}


def _cpuinfo_field(cpuinfo: str | Path, name: str) -> str | None:
    """The value of the first ``name : value`` line of a ``/proc/cpuinfo``-style file, or
    ``None`` (no such line, or the file unreadable: not Linux)."""
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == name:
            return value.strip()
    return None


def cpu_features(
    cpuinfo: str | Path = "/proc/cpuinfo", *, use_torch: bool = True
) -> dict[str, bool]:
    """The matrix and vector units of this machine's CPU that decide which precision and which
    kernels are fastest (issue 45, item 4): AMX tiles with their bf16 and int8 instructions,
    AVX-512 BF16, AVX-512 VNNI and AVX-VNNI (int8 dot products), AVX2 (:data:`CPU_FEATURES`).

    Each feature is torch's answer where torch has a helper (``torch.cpu._is_*_supported``,
    which also checks that the operating system enables the unit, e.g. AMX's tile state) and
    the first processor's ``flags`` line of ``cpuinfo`` otherwise, or when ``use_torch`` is
    False, or torch is missing. ``amx_bf16`` / ``amx_int8`` also need ``amx_tile`` to be true.

    Args:
        cpuinfo: a file in ``/proc/cpuinfo``'s format (a missing file: no flags).
        use_torch: ask torch's helpers first.

    Returns:
        Feature name → whether the CPU has it, in :data:`CPU_FEATURES`'s order.
    """
    flags = set((_cpuinfo_field(cpuinfo, "flags") or "").split())
    cpu = None
    if use_torch:
        try:
            import torch

            cpu = torch.cpu
        except ImportError:
            cpu = None
    out: dict[str, bool] = {}
    for name, (helper, flag) in CPU_FEATURES.items():
        check = getattr(cpu, helper, None) if cpu is not None and helper else None
        out[name] = bool(check()) if check is not None else flag in flags
    for name in ("amx_bf16", "amx_int8"):
        out[name] = out[name] and out["amx_tile"]
    return out


def cpu_model(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The CPU's model name (``model name`` of ``cpuinfo``; else :func:`platform.processor`,
    else ``"unknown CPU"``)."""
    import platform

    return _cpuinfo_field(cpuinfo, "model name") or platform.processor() or "unknown CPU"


def describe_cpu(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """One line naming the CPU and its features, for a benchmark's header: ``"<model> (family
    F, model M); N logical CPUs; amx_tile no, ..., avx2 yes"``. Family and model tell the
    generation where the name does not (a virtual machine's ``AMD EPYC``: family 25 is Zen 3
    and Zen 4, 26 Zen 5)."""
    family, model = _cpuinfo_field(cpuinfo, "cpu family"), _cpuinfo_field(cpuinfo, "model")
    name = cpu_model(cpuinfo)
    if family is not None and model is not None:
        name += f" (family {family}, model {model})"
    features = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in cpu_features(cpuinfo).items())
    return f"{name}; {os.cpu_count()} logical CPUs; {features}"
