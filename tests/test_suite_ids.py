"""The test suite's own ids: each one, given back on pytest's command line, selects its test
(mutation testing re-runs tests by id: docs/mutation.md)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_test_id_is_ascii_so_it_can_be_given_back_to_pytest():
    """pytest escapes non-ASCII in a parametrised id (β becomes \\u03b2), and that escaped id on
    its command line selects nothing: pytest exits with a usage error."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider",
                          "tests"], capture_output=True, text=True, cwd=ROOT, timeout=900).stdout
    ids = [line for line in out.splitlines() if "::" in line]
    assert len(ids) > 1000, out[-2000:]
    assert [i for i in ids if "\\u" in i or not i.isascii()] == []
