"""``pointpillars-trt build | infer | eval | bench | serve | demo``: thin commands over the package API.

Every user error (a bad file, config, model or option, a refusing file system, input nested too
deeply, memory running out) ends in one ``error:`` line and exit code 2, never a traceback; in a
batch, each failed frame gets its own ``error:`` line, the others still get their outputs, and the
exit code is 1. Ctrl-C exits with 130, SIGTERM with 143, both after cleaning up as a normal end does.
A stdout whose reader has gone (``| head -1``), or that was closed from the start (``>&-``), ends in no
error line: the run goes on writing its files and exits 1 (see ``_StdoutGuard``). A stderr closed from the start
(``2>&-``) takes the run's messages to /dev/null; the run and its exit code are as with one open.
"""

from __future__ import annotations

import argparse
import functools
import glob
import itertools
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from ..errors import (
    USER_ERRORS, CpuFallbackWarning, InputError, InputErrors, InputWarning, Notice, PointPillarsError, PrecisionWarning,
    agree, one_line, printable_text, safe_repr, shell_word,
)
from ..model_dir import package_version
from ..pointcloud_io import SUPPORTED_EXTENSIONS
from ..runtime.backends import BACKEND_CHOICES, BACKEND_NAMES, BACKENDS
from ..stop_signals import interrupt_behind
from .exit_codes import EXIT_CLOSED_STDOUT, EXIT_FRAME_FAILURES, EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_USER_ERROR
from .demo import DEFAULT_REPEATS, MAX_REPEATS
from .infer import add_infer_parser
from .ranges import device_arg, int_in, path_name

__all__ = ["EXIT_FRAME_FAILURES", "EXIT_INTERRUPTED", "EXIT_USER_ERROR", "build_parser", "main"]


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that a run stops as on Ctrl-C: temp files and folders
    removed, every output written so far complete."""


class _StopOnce:
    """SIGINT and SIGTERM in the main thread while a command runs: the first raises (KeyboardInterrupt, or
    Terminated) so that the run stops cleanly; a later one while it stops is said once and otherwise ignored,
    since cutting that stop short (an ONNX Runtime session half closed) aborted the process ("terminate
    called", exit 134). Ctrl-\\ (SIGQUIT) still ends it at once."""

    def __init__(self) -> None:
        self.stopping = False
        self.said = False

    def __call__(self, signum: int, _frame: object) -> None:
        if self.stopping:
            if not self.said:  # os.write: a print here could land inside another print of the main thread
                self.said = True
                os.write(2, b"still stopping: finishing the outputs of the frames done (Ctrl-\\ quits at once)\n")
            return
        self.stopping = True
        raise Terminated(signum) if signum == signal.SIGTERM else KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    previous: dict[int, Any] = {}
    args: argparse.Namespace | None = None  # the command's options, once parsed
    stdout = sys.stdout
    guard = _StdoutGuard(stdout)
    quiet: TextIO | None = None  # /dev/null in place of a stderr closed from the start
    if threading.current_thread() is threading.main_thread():  # the process's own run (not a caller's thread)
        stop = _StopOnce()  # a signal ignored by whoever started this process (`cmd &` in a script) stays ignored
        previous = {signum: signal.signal(signum, stop) for signum in (signal.SIGINT, signal.SIGTERM)
                    if signal.getsignal(signum) is not signal.SIG_IGN}
        sys.stdout = guard
        if sys.stderr is None:
            sys.stderr = quiet = _stderr_in_place_of_closed()
    try:
        parser = build_parser()  # in the try: Ctrl-C during its imports (a second or so) is "interrupted", no traceback
        args, extra = parser.parse_known_args(argv)
        if hasattr(args, "paths"):  # `infer a/ --model m b.bin`: paths after the options, as `ls a -l b` takes them
            extra = _paths_after_options(args.paths, extra)
        if extra:
            command = _command_parser(parser, args)
            command.error(f"unrecognized arguments: {' '.join(extra)}{_flag_hints(command, extra)}")
        with warnings.catch_warnings():  # the commands say these in their own lines (running on ..., warning: ...)
            warnings.simplefilter("ignore", CpuFallbackWarning)
            warnings.simplefilter("ignore", InputWarning)
            warnings.simplefilter("ignore", PrecisionWarning)
            # notes are the command's output, whatever -W or PYTHONWARNINGS (a CI's "error") says of warnings
            warnings.simplefilter("default", Notice)
            warnings.showwarning = functools.partial(_show_warning, fallback=warnings.showwarning)
            code = int(args.run(args))
        return code or (EXIT_CLOSED_STDOUT if guard.reader_gone else 0)
    except KeyboardInterrupt as exc:
        return _stopped(exc)
    except BrokenPipeError as exc:
        if guard.reader_gone:  # a run that stopped because stdout was its only output (infer without --out)
            return EXIT_CLOSED_STDOUT
        return _user_error(exc, args)  # another pipe (a served model's connection)
    except USER_ERRORS as exc:
        interrupt = interrupt_behind(exc)
        return _stopped(interrupt) if interrupt is not None else _user_error(exc, args)
    except Exception as exc:  # an error a Ctrl-C caused (a library's import cut short) is that Ctrl-C
        interrupt = interrupt_behind(exc)
        if interrupt is None:
            raise
        return _stopped(interrupt)
    finally:
        if sys.stdout is guard:
            sys.stdout = stdout
        guard.close()
        if quiet is not None and sys.stderr is quiet:
            sys.stderr = None
            quiet.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _paths_after_options(paths: list[str], extra: Sequence[str]) -> list[str]:
    """Move the words argparse left over that are paths (they exist, are glob patterns or name a point file, which
    the run then says is missing; any word after ``--``) into ``paths``; the rest, unknown options and stray
    values (``--fov-only yes``), are returned."""
    left: list[str] = []
    after_dashes = False
    for word in extra:
        if word == "--" and not after_dashes:
            after_dashes = True
        elif after_dashes or (not word.startswith("-") and (os.path.lexists(word) or glob.has_magic(word) or
                                                           word.lower().endswith(SUPPORTED_EXTENSIONS))):
            paths.append(word)
        else:
            left.append(word)
    return left


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the command ``args`` are of (whose ``--help`` lists its options), else ``parser``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found: argparse.ArgumentParser = action.choices.get(str(getattr(args, "command", "")), parser)
            return found
    return parser


#: Other tools' options (OpenPCDet's tools/demo.py and test.py, trtexec's, this package's other commands' names):
#: (an option or argument of the command that takes their place, the hint), the first pair the command has (infer's
#: point files: its PATH argument).
_FOREIGN_OPTIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "--ckpt": (("--checkpoint", "OpenPCDet's --ckpt is --checkpoint here"),
               ("--model", "OpenPCDet's --ckpt is --model here (a .pth, or the model dir build writes)")),
    "--cfg_file": (("--pcdet-config", "OpenPCDet's --cfg_file is --pcdet-config here"),
                   ("--model", "OpenPCDet's --cfg_file goes to build: `pointpillars-trt build --checkpoint CKPT "
                               "--pcdet-config YAML --out MODEL_DIR`, then --model MODEL_DIR")),
    "--data_path": (("PATH", "OpenPCDet's --data_path is the PATH argument here (point files, folders of them "
                                   "or globs)"),),
    "--ext": (("PATH", "--ext is not needed: every .bin, .npy and .pcd file of a folder is read"),),
    "--checkpoint": (("--model", "--checkpoint is --model here (a .pth, or the model dir build writes)"),),
    "--model": (("--checkpoint", "--model is --checkpoint here (the .pth; --out is the model dir to write)"),),
    "--output": (("--out", "--output is --out"), ("--json", "--output is --json here (the AP as JSON)")),
    "-o": (("--out", "-o is --out"), ("--json", "-o is --json here (the AP as JSON)")),
    "--fp16": (("--precision", "trtexec's --fp16 is --precision fp16 here"),
               ("--precisions", "trtexec's --fp16 is --precisions fp16 here")),
    "--gpu": (("--device", "--gpu N is --device cuda:N here"),),
    "--gpus": (("--device", "--gpus N is --device cuda:N here"),),
}


def _flag_hints(command: argparse.ArgumentParser, words: Sequence[str]) -> str:
    """What ``command`` takes in place of the unknown options among ``words`` that other tools take (``--ckpt``),
    of options written with underscores (``--batch_size``), and what an abbreviation begins (``--thr``): "; OpenPCDet's
    --ckpt is --model here; ...; options are written whole: --thr begins --threads", or ""."""
    actions = command._actions
    known = {option for action in actions for option in action.option_strings} | \
        {action.metavar for action in actions if not action.option_strings and isinstance(action.metavar, str)}
    hints, abbreviations = [], []
    for word in dict.fromkeys(word.split("=", 1)[0] for word in words if word.startswith("-")):
        if word in known:
            continue
        hint = next((text for option, text in _FOREIGN_OPTIONS.get(word, ()) if option in known), None)
        if hint is None and word.startswith("--") and word.replace("_", "-") in known:
            hint = f"{word} is {word.replace('_', '-')}"
        begun = sorted(option for option in known if option.startswith(word)) if word.startswith("--") else []
        if hint is not None:
            hints.append(hint)
        elif begun:
            abbreviations.append(f"{word} begins {' and '.join(begun[:3])}{' ...' if len(begun) > 3 else ''}")
    if abbreviations:
        hints.append("options are written whole: " + ", ".join(abbreviations))
    return "; " + "; ".join(hints) if hints else ""


def _stopped(exc: KeyboardInterrupt) -> int:
    """The one line and exit code of a run stopped by Ctrl-C (130) or SIGTERM (143)."""
    print("terminated" if isinstance(exc, Terminated) else "interrupted", file=sys.stderr, flush=True)
    return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED


def _user_error(exc: BaseException, args: argparse.Namespace | None) -> int:
    """One ``error:`` line (one a problem, for several inputs found unusable together); exit code 2. ``args``:
    the command's options (None before they are parsed), for a fix only its options offer."""
    batched = args is not None and hasattr(args, "batch_size") and (
        args.batch_size is not None and args.batch_size > 1 or args.batch_size is None and args.device != "cpu")
    lines = [one_line(m) for m in exc.messages] if isinstance(exc, InputErrors) else [error_message(exc, batched)]
    for line in lines:
        print(f"error: {line}", file=sys.stderr, flush=True)
    return EXIT_USER_ERROR


class _StdoutGuard:
    """``sys.stdout`` while a command runs. When the reader of a pipe goes away (``... | head -1``), the
    rest of what the run prints goes to /dev/null, as Python's documentation recommends for BrokenPipeError
    (https://docs.python.org/3/library/signal.html#note-on-sigpipe), and the run goes on: a run stopped at
    its next print would leave files unwritten (eval's --json, a build's model dir, --eval's report); the
    exit code is then 1, as that note's example has it. SIGPIPE stays ignored (Python's default), since
    dying of it would stop the run mid-way too."""

    def __init__(self, stream: TextIO | None) -> None:
        # a stdout closed from the start (``cmd >&-``: Python's sys.stdout is None) is a reader gone before the
        # first line: what the run prints goes to /dev/null, and the exit code is 1 as above
        self.reader_gone = self.closed_from_start = stream is None
        self.stream: TextIO = stream if stream is not None else open(os.devnull, "w", encoding="utf-8")

    def close(self) -> None:
        """Close the /dev/null opened in place of a stdout closed from the start."""
        if self.closed_from_start:
            self.stream.close()

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            self._to_devnull()
            return len(text)
        except OSError as exc:
            raise _unwritable_stdout(exc) from None

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            self._to_devnull()
        except OSError as exc:
            raise _unwritable_stdout(exc) from None

    def _to_devnull(self) -> None:
        """Point stdout's file descriptor at /dev/null: what is buffered, and the interpreter's flush at
        exit, then go nowhere instead of failing again."""
        self.reader_gone = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self.stream.fileno())
        finally:
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _stderr_in_place_of_closed() -> TextIO:
    """/dev/null for a stderr closed from the start (``cmd 2>&-``: Python's sys.stderr is None), on file descriptor
    2 where that is free: the run's messages go nowhere, as asked, rather than end the run at its first one (an
    error no one could see), and no file the run opens takes descriptor 2, which a stop's line is written to."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    if devnull != 2:
        try:
            os.fstat(2)
        except OSError:  # free: hold it
            os.dup2(devnull, 2)
            os.close(devnull)
            devnull = 2
    return open(devnull, "w", encoding="utf-8")


def _unwritable_stdout(exc: OSError) -> OSError:
    """The error of a stdout that cannot take the run's lines (redirected to a file on a full disk, or to
    /dev/full), named as standard output: its bare reason ("No space left on device") reads as --out's."""
    return OSError(exc.errno, f"standard output cannot be written: {exc.strerror or one_line(exc)}")


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: TextIO | None = None, line: str | None = None, *, fallback: Callable[..., None]) -> None:
    """A ``Notice`` (a library, checkpoint or setting taken otherwise than named) as one ``note:`` line on stderr,
    not a warning with a source line; others as before."""
    if issubclass(category, Notice):
        print(f"note: {one_line(str(message))}", file=sys.stderr, flush=True)
    else:
        fallback(message, category, filename, lineno, file, line)


def error_message(exc: BaseException, batched: bool = False) -> str:
    """One line for an exception ``main`` reports: file names escaped, no errno prefix; ``batched``: the
    command runs frames in batches of more than one (``--batch-size 1`` is then a fix for running out of memory)."""
    if isinstance(exc, OSError) and not isinstance(exc, PointPillarsError):
        reason = exc.strerror or one_line(exc)
        if exc.filename is not None:
            target = f" -> {safe_repr(exc.filename2)}" if exc.filename2 is not None else ""
            return one_line(f"{safe_repr(exc.filename)}{target}: {reason}")
        return one_line(reason)
    if isinstance(exc, RecursionError):
        return "input nested too deeply to process (recursion limit reached); is a file damaged or hostile?"
    if isinstance(exc, MemoryError):
        detail = one_line(exc) if str(exc).strip() else ""
        return "out of memory" + (f" ({detail})" if detail else "") + "; try a smaller input" + (
            " or --batch-size 1" if batched else "")
    return one_line(exc)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, unless its help already says what the default is, the option is required
    (also "required unless ..."), or it is a flag (off unless given: "(default: False)" says nothing)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        # "(default: ...)", "default: ...", "the default ...", "%(default)s"
        if "default" in text or action.required or "required" in text or action.nargs == 0:
            return text
        if action.default is None and action.option_strings:
            return text + " (default: none)"
        return super()._get_help_string(action) or text


class _Parser(argparse.ArgumentParser):
    """Every (sub)command's parser shows defaults, and reports a bad option value or a missing argument
    as one ``error:`` line (exit code 2), like every other user error, not a usage block. Options are taken
    written whole only: an abbreviation (``--thr``) would run as whichever option it begins (``--threads``) without
    a word, another tool's (``--gpu``) as one of ours (``--gpus-per-worker``), and would change meaning as options
    are added; the error names the options it begins."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.words: list[str] = []  # the command line words this parser was given, for error()'s hints

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        self.words = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        if message.startswith("the following arguments are required"):  # `build --model x.pth`: say what --model is
            message += _flag_hints(self, self.words)
        print(f"error: {self.prog}: {one_line(message)}{self._dash_name_hint()} (see {self.prog} --help)",
              file=sys.stderr, flush=True)
        sys.exit(EXIT_USER_ERROR)

    def _dash_name_hint(self) -> str:
        """'; ... is a file ...' when a word given is no option of this parser but names a file or folder that starts
        with '-' (argparse takes such a word for an option: 'unrecognized arguments', or PATH missing), else ''."""
        options = {option for action in self._actions for option in action.option_strings}
        before_dashes = itertools.takewhile(lambda word: word != "--", self.words)  # after --, words are no options
        name = next((word for word in before_dashes if word.startswith("-") and word.split("=", 1)[0] not in options
                     and os.path.lexists(word)), None)
        if name is None:
            return ""
        kind = "folder" if os.path.isdir(name) else "file"
        return (f"; {safe_repr(name)} is a {kind}, but a word starting with '-' is read as an option: name it "
                f"{shell_word(os.path.join('.', name))}")


DESCRIPTION = ("PointPillars lidar 3D object detection on the GPU (CPU fallback): build a model dir from a "
               "checkpoint, infer on point files, eval KITTI AP, bench, serve on Triton, or run the demo.")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pointpillars-trt", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    build = sub.add_parser("build", help="checkpoint -> ONNX graphs (+ a TensorRT plan of the RPN) in a model dir",
                           description="Import a checkpoint and write a model dir (ONNX graphs, with --backend tensorrt a TensorRT "
                                       "plan of the RPN).")
    build.add_argument("--checkpoint", required=True, type=path_name,
                       help="OpenPCDet or zhulf0804 .pth file (required)")
    build.add_argument("--out", required=True, type=path_name, help="model dir to write (required)")
    which = build.add_mutually_exclusive_group()
    which.add_argument("--config", help="config name or YAML path of this package "
                                        "(default: from the checkpoint's layout)")
    which.add_argument("--pcdet-config", metavar="YAML", type=path_name,
                       help="OpenPCDet model config, e.g. tools/cfgs/kitti_models/pointpillar.yaml "
                            "(default: none; exclusive with --config)")
    build.add_argument("--pcdet-base-dir", metavar="DIR", type=path_name,
                       help="OpenPCDet's tools/ folder, where --pcdet-config's _BASE_CONFIG_ paths start (default: "
                            "the nearest folder above the YAML that holds them)")
    build.add_argument("--backend", choices=BACKEND_NAMES, default="onnxruntime",
                       help="the backend the model dir is for: tensorrt also builds TensorRT plans, with TensorRT "
                            "(on and for this GPU) when it imports, else with TensorRT for RTX (no GPU needed; plans "
                            "for RTX GPUs); onnxruntime and cudnn write the same model dir, ONNX graphs only, which "
                            "the cuDNN engine and ONNX Runtime both run (infer's --backend picks)")
    build.add_argument("--precision", choices=("fp32", "fp16"), default="fp32", help="graph (and plan) precision")
    build.add_argument("--no-tf32", action="store_true",
                       help="--backend tensorrt: fp32 plans without TensorFloat-32 (IEEE fp32)")
    build.add_argument("--compute-capability", action="append", metavar="CC",
                       help="TensorRT for RTX: a GPU the plans are for, e.g. 7.5 for Turing (fp16 only); repeat for "
                            "more (default: this GPU when TensorRT for RTX runs on it, else 8.6, 8.9 and 12.0)")
    build.set_defaults(run=_cmd_build)

    infer = add_infer_parser(sub)
    _scaleout_hooks(sub, infer)

    demo = sub.add_parser("demo", help="run the whole path on a simulated frame with a seeded, UNTRAINED model",
                          description="Run the whole path on a SIMULATED frame with a seeded, UNTRAINED model.")
    demo.add_argument("--out", default="demo_out", type=path_name,
                      help="folder for the frame, model, JSON and PNG (default: %(default)s; a folder that holds "
                           "point files is refused: the simulated frame would join them)")
    demo.add_argument("--config", default="openpcdet_kitti_3class",
                      help="config name or YAML path of a single-head model (a multi-head config, such as "
                           "openpcdet_nuscenes_multihead, is refused: the seeded random weights are made for "
                           "single-head models)")
    demo.add_argument("--seed", type=int_in(0, 2**32 - 1), default=0,
                      help="seed of the scene and of the random weights, 0..4294967295")
    demo.add_argument("--device", type=device_arg, default="auto", help="auto, cpu, cuda or cuda:N")
    demo.add_argument("--backend", choices=BACKEND_CHOICES, default="auto",
                      help="GPU engine backend")
    demo.add_argument("--repeats", type=int_in(1, MAX_REPEATS), default=DEFAULT_REPEATS,
                      help=f"frames run after the first (cold) one for the steady-state times, 1..{MAX_REPEATS} "
                           "(about a second a frame on the CPU)")
    demo.set_defaults(run=_cmd_demo)

    from .eval.cli import add_eval_parser

    add_eval_parser(sub)
    from .bench.cli import add_bench_parser

    add_bench_parser(sub)
    _describe_commands(sub)
    return parser


def _describe_commands(sub: Any) -> None:
    """A command registered without a description gets its one-line help as one, so every
    ``COMMAND --help`` says what the command does."""
    for action in sub._choices_actions:
        command = sub.choices[action.dest]
        if not command.description and action.help:
            command.description = action.help[0].upper() + action.help[1:] + "."


def _scaleout_hooks(sub: Any, infer: argparse.ArgumentParser) -> None:
    """``serve`` and ``infer --server/--ray`` when the serve module is there."""
    try:
        from .serve import cli as serve_cli
    except ImportError:
        return
    serve_cli.add_serve_parser(sub)
    serve_cli.add_scaleout_arguments(infer)

    def run(args: argparse.Namespace) -> int:
        from .infer import run_infer

        return serve_cli.run_scaleout_infer(args) if serve_cli.scaleout_requested(args) else run_infer(args)

    infer.set_defaults(run=run)


def _check_build_options(args: argparse.Namespace) -> None:
    """Refuse, before any work, the TensorRT plan options of a build that makes no plans (they would be ignored)
    and GPUs the plans cannot be built for (else the refusal comes after the ONNX export)."""
    if BACKENDS[args.backend].artefact != "plan":
        given = [option for option, value in (("--compute-capability", args.compute_capability),
                                              ("--no-tf32", args.no_tf32)) if value]
        if given:
            applies, it = agree(len(given), ("applies", "it"), ("apply", "them"))
            raise InputError(f"{' and '.join(given)} {applies} to --backend tensorrt (plans); drop {it} or add "
                             "--backend tensorrt")
    elif args.no_tf32 and args.precision == "fp16":
        raise InputError("--no-tf32 applies to fp32 plans (TensorFloat-32 is a way of running fp32 convolutions); "
                         "fp16 plans have no TF32 to turn off: drop it, or build --precision fp32")
    if BACKENDS[args.backend].artefact == "plan" and args.compute_capability is not None:
        from ..runtime.tensorrt_build import check_targets

        check_targets(args.compute_capability, args.precision, option="--compute-capability")


def _cmd_build(args: argparse.Namespace) -> int:
    from ..convert.export import build_model_dir

    _check_build_options(args)
    config: Any = args.config
    dataset: dict[str, Any] = {}
    if args.config:
        from ..config import build_command, is_pcdet_model_config

        if is_pcdet_model_config(args.config):
            raise InputError(f"--config {safe_repr(args.config)}: an OpenPCDet model config (MODEL, CLASS_NAMES, ...), "
                             "not one of this package's: give it as --pcdet-config, "
                             f"{build_command(args.checkpoint, args.out, pcdet_config=args.config)}")
    if args.pcdet_base_dir and not args.pcdet_config:
        raise InputError("--pcdet-base-dir goes with --pcdet-config (where that YAML's _BASE_CONFIG_ paths start)")
    if args.pcdet_config:
        from ..convert.pcdet_config import config_from_pcdet_yaml, pcdet_dataset_facts

        config = config_from_pcdet_yaml(args.pcdet_config, base_dir=args.pcdet_base_dir)
        dataset = pcdet_dataset_facts(args.pcdet_config, base_dir=args.pcdet_base_dir)
    replaced = _model_dir_summary(args.out)
    model = build_model_dir(args.checkpoint, args.out, config=config, backend=args.backend,
                            precision=args.precision, tf32=not args.no_tf32, dataset=dataset,
                            progress=lambda line: print(line, flush=True),
                            compute_capabilities=args.compute_capability)
    print(f"wrote {printable_text(str(model.path))} ({model.cfg.name}, {args.precision}, {args.backend})")
    if replaced is not None:
        print(f"  (in place of the model dir built there before: {replaced})")
    for name in sorted(p.name for p in Path(model.path).iterdir()):
        print(f"  {name}")
    return 0


def _model_dir_summary(path: str) -> str | None:
    """"config, precision, source" of the model dir at ``path``, which a build there replaces; None if none."""
    from ..model_dir import load_model_dir

    try:
        model = load_model_dir(path)
    except PointPillarsError:
        return None
    source = model.metadata.get("source")
    checkpoint = source.get("checkpoint") if isinstance(source, dict) else None
    return f"{model.cfg.name}, {model.precision}" + (f", from {safe_repr(checkpoint)}" if checkpoint else "")


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(Path(args.out), config=args.config, seed=args.seed, device=args.device,
                    repeats=args.repeats, backend=args.backend)


if __name__ == "__main__":
    sys.exit(main())
