"""The command line: a thin Typer layer over the library's api; each command parses, calls the library
and prints through one output object (``app.Out``)."""

from avatar_render.cli import batch as _batch  # noqa: F401  (each module registers its commands on ``app``)
from avatar_render.cli import render as _render  # noqa: F401
from avatar_render.cli import tools as _tools  # noqa: F401
from avatar_render.cli.app import app, main

__all__ = ["app", "main"]
