"""The one error type users see."""


class AvatarRenderError(Exception):
    """A problem the user can fix. ``str(error)`` is one sentence saying what and how."""
