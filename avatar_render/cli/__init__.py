"""The command line: a thin Typer layer over the library's api; each command parses, calls the library
and prints through one output object (``app.Out``)."""

from avatar_render.cli import batch, render, tools
from avatar_render.cli.app import app, main

for _command in (render.render, batch.batch, tools.doctor, tools.setup, tools.bench, tools.inspect):  # --help's order
    app.command()(_command)

__all__ = ["app", "main"]
