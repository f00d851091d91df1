"""What the planted-bug tests share: a one-line patch of a copy of a trainer's file, the test id
of a patch in ASCII, and the verdicts a patched and an unpatched row must give."""
from crosscheck import trainer as trainers
from crosscheck.trainer import card

CASES = 24
# pytest escapes a non-ASCII character in a node id, and that id given back on its command line
# (as mutmut does) then selects nothing
_ASCII = (("γ", "gamma"), ("λ", "lambda"), ("ε", "eps"), ("β", "beta"), ("·", "."),
          ("×", "x"), ("ρ", "rho"), ("±", "pm"))


def ascii_id(patch):
    """trainer:row:code of a (trainer, file, old, new, [nth,] row) patch, in ASCII."""
    raw = f"{patch[0]}:{patch[-1]}:{patch[2][:30]}"
    for char, word in _ASCII:
        raw = raw.replace(char, word)
    return raw.encode("ascii", "replace").decode()


def patched(text, old, new, nth=0):
    """text with the nth occurrence of old replaced by new; fails where the pinned code no longer
    holds it."""
    at = -1
    for _ in range(nth + 1):
        at = text.find(old, at + 1)
        assert at >= 0, f"the pinned code no longer holds {old!r} (occurrence {nth})"
    return text[:at] + new + text[at + len(old):]


class Planted:
    """The file root/rel patched inside the with block, restored after it."""

    def __init__(self, root, rel, old, new, nth=0):
        self.path, self.old, self.new, self.nth = root / rel, old, new, nth

    def __enter__(self):
        self.original = self.path.read_text(encoding="utf-8")
        self.path.write_text(patched(self.original, self.old, self.new, self.nth),
                             encoding="utf-8")

    def __exit__(self, *exc):
        self.path.write_text(self.original, encoding="utf-8")


def assert_no_alarm(name, root, rows):
    """The card of the copy at root raises no alarm at rows (conforms, or a known deviation)."""
    c = card.run(trainers.get(name), path=str(root), cases=CASES, only=rows)
    assert set(rows) <= {r.row.name for r in c.rows}    # a function's name selects its rows
    for r in c.rows:
        assert r.verdict in ("CONFORMS", "KNOWN DEVIATION"), (r.row.name, r.verdict, r.reason)
    assert c.exit_code == 0


def assert_caught(name, root, rel, old, new, nth, row):
    """With the patch planted, the row fails with a new, unexplained deviation, and exit 1."""
    with Planted(root, rel, old, new, nth):
        c = card.run(trainers.get(name), path=str(root), cases=CASES, only=[row])
    (r,) = [r for r in c.rows if r.row.name == row]
    new_ones = [f for f in r.findings if f["grade"] == "deviation" and not f["known"]]
    assert r.verdict == "DOES NOT CONFORM" and new_ones, (r.verdict, r.reason, r.findings)
    assert all(f["kind"] == "new" for f in new_ones)
    assert c.exit_code == 1
