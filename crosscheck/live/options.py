"""The arguments watch() and every recorder share, checked by name."""
import sys


def arguments(every, strict, verbose):
    """watch's and the recorders' shared arguments, checked by name: (every, strict, stream)."""
    if isinstance(every, bool) or not isinstance(every, int):
        raise TypeError(f"every is {type(every).__name__} {every!r}; expected an int ≥ 1 "
                        f"(check every n-th optimizer step)")
    if every < 1:
        raise ValueError(f"every is {every}; expected an int ≥ 1 (check every n-th optimizer "
                         f"step)")
    if not isinstance(strict, bool):
        raise TypeError(f"strict is {type(strict).__name__} {strict!r}; expected True or False")
    if verbose is None:
        verbose = sys.stderr.isatty()
    return every, strict, (sys.stderr if verbose else None)
