"""Report cards: a trainer's own functions audited against the references
(`python -m crosscheck trainer NAME`). See crosscheck.trainer.card.

Importing this package imports neither torch nor any trainer.
"""
import importlib

TRAINERS = ("verl", "trl", "openrlhf", "skyrl", "liger", "trinity", "torchrl", "areal",
            "unsloth", "roll", "prime-rl", "slime", "rllm", "nemo-rl", "minimind",
            "open-instruct", "ms-swift", "easyr1", "art", "tunix")
# a card's module where it is not the name without hyphens
_MODULES = {"ms-swift": "swift"}


def get(name: str):
    """The `Trainer` declaration of `name` (one of TRAINERS)."""
    if name not in TRAINERS:
        raise KeyError(f"unknown trainer {name!r}; known: {', '.join(TRAINERS)}")
    module = _MODULES.get(name, name.replace("-", ""))
    return importlib.import_module(f"{__name__}.{module}").TRAINER


def installed():
    """The trainers whose package is installed (MiniMind, a checkout only, never is)."""
    import importlib.util
    return [n for n in TRAINERS if get(n).installable and
            importlib.util.find_spec(get(n).package) is not None]


def pins():
    """`dist==version` of each trainer CI installs (MiniMind is not a package), and of the
    libraries their math imports (`Trainer.requires`)."""
    return [pin for t in map(get, TRAINERS) if t.installable
            for pin in (f"{t.dist}=={t.pinned}",) + t.requires]
