"""Finding and running ``tritonserver`` on a model repository: environment, ports, readiness, shutdown.

The binary may be a regular Triton install (``bin/tritonserver`` beside ``backends/python`` holding the
backend stub) or the one bundled in the ``nvidia-pytriton`` wheel, whose Python-backend stubs sit per
Python version in ``python_backend_stubs/X.Y``; for that layout a backend folder is assembled in a temp
dir with the stub of this interpreter. The stub embeds Python, so this interpreter's shared libpython
goes first on LD_LIBRARY_PATH (else the stub picks up the system one) and ``sys.path`` reaches it
through PYTHONPATH (so a virtualenv's packages, pointpillars_trt among them, are found).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.util
import ipaddress
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from ...errors import BackendError, InputError, safe_repr
from ...file_writes import owned_prefix, remove_stale_folders
from .repository import MODEL_NAME

STUB = "triton_python_backend_stub"
#: tritonserver's --exit-timeout-secs unless told: seconds a stopped server waits for its requests (``serve
#: --exit-timeout-secs``).
DEFAULT_EXIT_TIMEOUT = 8
#: Seconds past its exit timeout that a stopped server gets to end itself before ``stop`` kills it.
EXIT_GRACE = 2
#: How to get a tritonserver binary without touching this environment: installing nvidia-pytriton here
#: would pull in PyTriton's numpy<2 pin, and the backend stub then crashes on the first request.
INSTALL_STEPS = ("unpack NVIDIA's wheel into a folder of its own with "
                 "`pip install --no-deps --target DIR nvidia-pytriton` and pass --tritonserver "
                 "DIR/pytriton/tritonserver/bin/tritonserver (or set $PP_TRITONSERVER, or put a Triton "
                 "install's tritonserver on PATH); do not install nvidia-pytriton into this environment: "
                 "its numpy<2 pin breaks the model's Python backend")
INSTALL_ADVICE = "tritonserver not found: " + INSTALL_STEPS
_SHM = Path("/dev/shm")
PYTHON_BACKEND_FILES = ("libtriton_python.so", "triton_python_backend_utils.py")


@dataclass(frozen=True)
class TritonInstall:
    """Where the pieces of one Triton install are."""

    binary: Path
    backends: Path           # --backend-directory, or the folder the Python backend is copied from
    stub: Path | None        # a per-Python-version stub to put in place (pytriton layout); None: already there
    libs: tuple[Path, ...]   # folders of the server's own shared libraries


def find_tritonserver(explicit: str | None = None) -> TritonInstall:
    """``explicit``, else $PP_TRITONSERVER, else ``tritonserver`` on PATH, else the nvidia-pytriton one."""
    candidate = explicit or os.environ.get("PP_TRITONSERVER") or shutil.which("tritonserver")
    # where the path came from: a stale $PP_TRITONSERVER is easily forgotten, so the error names it
    source = "--tritonserver" if explicit else "$PP_TRITONSERVER" if os.environ.get("PP_TRITONSERVER") \
        else "tritonserver"
    if candidate is None:
        spec = importlib.util.find_spec("pytriton")
        if spec is None or not spec.submodule_search_locations:
            raise BackendError(INSTALL_ADVICE)
        candidate = os.path.join(list(spec.submodule_search_locations)[0], "tritonserver", "bin", "tritonserver")
    binary = Path(candidate).resolve()
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        raise BackendError(f"{source} {safe_repr(candidate)}: not an executable file; give the tritonserver binary of a "
                           f"Triton install, or get one: {INSTALL_STEPS}")
    root = binary.parent.parent
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    python_backend = root / "backends" / "python"
    stub: Path | None = None
    if not (python_backend / STUB).is_file():
        stub = root / "python_backend_stubs" / version / STUB
        if not stub.is_file():
            raise BackendError(f"tritonserver {binary}: no Python-backend stub for Python {version} "
                               f"(looked in {python_backend} and {stub.parent})")
    libs = tuple(p for p in (root / "lib", root.parent.parent / "nvidia_pytriton.libs") if p.is_dir())
    return TritonInstall(binary, root / "backends", stub, libs)


class StartCancelled(Exception):
    """The caller's stop event was set while the server was starting (Ctrl-C, SIGTERM)."""


def port_in_use(host: str, number: int) -> bool:
    """Whether something already listens on ``host:number`` (a server there would answer our readiness
    checks while ours fails to bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free to bind
        try:
            sock.bind((host, number))
        except OSError:
            return True
    return False


def check_bind_host(host: str, option: str = "--host") -> str:
    """The numeric IPv4 address the endpoints bind to for ``host``: a host name (``localhost``) resolved,
    since tritonserver's HTTP and metrics endpoints take numeric addresses only (given a name they listened
    nowhere reachable and the start waited out its timeout). Refuses, in one line naming ``option``, an
    address the endpoints could not bind to (checked before a repository is written or a server started)."""
    try:
        address = str(ipaddress.IPv4Address(host))
    except ValueError:
        try:
            address = str(socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0])
        except (OSError, UnicodeError) as exc:
            raise InputError(f"{option} {host!r}: not an IPv4 address, nor a name of one ({exc}); give an address of "
                             "this machine: 127.0.0.1 (this machine only), 0.0.0.0 (every interface) or one of its "
                             "own") from None
    try:
        free_port(address)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise InputError(f"{option} {host!r}: cannot bind there ({reason}); give an address of this machine: "
                         "127.0.0.1 (this machine only), 0.0.0.0 (every interface) or one of its own") from None
    return address


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS has just handed out on ``host`` (closed again: a tiny race, fine for local use)."""
    return free_ports(host, 1)[0]


def free_ports(host: str, count: int, avoid: Collection[int] = ()) -> list[int]:
    """``count`` distinct ports the OS has just handed out on ``host``, none of ``avoid``: each held open until
    all are picked (ports picked one after another, each closed at once, can come back the same: a server
    then refuses to listen for two endpoints on one port), then closed again (a tiny race, fine for local use)."""
    with contextlib.ExitStack() as held:
        ports: list[int] = []
        while len(ports) < count:
            sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
            if port not in avoid:
                ports.append(port)
        return ports


def _interpreter_libdir() -> str:
    """The folder of this interpreter's shared libpython, which the backend stub must load."""
    if not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        raise BackendError(f"Python {sys.executable} is built without a shared libpython; Triton's Python "
                           "backend needs one (e.g. pyenv with PYTHON_CONFIGURE_OPTS=--enable-shared)")
    return str(sysconfig.get_config_var("LIBDIR"))


def _end_with_parent(parent: int) -> None:
    """In the server's process before it runs: SIGTERM it when the thread that started it ends, so that a
    serve killed with SIGKILL (the OOM killer, ``kill -9``) leaves no server and stubs running, their ports
    and shared memory held, as orphans of init. ``prctl`` was looked up before the fork; a ``parent`` gone
    before it took effect ends the server here."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os._exit(1)


_PR_SET_PDEATHSIG = 1
_PRCTL = ctypes.CDLL(None).prctl if sys.platform.startswith("linux") else None


def _answers(url: str) -> bool:
    """Whether a GET of ``url`` answers 200 within a second (refused, reset or timed out: not yet)."""
    try:
        with urllib.request.urlopen(url, timeout=1.0) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def refuse_busy_ports(host: str, http_host: str, http_port: int | None, grpc_port: int | None,
                      metrics_port: int | None) -> None:
    """BackendError naming the first option whose port (None: not given) something already listens on: the
    HTTP endpoint's on ``http_host``, the others on ``host``."""
    for option, address, number in (("--http-port", http_host, http_port), ("--grpc-port", host, grpc_port),
                                    ("--metrics-port", host, metrics_port)):
        if number is not None and port_in_use(address, number):
            raise BackendError(f"{option} {number}: something already listens on {address}:{number} (another "
                               "server?); pick another port, or leave the option out for a free one")


class ServerExited(BackendError):
    """tritonserver ended before it was ready (the message: its exit code and the log's tail)."""


class TritonServer:
    """One ``tritonserver`` process on a repository; ``start`` returns once the server is ready.

    A context manager: leaving it stops the server (SIGTERM, then SIGKILL of its process group after
    ``stop_timeout`` seconds). ``exit_timeout``: tritonserver's --exit-timeout-secs, how long after a stop's SIGTERM
    it waits for the requests queued or running and for its models to unload before it ends itself with exit code 1
    (``stop_timeout`` is ``EXIT_GRACE`` seconds longer: its time to exit). ``log`` is a file for the server's output
    (None: this process's own).
    ``end_with_parent``: the server gets SIGTERM when the thread that started it ends, this process killed
    included (``serve`` starts it from its main thread; a server started from a short-lived thread must not).
    ``http_host``: where the HTTP endpoint binds (default ``host``): Triton allocates an HTTP request's JSON
    data by its declared shape, and a huge one aborts the server, so a server that untrusted clients reach
    may keep HTTP (which its readiness check and ``serve``'s probe use) on loopback and serve gRPC on ``host``.
    ``model``: the one model of the repository to serve (None: every model folder in it, as tritonserver serves a
    repository). tritonserver then runs on a repository of its own (a temp folder whose one entry links to that
    model's folder), so that another model folder in ``repository`` is never loaded (one that failed to load
    stopped the server, or kept it from ever being ready), and Triton's load and unload requests stay refused
    (its explicit model control would take them, and a load request may carry a model's code).
    """

    def __init__(self, repository: str | os.PathLike[str], *, install: TritonInstall, host: str = "127.0.0.1",
                 http_host: str | None = None, http_port: int | None = None, grpc_port: int | None = None,
                 metrics_port: int | None = None, log: str | os.PathLike[str] | None = None,
                 exit_timeout: int = DEFAULT_EXIT_TIMEOUT, end_with_parent: bool = False,
                 model: str | None = None) -> None:
        self.repository = Path(repository)
        self.model = model
        self.end_with_parent = end_with_parent
        self.install = install
        self.host = host
        self.http_host = http_host or host
        if not http_port and self.http_host != host:  # a port free where HTTP binds
            http_port = free_ports(self.http_host, 1, avoid=[port for port in (grpc_port, metrics_port) if port])[0]
        given = [port for port in (http_port, grpc_port, metrics_port) if port]
        picked = iter(free_ports(host, 3 - len(given), avoid=given))
        self.http_port = http_port or next(picked)
        self.grpc_port = grpc_port or next(picked)
        self.metrics_port = metrics_port or next(picked)
        # the endpoints whose port was picked here (not given): picked again when another process took it
        self._picked = [name for name, port in (("http_port", http_port), ("grpc_port", grpc_port),
                                                ("metrics_port", metrics_port)) if not port]
        self.log = Path(log) if log is not None else None
        self.exit_timeout = exit_timeout
        #: how the last ``stop`` saw the server end: the seconds from its SIGTERM to the exit (None: the server had
        #: ended before, or never started), and whether it was still running at ``stop_timeout``, so killed
        self.stop_seconds: float | None = None
        self.killed_at_stop = False
        self.process: subprocess.Popen[bytes] | None = None
        self._scratch: str | None = None
        # the Python backend's shared-memory regions get this prefix, so that ``stop`` can remove
        # what a crashed server left in /dev/shm (and nothing of any other server)
        self.shm_prefix = f"pointpillars_trt_{os.getpid()}_{secrets.token_hex(4)}_"

    @property
    def endpoints(self) -> dict[str, str]:
        return {"http": f"{self.http_host}:{self.http_port}", "grpc": f"{self.host}:{self.grpc_port}",
                "metrics": f"http://{self.host}:{self.metrics_port}/metrics"}

    def command(self, backend_dir: Path, served: Path | None = None) -> list[str]:
        """tritonserver's command line; ``served``: the repository it runs on (default: ``repository``)."""
        return [str(self.install.binary), f"--model-repository={served or self.repository.resolve()}",
                f"--backend-directory={backend_dir}", f"--http-address={self.http_host}", f"--http-port={self.http_port}",
                f"--grpc-address={self.host}", f"--grpc-port={self.grpc_port}",
                f"--metrics-address={self.host}", f"--metrics-port={self.metrics_port}",
                f"--exit-timeout-secs={self.exit_timeout}",
                f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
                # a pooled gRPC request keeps the capacity of the largest body it ever held: with a pool,
                # a flood of oversized (refused) requests left ~0.3 GB resident for good
                "--grpc-infer-allocation-pool-size=0"]

    @property
    def stop_timeout(self) -> int:
        """Seconds ``stop`` waits after its SIGTERM before it kills the server: its exit timeout and its time to exit."""
        return self.exit_timeout + EXIT_GRACE

    def check_ports(self) -> None:
        """Refuse a port something already listens on (BackendError naming its option)."""
        refuse_busy_ports(self.host, self.http_host, self.http_port, self.grpc_port, self.metrics_port)

    def start(self, timeout: float = 120.0, stop: threading.Event | None = None) -> TritonServer:
        """Start the server and wait until HTTP says ready and the metrics endpoint answers (BackendError with the
        log's tail if the server exits or is not ready within ``timeout`` seconds; a port something already listens
        on is refused first). ``stop`` set meanwhile stops the server and raises StartCancelled. A port picked here
        (not given) that another process took before tritonserver bound it (it binds them once its models are loaded,
        seconds later) is picked again, at the start and once after a server that exited before it was ready."""
        deadline = time.monotonic() + timeout
        self._pick_again_taken_ports()
        self.check_ports()
        retried = False
        while True:
            remove_stale_folders(tempfile.gettempdir(), SCRATCH_PREFIX)  # of serves killed before they removed theirs
            self._scratch = tempfile.mkdtemp(prefix=owned_prefix(SCRATCH_PREFIX))
            try:  # the scratch folder goes on any failure: a caller's ``with`` never reaches __exit__ when this raises
                self.process = self._launch(Path(self._scratch))
                self._wait_ready(deadline, timeout, stop)
                return self
            except BaseException as exc:
                self.stop()
                if retried or not isinstance(exc, ServerExited) or not self._pick_again_taken_ports():
                    raise
                retried = True

    def _pick_again_taken_ports(self) -> bool:
        """Pick again each port picked here that something now listens on; whether there was one."""
        taken = False
        for name in self._picked:
            host = self.http_host if name == "http_port" else self.host
            if port_in_use(host, getattr(self, name)):
                setattr(self, name, free_ports(host, 1, avoid=[self.http_port, self.grpc_port, self.metrics_port])[0])
                taken = True
        return taken

    def _launch(self, scratch: Path) -> subprocess.Popen[bytes]:
        """tritonserver started on ``scratch`` (its backend folder, and the one-model repository)."""
        backend_dir = self._backend_dir(scratch)
        served = None
        if self.model is not None:  # a repository of the one model: a link to its folder
            served = scratch / "models"
            served.mkdir()
            (served / self.model).symlink_to(self.repository.resolve() / self.model, target_is_directory=True)
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            [_interpreter_libdir(), *map(str, self.install.libs), *filter(None, [env.get("LD_LIBRARY_PATH")])])
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
        env["PYTHONPATH"] = os.pathsep.join(p for p in [*sys.path, env.get("PYTHONPATH", "")] if p)
        # glibc raises its mmap threshold after each large free, so request bodies then come from the
        # heap and stay resident after they are freed; a fixed threshold hands them back to the OS. It
        # costs page faults (a profile: 151 a camera-view frame in the server against 62 at 1 MiB), but at
        # 1 MiB a flood of refused 32 MiB requests, read in growing pieces, left 171 MiB resident
        env.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")
        out = open(self.log, "ab") if self.log is not None else None  # noqa: SIM115 - handed to the child
        try:
            return subprocess.Popen(self.command(backend_dir, served), env=env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT if out else None,
                                    start_new_session=True,
                                    preexec_fn=functools.partial(_end_with_parent, os.getpid())
                                    if self.end_with_parent else None)
        finally:
            if out is not None:
                out.close()

    def _backend_dir(self, scratch: Path) -> Path:
        """The install's backends folder, or (pytriton layout) a copy of its Python backend with the stub."""
        if self.install.stub is None:
            return self.install.backends
        python = scratch / "backends" / "python"
        python.mkdir(parents=True)
        for name in PYTHON_BACKEND_FILES:
            (python / name).symlink_to(self.install.backends / "python" / name)
        (python / STUB).symlink_to(self.install.stub)
        return python.parent

    def _wait_ready(self, deadline: float, timeout: float, stop: threading.Event | None) -> None:
        """Until HTTP's /v2/health/ready and the metrics endpoint both answer, by ``deadline`` (``time.monotonic``;
        ``timeout``: the start's seconds, as the refusal says them). tritonserver starts its endpoints one
        after another once its models are loaded, gRPC, HTTP, then metrics: HTTP says ready before the metrics
        endpoint listens (tens of ms later on a busy host), and a scrape right after the start was refused."""
        waiting = [("HTTP", f"http://{self.http_host}:{self.http_port}/v2/health/ready"),
                   ("metrics", self.endpoints["metrics"])]
        while time.monotonic() < deadline:
            assert self.process is not None
            if stop is not None and stop.is_set():
                raise StartCancelled()
            code = self.exit_code()
            if code is not None:
                others = other_models_note(self.repository) if self.model is None else ""
                raise ServerExited(f"tritonserver exited with code {code} before it was ready"
                                   + self._log_tail() + others)
            while waiting and _answers(waiting[0][1]):
                waiting.pop(0)
            if not waiting:
                return
            time.sleep(0.2)
        name, url = waiting[0]
        raise BackendError(f"tritonserver on {self.http_host}:{self.http_port} not ready after {timeout:g} s (its "
                           f"{name} endpoint {url} did not answer; a large model or a busy host may need a longer "
                           "--ready-timeout)" + self._log_tail())

    def _log_tail(self) -> str:
        if self.log is None or not self.log.is_file():
            return ""
        errors = [line for line in self.log.read_text(errors="replace").splitlines()
                  if line.startswith("E") or "rror" in line]
        return f" (last error in {self.log}: {errors[-1].strip()[:300]})" if errors else f" (see {self.log})"

    def exit_code(self) -> int | None:
        """The server's exit code once it has ended (a signal's as -N, as Popen's), else None; the ended
        server is not reaped, so that its process group's id stays its own until ``stop`` kills the group."""
        assert self.process is not None
        if self.process.returncode is not None:
            return self.process.returncode
        try:
            ended = os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped already (SIGCHLD ignored by whoever started this process): as Popen
            self.process.returncode = 0
            return 0
        if ended is None:
            return None
        return ended.si_status if ended.si_code == os.CLD_EXITED else -ended.si_status

    def signal(self, signum: int) -> None:
        """``signum`` to the server while it runs; sent by pid (Popen's own send would reap a server that has
        just ended, before ``stop`` kills its group)."""
        if self.process is not None and self.exit_code() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signum)

    def stop(self) -> int | None:
        """SIGTERM, wait up to ``stop_timeout`` s, then SIGKILL the server's process group (its backend
        stubs with it). Returns the exit code, and notes how the exit came (``stop_seconds``, ``killed_at_stop``: a
        code the server chose, or the kill's); removes the temp backend folder. A server that ended on its
        own (crashed, killed) may have left stubs behind (an orphaned stub kept running, holding the serve
        command's output pipes): the group is killed before the server is reaped, while its id cannot be
        another process's (unless the server was reaped elsewhere: then only what it left is cleaned up)."""
        code = None
        self.stop_seconds, self.killed_at_stop = None, False
        if self.process is not None:
            if self.process.returncode is None:
                if self.exit_code() is None:
                    sent = time.monotonic()
                    self.signal(signal.SIGTERM)
                    while self.exit_code() is None and time.monotonic() < sent + self.stop_timeout:
                        time.sleep(0.05)
                    self.stop_seconds, self.killed_at_stop = time.monotonic() - sent, self.exit_code() is None
                with contextlib.suppress(ProcessLookupError, PermissionError):  # none left: the usual case
                    os.killpg(self.process.pid, signal.SIGKILL)
            code = self.process.wait()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
        for region in self.shm_regions():
            region.unlink(missing_ok=True)
        return code

    def shm_regions(self) -> list[Path]:
        """The shared-memory regions of this server's Python-backend stubs now in /dev/shm."""
        return sorted(_SHM.glob(f"{self.shm_prefix}*")) if _SHM.is_dir() else []

    def __enter__(self) -> TritonServer:
        return self.start() if self.process is None else self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


#: A server's temp folder (its backend folder, its one-model repository): ``pp-triton-<pid>-<host>-XXXX`` in the
#: temp dir (``owned_prefix``)
SCRATCH_PREFIX = "pp-triton-"


def other_models_note(repository: Path) -> str:
    """'; the repository also holds ...' when it holds folders besides serve's model: a server of the whole
    repository (no ``model``) loads every model folder of it, and one that fails to load stops it, which its exit
    code alone hides."""
    try:
        others = sorted(e.name for e in os.scandir(repository) if e.is_dir() and e.name != MODEL_NAME
                        and not e.name.startswith("."))
    except OSError:
        return ""
    if not others:
        return ""
    shown = ", ".join(safe_repr(name) for name in others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
    return (f"; the repository also holds {shown}, which tritonserver loads as models too, and a folder that "
            "fails to load stops it: move them away, or give serve a --repository of its own")
