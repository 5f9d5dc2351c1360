"""The ``avatar-render`` command (and ``python -m avatar_render``). Its libraries take a moment to import, and
Typer imports more while it reads the arguments; a Ctrl-C in those moments is answered as at any later one, with
one line and the shell's code for it (no traceback, and not silently)."""

import sys


def main() -> None:
    try:
        from avatar_render.cli import main as command

        command()
    except KeyboardInterrupt:
        sys.stderr.write("Error: Interrupted.\n")
        raise SystemExit(130) from None
    except SystemExit as done:
        # (Typer turns a Ctrl-C while it reads the arguments into exit code 130, saying nothing: the exit it
        # raised was caused by the KeyboardInterrupt, where the command's own stops say why and raise from None)
        if done.code == 130 and isinstance(getattr(done.__context__, "__cause__", None), KeyboardInterrupt):
            sys.stderr.write("Error: Interrupted.\n")
        raise


if __name__ == "__main__":
    main()
