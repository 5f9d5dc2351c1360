"""The Typer app, its output object and the options every command shares."""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
import warnings
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from avatar_render.errors import AvatarRenderError
from avatar_render.tables import fitted

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Render long talking-avatar videos from a reference image and an audio track.")

def _version(shown: bool) -> None:
    if shown:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"avatar-render {version('avatar-render')}")
        except PackageNotFoundError:  # (run from a checkout that was never installed)
            typer.echo("avatar-render (not installed: run from its source folder)")
        raise typer.Exit()


@app.callback()
def _options(version: Annotated[bool, typer.Option(
        "--version", help="Print the version and exit.", callback=_version, is_eager=True)] = False) -> None:
    """Render long talking-avatar videos from a reference image and an audio track."""


ConfigOpt = Annotated[Optional[Path], typer.Option(
    "-c", "--config", help="YAML config (default: the embedded preview config).")]
OverridesArg = Annotated[Optional[list[str]], typer.Argument(
    help="Config overrides, key=value (e.g. preview.fps=30).", show_default=False)]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show the full traceback of unexpected errors.")]
ProgressOpt = Annotated[str, typer.Option(
    "--progress", metavar="auto|bar|lines|json|none",
    help="How progress is shown: auto (a bar on a terminal, else a line every --progress-every seconds), bar, "
         "lines, json (one JSON object per line on standard output, the end's figures last) or none.")]
ProgressEveryOpt = Annotated[float, typer.Option(
    "--progress-every", metavar="SECONDS", min=0, help="Seconds between two progress lines (lines, json).")]


class Out:
    """All terminal output: human text on stdout (on stderr when stdout carries a video or JSON lines), errors on
    stderr."""

    def __init__(self, *, quiet: bool = False, stdout_is_video: bool = False, stdout_is_json: bool = False) -> None:
        self.console = Console(highlight=False, stderr=stdout_is_video or stdout_is_json)
        self.err = Console(stderr=True, highlight=False)
        self.quiet = quiet
        self.data_file = sys.stderr if stdout_is_video else sys.stdout  # JSON lines for scripts

    def data(self, text: str) -> None:
        """One line for a program to read (JSON progress), unstyled and unwrapped."""
        self.data_file.write(text + "\n")
        self.data_file.flush()

    def line(self, text: str) -> None:
        """One plain line of a log (progress without a terminal), never wrapped."""
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def info(self, text: str) -> None:
        if not self.quiet:
            self.console.print(escape(text), soft_wrap=True)

    def notice(self, text: str) -> None:
        """Shown even when quiet."""
        self.console.print(escape(text), soft_wrap=True)

    def warn(self, text: str) -> None:
        self.err.print(f"[yellow]Warning:[/] {escape(text)}", soft_wrap=True)

    def error(self, text: str) -> None:
        self.err.print(f"[bold red]Error:[/] {escape(text)}", soft_wrap=True)

    def table(self, table: Table) -> None:
        """A table that fits the width: narrower columns, or one block of lines per row (never a cut word)."""
        for part in fitted(table, self.console):
            self.console.print(part)


def read_config(out: Out, path: Optional[Path], overrides: Optional[list[str]], *, seed: Optional[int] = None):
    """The config, with what ``load_config`` warns about (moved keys) printed as warnings."""
    from avatar_render.config import ConfigWarning, load_config

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigWarning)
        cfg = load_config(path, tuple(overrides or ()), seed=seed)
    for w in caught:
        if issubclass(w.category, ConfigWarning):
            out.warn(str(w.message))
    return cfg


class HeldSignals:
    """While a command imports the library with its set-up's threads importing beside it: SIGINT and SIGTERM are
    recorded (``first``, the first that came), never raised. A KeyboardInterrupt raised inside an import while the
    interpreter's import lock was held left the other threads waiting on that lock, and the process with them. A
    signal the process ignores stays ignored; elsewhere than in the main thread nothing is held."""

    def __init__(self) -> None:
        self.first: Optional[int] = None
        self._previous: dict[int, object] = {}

    def _record(self, signum: int, frame: object) -> None:
        if self.first is None:
            self.first = signum

    def __enter__(self) -> HeldSignals:
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(s) is not signal.SIG_IGN:
                    self._previous[s] = signal.signal(s, self._record)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def guard(out: Out, debug: bool, fn: Callable[[], None]) -> None:
    """Map failures to one sentence and an exit code; tracebacks only with --debug."""
    try:
        fn()
    except AvatarRenderError as e:
        out.error(str(e))
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        out.error("Interrupted.")
        raise typer.Exit(130) from None
    except typer.Exit:
        raise
    except Exception as e:  # noqa: BLE001 - the last line of defence against tracebacks
        if debug or os.environ.get("AVATAR_RENDER_DEBUG"):
            traceback.print_exc()
        out.error(f"Unexpected internal error ({type(e).__name__}: {e}). Run again with --debug for details.")
        raise typer.Exit(2) from None



def main() -> None:
    app(prog_name="avatar-render")
