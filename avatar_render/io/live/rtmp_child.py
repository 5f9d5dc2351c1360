"""``python -m avatar_render.io.live.rtmp_child URL``: the RTMP connection of one live target, in a process
of its own (see ``wire``: the render gives up on it when the server does not answer in time).

Standard input: the init segment (4-byte big-endian length, then its bytes), then packets framed by
``wire.FRAME``. Standard output: ``started`` once it runs and connects, ``connected`` once the server
took the stream's header. Standard
error: the reason, in one line, when the connection fails or is lost (exit code 1)."""

from __future__ import annotations

import struct
import sys
from typing import BinaryIO

import av

from avatar_render.io.live.wire import CONNECTED, FRAME, STARTED, Connection, WirePacket, reason


def _read(stream: BinaryIO, size: int) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise EOFError
    return data


def _say(word: bytes) -> None:
    sys.stdout.buffer.write(word)
    sys.stdout.buffer.flush()


def main(url: str) -> int:
    stdin = sys.stdin.buffer
    try:
        (size,) = struct.unpack(">I", _read(stdin, 4))
        init = _read(stdin, size)
    except EOFError:
        return 0  # the render ended before the stream began
    _say(STARTED)
    try:
        connection = Connection(av.open(url, "w", format="flv"), init)
    except (OSError, av.error.FFmpegError) as exc:
        print(reason(exc), file=sys.stderr)
        return 1
    except ConnectionError as exc:
        print(exc, file=sys.stderr)
        return 1
    _say(CONNECTED)
    try:
        while head := stdin.read(FRAME.size):
            if len(head) != FRAME.size:
                raise EOFError
            video, key, pts, duration, size = FRAME.unpack(head)
            connection.send(WirePacket(video=video, data=_read(stdin, size), pts=pts, duration=duration, key=key))
    except ConnectionError as exc:
        print(exc, file=sys.stderr)
        return 1
    except EOFError:  # the render ended in the middle of a packet (it was stopped at once)
        pass
    finally:
        connection.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
