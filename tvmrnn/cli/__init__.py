"""Command-line tools: ``tvmrnn-tune`` (:mod:`.tune`), ``tvmrnn-export`` (:mod:`.export`) and
``tvmrnn-bench`` (:mod:`.bench`)."""
from __future__ import annotations

import argparse
import functools
import sys


def positive_int(text: str) -> int:
    """An argparse type: an integer of 1 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def usage_errors(prog: str):
    """A command's ``main`` whose errors of use (a bad size, target, cell, option, file or module:
    ValueError, TypeError, ImportError, OSError and the package errors, which subclass them) end
    as argparse's do, ``prog: error: ...`` and exit status 2, instead of a traceback. Other
    exceptions (a bug) keep theirs."""
    def wrap(main):
        @functools.wraps(main)
        def guarded(argv=None):
            if "" not in sys.path and "." not in sys.path:  # module:attribute cells from this folder,
                sys.path.insert(0, "")  # as `python -m` finds them (console scripts leave it out)
            try:
                return main(argv)
            except (ValueError, TypeError, ImportError, OSError) as err:
                print(f"{prog}: error: {err}", file=sys.stderr)
                raise SystemExit(2) from None
        return guarded
    return wrap
