"""Range-checked command-line values: each option says what it accepts, and anything outside (a negative
count, a port past 65535, a NaN timeout, an empty path) is refused while the command line is parsed."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from ..errors import PointPillarsError, printable_text


def int_in(low: int, high: int | None) -> Callable[[str], int]:
    """An argparse ``type`` for integers in ``low..high`` (``high`` None: ``low`` or more)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low or (high is not None and value > high):
            expected = f"an integer in {low}..{high}" if high is not None else f"an integer of {low} or more"
            raise argparse.ArgumentTypeError(f"{text!r}: expected {expected}")
        return value

    return parse


def float_in(low: float, high: float, *, low_open: bool = False) -> Callable[[str], float]:
    """An argparse ``type`` for finite numbers in ``[low, high]`` (``(low, high]`` with ``low_open``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        above = value > low if low_open else value >= low
        if not (math.isfinite(value) and above and value <= high):
            interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
            raise argparse.ArgumentTypeError(f"{text!r}: expected a number in {interval}")
        return value

    return parse


def int_list_in(low: int, high: int) -> Callable[[str], list[int]]:
    """An argparse ``type`` for a comma-separated list of integers in ``low..high`` ("1,2,4"), given back distinct and
    ascending: a value given twice would be measured twice, and the last one is the largest ("8,1" too)."""
    one = int_in(low, high)

    def parse(text: str) -> list[int]:
        return sorted({one(item.strip()) for item in text.split(",")})

    return parse


def names_in(choices: tuple[str, ...]) -> Callable[[str], list[str]]:
    """An argparse ``type`` for a comma-separated list of names out of ``choices`` ("fp32,fp16"), each once, in the
    order given."""

    def parse(text: str) -> list[str]:
        names = list(dict.fromkeys(item.strip() for item in text.split(",")))
        unknown = [name for name in names if name not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"{unknown[0]!r}: expected names out of {', '.join(choices)}, "
                                             "separated by commas")
        return names

    return parse


#: TCP ports a server may bind or a client may reach (0, "any free port", is what leaving it out means).
port = int_in(1, 65535)


#: tritonserver's own ports where it is not told others (a URL without its port names these)
TRITON_PORTS = {"http": 8000, "grpc": 8001}


def host_port(text: str) -> str:
    """An argparse ``type`` for HOST:PORT (a server address): without its port a client would try a
    default one (gRPC's 443) and report the server as unreachable."""
    scheme, sep, rest = text.partition("://")
    if sep:  # a URL, as Triton's docs and clients write a server: the protocol is an option of its own
        address = printable_text(rest.split("/", 1)[0]) or "HOST:PORT"  # the fix's address: one line whatever was given
        protocol = {"http": "http", "grpc": "grpc"}.get(scheme.lower())
        if scheme.lower() in ("https", "grpcs"):
            raise argparse.ArgumentTypeError(f"{text!r}: the client speaks no TLS: give the server's plain HTTP or "
                                             "gRPC endpoint as HOST:PORT without a scheme, and its protocol with "
                                             "--protocol, e.g. --server 127.0.0.1:8001 --protocol grpc")
        if rest.split("/", 1)[0] and (address.endswith("]") or ":" not in address):  # no port: Triton's defaults
            fix = (f"--server {address}:{TRITON_PORTS[protocol]} --protocol {protocol}" if protocol else
                   f"--server {address}:{TRITON_PORTS['grpc']} --protocol grpc, or --server "
                   f"{address}:{TRITON_PORTS['http']} --protocol http")
        else:
            fix = f"--server {address} " + (f"--protocol {protocol}" if protocol else "and --protocol grpc or http")
        raise argparse.ArgumentTypeError(f"{text!r}: give HOST:PORT without a scheme, and the protocol with "
                                         f"--protocol: {fix}")
    host, _, number = text.rpartition(":")
    if ":" in host and not text.startswith("["):  # ::1:8001 reads as ::0.1.128.1
        raise argparse.ArgumentTypeError(f"{text!r}: an IPv6 address goes in brackets before its port, e.g. "
                                         "[::1]:8001")
    try:
        if host and number.isdigit():  # digits only: int() would also take "+80" or "8_001"
            port(number)
            return text
    except argparse.ArgumentTypeError:
        pass
    raise argparse.ArgumentTypeError(f"{text!r}: expected HOST:PORT, e.g. 127.0.0.1:8001 (serve prints its grpc "
                                     "and http endpoints when it is ready)")


def path_name(text: str) -> str:
    """An argparse ``type`` for a file or folder option: an empty name (``--out "$OUT"`` with $OUT unset) is
    refused, since ``Path("")`` is the current folder, where demo, bench and serve would write and build and
    eval would read, each naming '.' in its messages."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: an empty name (an unset variable?); name the file or folder")
    return text


def device_arg(text: str) -> str:
    """An argparse ``type`` for a device: auto, cpu, cuda or cuda:N (the text itself is kept)."""
    from ..runtime_options import devices_expected, parse_device

    try:
        parse_device(text)
    except PointPillarsError:
        raise argparse.ArgumentTypeError(f"{text!r}: {devices_expected(text)}") from None
    return text


#: An argparse ``type`` for a thread count, 1 or more: more than the cores where the detector runs (this machine's,
#: or a Ray worker's) is capped to them there, with a note (``runtime_options_from_args``).
threads_arg = int_in(1, None)


def image_shape_arg(text: str) -> tuple[int, int]:
    """``H,W`` only: ``1242x375`` is how an image's size is usually written (width first), so a form
    with an ``x`` would be read the wrong way round as often as not, and is refused."""
    if "x" in text.lower():
        raise argparse.ArgumentTypeError(f"{text!r}: expected HEIGHT,WIDTH in pixels, e.g. 375,1242 for KITTI "
                                         "(not WIDTHxHEIGHT)")
    try:
        height, width = (int(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected HEIGHT,WIDTH in pixels, e.g. 375,1242") from None
    from ..kitti import MAX_IMAGE_SIDE

    if not (1 <= height <= MAX_IMAGE_SIDE and 1 <= width <= MAX_IMAGE_SIDE):
        raise argparse.ArgumentTypeError(f"{text!r}: height and width must be positive, at most {MAX_IMAGE_SIDE} "
                                         "pixels")
    return height, width
