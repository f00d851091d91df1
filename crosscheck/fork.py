"""Work in forked children: two halves of a job at once on two cores (one in this process, one
in a child), or a job kept apart from the process that reports on it.

Fork only from a process whose torch thread pool has not run (a fresh command line): a child
forked after OpenMP threads started can deadlock.
"""
import os
import pickle
import sys


def in_two_processes(here, there):
    """(here(), there()), with there() run in a forked child meanwhile and its result (which
    must pickle) sent back through a pipe. If the child fails, there() runs here afterwards."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:                                       # the child: its half, then exit
        os.close(read_end)
        try:
            import torch
            torch.set_num_threads(1)                   # two processes share the cores
            payload = pickle.dumps(("ok", there()))
        except BaseException as exc:                   # noqa: B902 — reported to the parent
            payload = pickle.dumps(("error", repr(exc)))
        with os.fdopen(write_end, "wb") as pipe:
            pipe.write(payload)
        os._exit(0)                                    # no atexit, no buffers flushed twice
    os.close(write_end)
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    try:
        if threads is not None:        # one thread each: two processes share the cores, and
            torch.set_num_threads(1)   # the cases' small tensors gain nothing from a thread pool
        mine = here()                  # but its barrier waits, which a busy machine lengthens
        with os.fdopen(read_end, "rb") as pipe:
            data = pipe.read()
    finally:
        if threads is not None:
            torch.set_num_threads(threads)
        os.waitpid(pid, 0)
    status, theirs = pickle.loads(data) if data else ("error", "no output")
    return mine, theirs if status == "ok" else there()


def in_child(work):
    """work() in a forked child, its result (which must pickle) sent back through a pipe:
    ("ok", result), ("error", repr of what it raised), or ("ended", how) where the child ended
    without sending anything (os._exit or exit() below Python, a signal): whatever work() runs
    cannot end this process or choose its exit status."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            payload = pickle.dumps(("ok", work()))
        except BaseException as exc:                   # noqa: B902 — reported to the parent
            payload = pickle.dumps(("error", repr(exc)))
        for stream in (sys.stdout, sys.stderr):        # what work() printed, before _exit
            stream.flush()
        with os.fdopen(write_end, "wb") as pipe:
            pipe.write(payload)
        os._exit(0)
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as pipe:
            data = pipe.read()
    finally:
        _, status = os.waitpid(pid, 0)
    if data:
        return pickle.loads(data)
    how = (f"killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else
           f"exit status {os.WEXITSTATUS(status)}")
    return "ended", how
