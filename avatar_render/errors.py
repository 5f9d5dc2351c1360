"""The one error type users see."""


class AvatarRenderError(Exception):
    """A problem the user can fix. ``str(error)`` is one sentence saying what and how."""


class InputError(AvatarRenderError):
    """Something wrong inside an input file, found while it is read (the fixed file is another input,
    so an interrupted render cannot go on with it)."""
