"""The ``npusim`` command: one entry point, a subcommand per job.

Each subcommand lives in its own module ``npusim/cli/<name>.py`` exposing
``add_parser(subparsers)`` (registers the parser with its --help) and
``run(args) -> int`` (exit code). Errors that are the user's input
(:class:`~npusim.errors.NpusimError`) are printed as one line, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
from pathlib import Path

from npusim import __version__
from npusim.errors import NpusimError
from npusim.files import check_output_dir, completed_sets, remove_partials

SUBCOMMANDS = ("run", "replay", "plan", "info", "gemm", "mem", "noc", "collective", "fabric", "model", "sweep",
               "report", "validate", "calibrate")


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one line naming the flag (its subparsers are too)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="npusim",
        description="Simulate multi-core NPUs (systolic arrays, SRAM, 2D-mesh NoC, HBM) running LLMs.",
    )
    parser.add_argument("--version", action="version", version=f"npusim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"npusim.cli.{name}")
        cmd = module.add_parser(sub)
        cmd.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help or --version (0), or a usage error already printed in one line (2)
        return exc.code if isinstance(exc.code, int) else 0
    if args.command is None:
        parser.print_help()
        return 0
    out = args.out if isinstance(getattr(args, "out", None), Path) and not getattr(args, "out_is_file", False) else None
    created = out is not None and not out.exists()
    _terminate_like_interrupt()
    if not _quiet(args):
        from npusim._jitcache import set_compile_notice

        set_compile_notice(_compile_notice)
    done_before = len(completed_sets)
    try:
        if out is not None:
            check_output_dir(out)  # before a long run, not after it
            remove_partials(out)  # what a killed run (SIGKILL) left half-written
        from npusim.cli.progress import heartbeat

        with heartbeat(args.command, enabled=not _quiet(args)):
            return int(args._run(args) or 0)
    except NpusimError as exc:
        _remove_if_empty(out if created else None)
        print(f"npusim {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `npusim mem | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        _remove_if_empty(out if created else None)
        print(f"npusim {args.command}: interrupted" + (f"; {_left_in(out, done_before)}" if out else ""),
              file=sys.stderr)
        return 130


def _left_in(out: Path, done_before: int) -> str:
    """What an interrupted run left in its ``--out`` directory, truthfully (see :func:`npusim.files.result_files`)."""
    if any(p.parent == out for p in completed_sets[done_before:]):
        return f"its results were complete in {out} before the interrupt"
    if out.is_dir() and any(out.iterdir()):
        return f"nothing of this run was written; what {out} held before is untouched"
    return f"nothing was written to {out}"


def _quiet(args) -> bool:
    """Whether the command shows no progress (``--no-progress``, or no ``--progress`` where progress
    is opt-in): it then says nothing about compiling either. ``--json`` does not silence it:
    progress goes to stderr, the JSON to stdout."""
    return bool(getattr(args, "no_progress", False) or not getattr(args, "progress", True))


def _compile_notice(name: str) -> None:
    """One line on stderr as a simulation kernel starts compiling, before the wait (on a terminal
    it takes the progress bar's line; the bar redraws below it)."""
    start = "\r\x1b[K" if sys.stderr.isatty() else ""
    print(f"{start}npusim: compiling the {name} with Numba, once after an install or an update; later "
          "runs load it from the cache", file=sys.stderr, flush=True)


def _remove_if_empty(out: Path | None) -> None:
    """A failed or interrupted run leaves no empty result directory of its own making behind."""
    if out is not None and out.is_dir() and not any(out.iterdir()):
        out.rmdir()


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _terminate_like_interrupt() -> None:
    """SIGTERM (a job scheduler's stop, ``kill``) unwinds like Ctrl-C, so result files being written
    are removed rather than left half-written (a SIGKILL's leftovers are removed by the next run)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)


if __name__ == "__main__":
    sys.exit(main())
