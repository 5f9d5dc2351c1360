"""PocketSphinx's decoder through its C API, so that recognising a window lets other threads run.

The Python binding holds the interpreter's lock for the whole of ``process_raw`` (about 40 ms for a
preview chunk's window): the writer thread, which needs the lock between the encoder's calls, and the
frames' drawing stood still meanwhile. ctypes lets go of the lock around every foreign call. The calls
are the binding's own (``reinit_feat``, ``start_utt``, ``process_raw``, ``end_utt``, ``seg``), on a
decoder made from the binding's ``Config`` (the same keys, expanded by ``ps_init`` as the binding's
decoder is): the same phones, frame for frame (``tests/test_preview.py``).
"""

from __future__ import annotations

import ctypes
import threading
import weakref

import numpy as np

_P = ctypes.c_void_p


def _library() -> ctypes.CDLL:
    from pocketsphinx import _pocketsphinx  # the extension carries the C library's symbols

    lib = ctypes.CDLL(_pocketsphinx.__file__)
    lib.ps_config_parse_json.restype, lib.ps_config_parse_json.argtypes = _P, [_P, ctypes.c_char_p]
    lib.ps_config_free.argtypes = [_P]
    lib.ps_init.restype, lib.ps_init.argtypes = _P, [_P]
    lib.ps_free.argtypes = [_P]
    lib.ps_reinit_feat.argtypes = [_P, _P]
    lib.ps_start_utt.argtypes = lib.ps_end_utt.argtypes = [_P]
    lib.ps_process_raw.argtypes = [_P, _P, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    lib.ps_seg_iter.restype, lib.ps_seg_iter.argtypes = _P, [_P]
    lib.ps_seg_next.restype, lib.ps_seg_next.argtypes = _P, [_P]
    lib.ps_seg_word.restype, lib.ps_seg_word.argtypes = ctypes.c_char_p, [_P]
    lib.ps_seg_frames.argtypes = [_P, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
    return lib


class SphinxDecoder:
    """One decoder; one window at a time (calls from several threads are serialised)."""

    def __init__(self, **config) -> None:
        from pocketsphinx import Config

        self._lib = lib = _library()
        settings = lib.ps_config_parse_json(None, Config(**config).dumps().encode())
        if not settings:
            raise RuntimeError("PocketSphinx did not take its configuration")
        self._ps = lib.ps_init(settings)
        lib.ps_config_free(settings)  # (the decoder holds its own reference)
        if not self._ps:
            raise RuntimeError("PocketSphinx's decoder could not be made")
        self._lock = threading.Lock()
        weakref.finalize(self, lib.ps_free, self._ps)

    def segments(self, pcm: np.ndarray) -> list[tuple[str, int, int]]:
        """(word, first frame, last frame) of each segment of an utterance: pcm (n,) int16 at the decoder's rate,
        decoded as a whole (batch normalisation) with the feature extraction set up afresh."""
        lib, ps = self._lib, self._ps
        pcm = np.ascontiguousarray(pcm, np.int16)
        with self._lock:
            _check(lib.ps_reinit_feat(ps, None), "reinit_feat")
            _check(lib.ps_start_utt(ps), "start_utt")
            _check(lib.ps_process_raw(ps, pcm.ctypes.data, len(pcm), 0, 1), "process_raw")
            _check(lib.ps_end_utt(ps), "end_utt")
            out = []
            first, last = ctypes.c_int(), ctypes.c_int()
            seg = lib.ps_seg_iter(ps)
            while seg:
                lib.ps_seg_frames(seg, ctypes.byref(first), ctypes.byref(last))
                out.append((lib.ps_seg_word(seg).decode(), first.value, last.value))
                seg = lib.ps_seg_next(seg)  # (frees the iterator after the last segment)
        return out


def _check(result: int, call: str) -> None:
    if result < 0:
        raise RuntimeError(f"PocketSphinx's {call} failed")
