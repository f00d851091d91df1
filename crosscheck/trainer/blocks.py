"""Statement blocks of a training script, run as functions.

Some trainers (MiniMind) write their math inline in a training loop. A block is named by the
function that holds it and the first and last variables it assigns; the statements from the
first assignment to the last, inclusive and in one statement list, are compiled from the
user's own file at run time and run in a namespace holding only the block's inputs, torch, and
an `args` namespace for the hyper-parameters it reads. Nothing else of the script runs.
"""
import ast
import types
from typing import Callable, Tuple

import torch


class BlockNotFound(LookupError):
    """No such block. `absent`: the function never assigns the block's first variable (the
    block is not in this version), as opposed to a block whose shape changed."""

    def __init__(self, message, absent=False):
        super().__init__(message)
        self.absent = absent


def _assigns(stmt, name: str, nested: bool = False) -> bool:
    """`stmt` assigns `name` (with `nested`, also anywhere inside a compound statement: an
    if/elif chain that assigns it on each branch)."""
    if nested:
        return any(_assigns(s, name) for s in ast.walk(stmt) if isinstance(s, ast.stmt))
    targets = stmt.targets if isinstance(stmt, ast.Assign) else \
        [stmt.target] if isinstance(stmt, (ast.AugAssign, ast.AnnAssign)) else []
    return any(isinstance(n, ast.Name) and n.id == name
               for t in targets for n in ast.walk(t))


def find(path: str, function: str, first: str, last: str,
         nested: bool = False) -> Tuple[list, int, int]:
    """(statements, first line, last line) of the block in `function` (a name, or a method's
    "Class.method") of the file at `path`. With `nested`, the block ends at the last statement
    that assigns `last` directly or inside a compound statement."""
    function = function.rsplit(".", 1)[-1]
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), path)
    fn = next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
               and n.name == function), None)
    if fn is None:
        raise BlockNotFound(f"no function {function} in {path}")
    for node in ast.walk(fn):
        for body in (getattr(node, f, None) for f in ("body", "orelse", "finalbody")):
            if not isinstance(body, list):
                continue
            starts = [i for i, s in enumerate(body) if _assigns(s, first)]
            for i in starts:
                ends = [j for j in range(i, len(body)) if _assigns(body[j], last, nested)]
                if ends:
                    stmts = body[i:ends[-1] + 1]
                    return stmts, stmts[0].lineno, stmts[-1].end_lineno
    absent = not any(_assigns(s, first) for s in ast.walk(fn) if isinstance(s, ast.stmt))
    raise BlockNotFound(f"no statement block from {first} = ... to {last} = ... in {function} "
                        f"({path})" + (f": {function} never assigns {first}" if absent else ""),
                        absent=absent)


def compile_block(path: str, function: str, first: str, last: str,
                  outputs: Tuple[str, ...], nested: bool = False) -> Tuple[Callable, int, int]:
    """A callable running the block: keyword inputs (plus `args`, a dict of hyper-parameters)
    in, the `outputs` variables out (one value, or a tuple)."""
    stmts, lo, hi = find(path, function, first, last, nested)
    code = compile(ast.Module(body=stmts, type_ignores=[]), path, "exec")

    def run(args=None, **inputs):
        ns = dict(torch=torch, args=types.SimpleNamespace(**(args or {})), **inputs)
        exec(code, ns)                 # the user's own statements, from their own file
        got = tuple(ns[o] for o in outputs)
        return got[0] if len(got) == 1 else got
    run.__qualname__ = f"{function}[{first}..{last}]"
    return run, lo, hi
