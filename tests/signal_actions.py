"""A signal's C-level disposition (handler address and ``sa_flags``) as the kernel holds it, through
glibc's ``sigaction``: what ``signal.getsignal`` cannot show (a library may swap its own handler in and
back). Linux x86-64 and AArch64 layout: handler, a 128-byte mask, int flags, restorer."""

from __future__ import annotations

import ctypes
import sys

SA_RESTART = 0x10000000


class _SigAction(ctypes.Structure):
    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ubyte * 128), ("flags", ctypes.c_int),
                ("restorer", ctypes.c_void_p)]


def available() -> bool:
    return sys.platform.startswith("linux")


def action(signum: int) -> tuple[int, int]:
    """(handler address, flags) of ``signum`` now."""
    current = _SigAction()
    if ctypes.CDLL(None, use_errno=True).sigaction(signum, None, ctypes.byref(current)) != 0:
        raise OSError(ctypes.get_errno(), "sigaction")
    return current.handler or 0, current.flags


def set_flags(signum: int, flags: int) -> None:
    """Re-install ``signum``'s current handler with ``flags`` (as a library restoring it with signal() does)."""
    libc = ctypes.CDLL(None, use_errno=True)
    current = _SigAction()
    libc.sigaction(signum, None, ctypes.byref(current))
    current.flags = flags
    if libc.sigaction(signum, ctypes.byref(current), None) != 0:
        raise OSError(ctypes.get_errno(), "sigaction")
