"""A process whose kernel refuses flock(2) with ENOLCK, as an NFS mount without its lock daemon does: a seccomp
filter on the real system call (every local file system of a test machine supports flock)."""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

#: flock's system call number and the seccomp audit architecture, by machine.
_FLOCK = {"x86_64": (73, 0xC000003E), "aarch64": (32, 0xC00000B7)}
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_LD_ABS, _JEQ, _RET = 0x20, 0x15, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000


def skip_reason() -> str | None:
    """Why this machine cannot refuse flock so (None: it can)."""
    if platform.system() != "Linux" or platform.machine() not in _FLOCK:
        return f"a seccomp filter of flock is written for Linux on {', '.join(_FLOCK)} only"
    return None


def refuse_flock() -> None:
    """From now on, flock(2) of this process (and its children) fails with ENOLCK; nothing else changes."""
    number, arch = _FLOCK[platform.machine()]
    program = [(_LD_ABS, 0, 0, 4),            # seccomp_data.arch
               (_JEQ, 0, 3, arch),            # another architecture's call: allowed
               (_LD_ABS, 0, 0, 0),            # seccomp_data.nr
               (_JEQ, 0, 1, number),
               (_RET, 0, 0, _ERRNO | errno.ENOLCK),
               (_RET, 0, 0, _ALLOW)]
    code = b"".join(struct.pack("HBBI", *instruction) for instruction in program)
    buffer = ctypes.create_string_buffer(code, len(code))
    fprog = ctypes.create_string_buffer(struct.pack("HP", len(program), ctypes.addressof(buffer)))  # sock_fprog
    libc = ctypes.CDLL(None, use_errno=True)
    for args in ((_PR_SET_NO_NEW_PRIVS, 1), (_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(fprog))):
        if libc.prctl(*(ctypes.c_ulong(a) for a in (*args, 0, 0, 0)[:5])) != 0:
            raise OSError(ctypes.get_errno(), "prctl for a seccomp filter of flock failed")
