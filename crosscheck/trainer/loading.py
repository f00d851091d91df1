"""Find a trainer's source and load its math modules, without its heavy dependencies.

Where the code comes from:
- installed: the package that `import <package>` would find (`importlib.util.find_spec`, which
  runs nothing); its version from the distribution's metadata;
- `--path`: a source checkout or a fork, holding `<package>/` itself or under `src/`; its
  version is the checkout's git commit (and the package's own version file where it has one).

How it is loaded:
- an installed trainer whose math modules import cleanly is imported normally;
- otherwise (OpenRLHF's package init imports flash_attn; a `--no-deps` install lacks omegaconf,
  transformers, ...), each math module is loaded **by file**: the trainer's own package
  `__init__` files are not run (their relative re-exports, `from .groupwise import f`, resolve
  on first use), and every third-party module that is not installed, or that needs a GPU or a
  cluster (`ALWAYS_STAND_IN`), is replaced by a stand-in: a module whose every attribute is an
  inert class (it can be subclassed, called, used as a decorator, used in annotations). The card
  lists each stand-in. Stand-ins are only ever seen by code the card does not run; a row that
  touches one fails loudly, it does not pass.

The trainer's modules live in `sys.modules` only inside `Loaded` (a context manager), so that a
card leaves the interpreter as it found it. Nothing from a trainer is ever written to disk.
"""
import ast
import contextlib
import dis
import glob
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import types
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

# GPU kernels and cluster runtimes: the math never needs them, and importing them without a GPU
# fails or takes long, so they are stood in even when installed. transformers too: the losses
# never call it, and importing it (with the configs that pull it in) costs seconds a card, so a
# card reads the same whether or not it is installed.
ALWAYS_STAND_IN = ("flash_attn", "vllm", "deepspeed", "ray", "megatron", "apex",
                   "transformer_engine", "liger_kernel", "sglang", "flashinfer", "bitsandbytes",
                   "transformers")
REAL = ("torch", "numpy", "scipy")      # never stood in: the math runs on them


class TrainerNotFound(LookupError):
    """The trainer is not installed, or `--path` does not hold it (a usage error)."""


@dataclass
class Source:
    """Where a trainer's code is: the directory holding its package, and what version it is.
    A checkout may split one package over several source roots (prime-rl: `src/` and
    `packages/prime-rl-configs/src/`, neither with a top `__init__.py`): `roots` lists them,
    `root` first."""
    package: str
    root: str                        # the directory that contains <package>/
    origin: str                      # "installed" or "checkout"
    version: str                     # "0.9.1", or "commit 1a2b3c4 (package version 0.9.1)"
    package_version: str = "unknown"     # what `<package>.__version__` gives the trainer's code
    more_roots: Tuple[str, ...] = ()     # further directories that contain <package>/

    @property
    def roots(self) -> Tuple[str, ...]:
        return (self.root,) + tuple(self.more_roots)

    def file(self, module: str) -> str:
        """The source file of `module` (a dotted name inside the package), in the first root
        that has it."""
        for root in self.roots:
            base = os.path.join(root, *module.split("."))
            for path in (os.path.join(base, "__init__.py"), base + ".py"):
                if os.path.isfile(path):
                    return path
        base = os.path.join(self.root, *module.split("."))
        package = os.path.join(base, "__init__.py")
        return package if os.path.isdir(base) else base + ".py"

    def relative(self, path: str) -> str:
        path = os.path.abspath(path)
        root = next((r for r in self.roots if path.startswith(os.path.join(r, ""))), self.root)
        return os.path.relpath(path, root)


def _git_commit(path: str) -> Optional[str]:
    try:
        out = subprocess.run(["git", "-C", path, "rev-parse", "--short=12", "HEAD"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(["git", "-C", path, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=10).stdout.strip()
    return out.stdout.strip() + (" with uncommitted edits" if dirty else "")


def locate(package: str, dist: str, path: Optional[str] = None, version_file=None,
           needs: Sequence[str] = ()) -> Source:
    """The trainer's source: installed (path None) or the checkout at `path`.

    `needs`: module files (dotted) that must exist there, so that a wrong `--path` is a usage
    error naming what is missing. `version_file(root)`: the package's own version, or None."""
    if path is None:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise TrainerNotFound(f"{package} is not installed in this environment "
                                  f"({sys.executable}); install it (pip install --no-deps "
                                  f"{dist}) or pass --path to a checkout")
        root = os.path.dirname(list(spec.submodule_search_locations)[0])
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            version = (version_file(root) if version_file else None) or "unknown version"
        source = Source(package, root, "installed", version, version)
    else:
        top = os.path.abspath(os.path.expanduser(path))
        if not os.path.isdir(top):
            raise TrainerNotFound(f"--path {path!r} is not a directory")
        candidates = [top, os.path.join(top, "src")] + sorted(
            glob.glob(os.path.join(top, "packages", "*", "src")))
        roots = [c for c in candidates if os.path.isdir(os.path.join(c, package))]
        root = roots[0] if roots else None
        if root is None:
            raise TrainerNotFound(f"--path {path!r} does not hold {package}: no {package}/ "
                                  f"folder in it (nor in its src/)")
        own = version_file(root) if version_file else None
        if own is None:              # an unpacked wheel keeps its metadata beside the package
            found = list(importlib.metadata.distributions(name=dist, path=[root]))
            own = found[0].version if found else None
        commit = _git_commit(top)
        version = (f"commit {commit}" if commit else "not a git checkout") + \
            (f" (package version {own})" if own else "")
        source = Source(package, root, "checkout", version, own or "unknown",
                        tuple(roots[1:]))
    missing = [m for m in needs if not os.path.isfile(source.file(m))]
    if needs and len(missing) == len(needs):     # a release may lack some: their rows say so
        where = "the installed package" if path is None else f"--path {path!r}"
        files = ", ".join(source.relative(source.file(m)) for m in missing)
        raise TrainerNotFound(f"{where} lacks {files}; is it {package}?")
    return source


# ---- stand-ins -------------------------------------------------------------------------------

class _StandInMeta(type):
    """The type of a stand-in: any attribute is another stand-in; calling it with one function
    returns that function (a decorator that does nothing); `X[...]` is X (annotations); adding
    it to something gives that thing (a base class's list extended in a subclass); other
    arithmetic on it gives it back, and every order comparison with it holds (a class
    constant derived from a stood-in library's: open-instruct's callback priorities)."""

    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        sub = _StandInMeta(name, (StandIn,), {"__module__": cls.__module__, "_stand_in": True,
                                              "__qualname__": f"{cls.__qualname__}.{name}"})
        setattr(cls, name, sub)
        return sub

    def __call__(cls, *args, **kwargs):
        if cls.__dict__.get("_stand_in") and len(args) == 1 and not kwargs and \
                callable(args[0]) and not isinstance(args[0], _StandInMeta):
            return args[0]
        return super().__call__(*args, **kwargs)

    def __getitem__(cls, item):
        return cls

    def __delattr__(cls, name):
        """Deleting what the stand-in does not hold is a no-op: a subclass module's
        `del Base.__init__` (ms-swift's, on TRL's GRPOTrainer) finds nothing to delete."""
        if name in cls.__dict__:
            super().__delattr__(name)

    def __add__(cls, other):               # Base._FIELDS + [...] in a subclass body
        return other

    __radd__ = __add__

    def _arithmetic(cls, other=None):      # a class constant computed from a stood-in one
        return cls                         # (`min(Callback.priority - 1, 0)`): a stand-in

    __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = __neg__ = _arithmetic

    def _compare(cls, other):              # and compared (min, max): every order holds
        return True

    __lt__ = __le__ = __gt__ = __ge__ = _compare


class StandIn(metaclass=_StandInMeta):
    """An inert object: it accepts any arguments, every attribute and every item is another
    stand-in, calling it returns itself (or, given a function, the function), it is falsy and
    empty, and every order comparison with it holds."""

    def __init__(self, *args, **kwargs):
        pass

    def __init_subclass__(cls, **keywords):
        """A subclass's class keywords (`class T(msgspec.Struct, array_like=True)`) go to its
        stood-in base, which ignores them."""
        super().__init_subclass__()

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return getattr(type(self), name)()

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return self

    def __bool__(self):
        return False

    def _compare(self, other):
        """Every order comparison holds: an import-time version gate on a stood-in library
        (`assert Version(transformers.__version__) < Version("5.12")`, NeMo-RL) passes."""
        return True

    __lt__ = __le__ = __gt__ = __ge__ = _compare

    def __iter__(self):
        """Empty, except where the caller unpacks a call's result (`a, b = stood_in(...)`):
        then as many stand-ins as it unpacks, read from the instruction being run in the
        nearest frame that is not itself in the middle of a call (a wrapper around this
        method, such as a mutation tester's trampoline, is)."""
        frame = sys._getframe(1)
        while frame is not None:
            ins = next((i for i in dis.get_instructions(frame.f_code)
                        if i.offset == frame.f_lasti), None)
            if ins is None or not ins.opname.startswith(("CALL", "PRECALL")):
                break
            frame = frame.f_back
        if ins is not None and ins.opname == "UNPACK_SEQUENCE":
            return iter([StandIn() for _ in range(ins.arg)])
        if ins is not None and ins.opname == "UNPACK_EX":
            return iter([StandIn() for _ in range((ins.arg & 0xFF) + (ins.arg >> 8))])
        return iter(())

    def __len__(self):
        return 0

    def __getitem__(self, item):
        """Another stand-in: a stood-in library's object indexed at import
        (`ms_logger.handlers[0].setFormatter(...)`, ms-swift's logger of modelscope)."""
        return StandIn()


StandIn._stand_in = True


class StandInModule(types.ModuleType):
    """A module none of whose code runs: every attribute is a stand-in class (Megatron's
    parallel state is a `ParallelState`)."""

    def __init__(self, name):
        super().__init__(name, "stand-in for " + name)
        self.__path__ = []                 # a package, so that its submodules import too
        self.__version__ = "0+stand.in"

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        full = f"{self.__name__}.{name}"
        if full in PARALLEL_STATE:         # `from megatron.core import mpu`
            value = sys.modules.setdefault(full, ParallelState(full))
        else:
            value = _StandInMeta(name, (StandIn,), {"__module__": self.__name__,
                                                    "_stand_in": True})
        setattr(self, name, value)
        return value


class ParallelState(StandInModule):
    """Megatron's parallel state as one process has it: every parallel world size 1, every
    rank 0, no process group (None: torch.distributed's default), the one pipeline stage both
    first and last. The math of a trainer built on Megatron branches on these (slime's
    per-sample mean takes its context-parallel path unless the size is 1); any other name is a
    stand-in."""

    def __getattr__(self, name):
        if re.fullmatch(r"get_\w*world_size", name):
            value = _constant(name, 1)
        elif re.fullmatch(r"get_\w*rank", name):
            value = _constant(name, 0)
        elif re.fullmatch(r"get_\w*groups?(_\w+)?", name):
            value = _constant(name, None)
        elif re.fullmatch(r"is_pipeline_(first|last)_stage|model_parallel_is_initialized", name):
            value = _constant(name, True)
        else:
            return super().__getattr__(name)
        setattr(self, name, value)
        return value


def _constant(name, value):
    def constant(*args, **kwargs):
        return value
    constant.__name__ = constant.__qualname__ = name
    return constant


PARALLEL_STATE = ("megatron.core.mpu", "megatron.core.parallel_state")


class _Package(types.ModuleType):
    """One of the trainer's packages, its `__init__` not run: a name it re-exports from a
    submodule (`from .groupwise import f`) is imported from there on first use."""

    def __init__(self, name, directories, reexports):
        super().__init__(name)
        self.__path__ = list(directories)
        self._reexports = reexports

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__") and name != "__version__" or \
                name == "_reexports":
            raise AttributeError(name)
        where = self._reexports.get(name)
        for star in (self._reexports.get("*", ((), None))[0] if where is None else ()):
            found = getattr(importlib.import_module(star), name, self)
            if found is not self:
                setattr(self, name, found)
                return found
        if where is None:
            try:
                return importlib.import_module(f"{self.__name__}.{name}")
            except ImportError:
                pass
            return self._from_init(name)
        module, attr = where
        if module is None:
            return attr
        value = importlib.import_module(module)
        value = value if attr is None else getattr(value, attr)
        setattr(self, name, value)
        return value

    def _from_init(self, name):
        """A name the `__init__` defines itself (`current_platform = _LazyPlatform()`), or serves
        from a PEP 562 `__getattr__` table: the `__init__` is run once, in this module, under
        the stand-ins, the first time such a name is asked for."""
        state = self.__dict__.get("_init_run")
        if state is None:
            init = next((os.path.join(d, "__init__.py") for d in self.__path__
                         if os.path.isfile(os.path.join(d, "__init__.py"))), "")
            self.__dict__["_init_run"] = state = "running"
            try:
                if os.path.isfile(init):
                    with open(init, encoding="utf-8") as fh:
                        code = compile(fh.read(), init, "exec")
                    self.__dict__.update(__file__=init, __package__=self.__name__)
                    exec(code, self.__dict__)
                state = "run"
            except (Exception, SystemExit) as exc:
                state = f"{type(exc).__name__}: {exc}"
            self.__dict__["_init_run"] = state
            if name in self.__dict__:
                return self.__dict__[name]
            lazy = self.__dict__.get("__getattr__")
            if callable(lazy):
                return lazy(name)
        why = "its __init__ not run" if state == "running" else \
            "its __init__ run under stand-ins" if state == "run" else \
            f"its __init__ failed under stand-ins: {state}"
        raise AttributeError(f"{self.__name__} ({why}) has no {name!r}")


def _reexports(package: str, init_file: str) -> Dict[str, tuple]:
    """{name: (module, attribute or None)} for what a package's __init__ imports from the
    trainer's own package (relative or absolute);
    under "*", the modules it star-imports."""
    out: Dict[str, tuple] = {}
    if not os.path.isfile(init_file):
        return out
    with open(init_file, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), init_file)
    for node in tree.body:                       # constants: __version__ = "1.16.0"
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Constant):
            out[node.targets[0].id] = (None, node.value.value)
    for node in ast.walk(tree):
        own = isinstance(node, ast.ImportFrom) and (
            node.level >= 1 or (node.module or "").partition(".")[0] == package.partition(".")[0])
        if own:
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            module = node.module if node.level == 0 else \
                f"{base}.{node.module}" if node.module else base
            for alias in node.names:
                if alias.name == "*":
                    out.setdefault("*", ((), None))
                    out["*"] = (out["*"][0] + (module,), None)
                    continue
                attr = None if node.module is None else alias.name
                target = f"{module}.{alias.name}" if node.module is None else module
                out[alias.asname or alias.name] = (target, attr)
    return out


_GUARDS: Dict[str, List[tuple]] = {}
_CATCHES = ("ImportError", "ModuleNotFoundError", "Exception", "BaseException")


def _guarded(frame) -> bool:
    """Whether the import at `frame`'s line sits in a `try:` whose handlers catch ImportError
    (or a base of it, or everything)."""
    path, line = frame.f_code.co_filename, frame.f_lineno
    if path not in _GUARDS:
        spans = []
        try:
            with open(path, encoding="utf-8") as fh:
                tree = ast.parse(fh.read(), path)
        except (OSError, SyntaxError, ValueError):
            tree = None
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.Try) and node.body and any(
                    h.type is None or any(isinstance(n, (ast.Name, ast.Attribute)) and
                                          (getattr(n, "id", None) or getattr(n, "attr", None))
                                          in _CATCHES for n in ast.walk(h.type))
                    for h in node.handlers):
                spans.append((node.body[0].lineno, node.body[-1].end_lineno))
        _GUARDS[path] = spans
    return any(a <= line <= b for a, b in _GUARDS[path])


class _Loader(importlib.abc.Loader):
    def __init__(self, make):
        self.make = make

    def create_module(self, spec):
        return self.make(spec.name)

    def exec_module(self, module):
        pass


class _Finder(importlib.abc.MetaPathFinder):
    """Resolves the trainer's own modules from its source folder (package inits not run) and
    stands in for the third-party modules that are missing or in ALWAYS_STAND_IN."""

    def __init__(self, source: Source, real: Sequence[str] = (), stand_in: Sequence[str] = ()):
        self.source = source
        self.stood_in: Dict[str, str] = {}      # top-level module -> why
        # ALWAYS_STAND_IN, less the modules this trainer's math needs for real (`real`), plus
        # those its math never uses and that cost time to import (`stand_in`)
        self.always = tuple(m for m in ALWAYS_STAND_IN if m not in real) + tuple(stand_in)
        self.for_time = tuple(stand_in)

    def _missing(self, top: str) -> bool:
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            try:
                if finder.find_spec(top, None) is not None:
                    return False
            except (ImportError, ValueError):
                continue
        return True

    def _importer(self):
        """The frame of the code whose import is being resolved: the first frame past the
        import machinery (importlib's frames) that called this finder, whatever wraps the
        finder's own methods (a mutation tester's trampoline adds frames of its own module);
        called from outside an import, the first frame outside this module and importlib."""
        frame, first_outside, seen_importlib = sys._getframe(1), None, False
        while frame is not None:
            name = frame.f_globals.get("__name__", "")
            if name.startswith("importlib"):
                seen_importlib = True
            elif seen_importlib:
                return frame
            elif first_outside is None and name != __name__:
                first_outside = frame
            frame = frame.f_back
        return first_outside

    def _from_trainer(self, frame) -> bool:
        """Whether the import being resolved was written in the trainer's own code (or in a
        stand-in): only those are stood in; an optional import inside torch or the standard
        library (`try: import dill`) must fail as it would without us."""
        return frame is not None and \
            frame.f_globals.get("__name__", "").partition(".")[0] == self.source.package

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top == self.source.package:
            return self._own_spec(name, top)
        if name in self.for_time and "." in name:      # a submodule of torch (tensorboard's)
            self.stood_in[name] = "not used by the math: stood in"
            return importlib.util.spec_from_loader(name, _Loader(StandInModule), is_package=True)
        if top in REAL or top in sys.stdlib_module_names:
            return None
        frame = self._importer()
        if not self._from_trainer(frame):
            return None
        missing = top not in self.stood_in and self._missing(top)
        if (top in self.always or missing) and _guarded(frame):
            # `try: import torch_npu / except ImportError:` takes its except branch, as it
            # would where the module is not installed
            raise ModuleNotFoundError(f"No module named {name!r} (guarded import: not stood "
                                      f"in)", name=name)
        why = self.stood_in.get(top)
        if why is None:
            if top in self.for_time:
                why = "installed, not used by the math: stood in to save its import"
            elif top in self.always:
                why = "GPU or cluster runtime, not used by the math"
            elif name == top and missing:
                why = "not installed"
            else:
                return None
            self.stood_in[top] = why
        return importlib.util.spec_from_loader(
            name, _Loader(ParallelState if name in PARALLEL_STATE else StandInModule),
            is_package=True)

    def _own_spec(self, name, top):
        bases = [os.path.join(root, *name.split(".")) for root in self.source.roots]
        inits = [os.path.join(b, "__init__.py") for b in bases]
        dirs = [b for b, i in zip(bases, inits)
                if os.path.isfile(i) or os.path.isdir(b) and not os.path.isfile(b + ".py")]
        if dirs:       # a package, or one namespace package spread over several roots
            init = next((i for i in inits if os.path.isfile(i)), inits[0])
            exports = _reexports(name, init)
            if name == top:
                exports.setdefault("__version__", (None, self.source.package_version))
            return importlib.util.spec_from_loader(
                name, _Loader(lambda n: _Package(n, dirs, exports)), is_package=True)
        module = next((b + ".py" for b in bases if os.path.isfile(b + ".py")), None)
        if module is not None:
            return importlib.util.spec_from_file_location(name, module)
        return None


@dataclass
class Loaded:
    """The trainer's math modules, loaded; a context manager that keeps them importable (for
    imports made inside functions) and then restores `sys.modules` and `sys.meta_path`."""
    source: Source
    modules: Sequence[str]
    # installed modules of ALWAYS_STAND_IN the math needs for real (Unsloth asserts on
    # transformers' types at import): imported, not stood in
    real: Sequence[str] = ()
    # installed modules the math never uses, stood in to save their import (verl's tensordict)
    stand_in: Sequence[str] = ()
    # load by file even when installed: its normal import would pull in a whole stack only
    # to fail (ms-swift's package imports modelscope, transformers, trl and datasets)
    by_file: bool = False
    how: str = ""                                        # "imported normally" | "loaded by file"
    stood_in: Dict[str, str] = field(default_factory=dict)
    failed: Dict[str, str] = field(default_factory=dict)  # module -> why it could not load
    _saved: Dict[str, object] = field(default_factory=dict)
    _finder: Optional[_Finder] = None

    def __enter__(self):
        tops = {self.source.package} | set(ALWAYS_STAND_IN) | set(self.stand_in)
        self._saved = {k: v for k, v in sys.modules.items() if k.partition(".")[0] in tops}
        self._before = set(sys.modules)
        self._loaded: Dict[str, types.ModuleType] = {}
        if self.source.origin == "installed" and not self.by_file and self._import_normally():
            self.how = "imported normally"
            return self
        self._forget()
        self._finder = _Finder(self.source, self.real, self.stand_in)
        # a module the load always stands in is stood in also where the process imported it
        # before the card (a user's session, an earlier test): the card is the same whatever
        # ran first; __exit__ puts the saved ones back
        for k in [k for k in self._saved if k.partition(".")[0] in self._finder.always]:
            sys.modules.pop(k, None)
        sys.meta_path.insert(0, self._finder)
        for m in self.modules:
            if not os.path.isfile(self.source.file(m)):
                self.failed[m] = "not in this version (no such file)"
                continue
            try:
                with quiet_warnings():    # e.g. "vLLM version 0+stand.in is not supported"
                    self._loaded[m] = _silently(importlib.import_module, m)
            except (Exception, SystemExit) as exc:         # a module the card cannot use
                # (an import-time sys.exit included: it fails that module's rows, not the card)
                self.failed[m] = (f"{type(exc).__name__}: {exc}" if not isinstance(
                    exc, SystemExit) else f"SystemExit({exc.code!r}) at import") + \
                    "".join(f" ({k}'s __init__ failed under stand-ins: {v})"
                            for k, v in self._failed_inits())
        self.stood_in = dict(self._finder.stood_in)
        self.how = "loaded by file (package __init__ files not run)"
        return self

    @staticmethod
    def _failed_inits():
        """(package, why) for each package `__init__` that was run for a name and failed: an
        import of that name reports only "cannot import name"."""
        return [(k, v.__dict__["_init_run"]) for k, v in list(sys.modules.items())
                if isinstance(v, _Package) and v.__dict__.get("_init_run") not in
                (None, "run", "running")]

    def _import_normally(self) -> bool:
        try:
            with quiet_warnings():
                for m in self.modules:
                    self._loaded[m] = _silently(importlib.import_module, m)
        except (Exception, SystemExit):
            self._loaded.clear()
            return False
        return True

    def _forget(self):
        """Drop the trainer's package and what a failed normal import left of the modules the
        by-file load stands in. Other third-party modules it imported stay: Python has
        already removed the one whose import raised, so those left are whole, and importing one
        a second time is not always possible (datasets registers its Arrow extension types
        once per process)."""
        new = set(sys.modules) - self._before
        stood = set(ALWAYS_STAND_IN) | set(self.stand_in)    # the trainer's stand-ins too
        for k in [k for k in sys.modules if k.partition(".")[0] == self.source.package or
                  k in new and k.partition(".")[0] in stood]:
            del sys.modules[k]

    def __exit__(self, *exc):
        if self._finder is not None and self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        # the stand-ins made after __enter__ too (a re-export resolved on first use)
        tops = {self.source.package} | set(self.stood_in) | \
            set(self._finder.stood_in if self._finder is not None else ())
        dotted = tuple(t + "." for t in tops if "." in t)     # a stood-in submodule of torch
        for k in [k for k in sys.modules if k.partition(".")[0] in tops or k in tops or
                  k.startswith(dotted)]:
            del sys.modules[k]
        sys.modules.update(self._saved)
        importlib.invalidate_caches()
        return False

    def module(self, name: str) -> types.ModuleType:
        if name in self.failed:
            raise ImportError(self.failed[name])
        return self._loaded[name]

    def describe(self) -> List[str]:
        lines = [self.how]
        if self.stood_in:
            lines.append("stand-ins: " + ", ".join(f"{k} ({v})"
                                                   for k, v in sorted(self.stood_in.items())))
        return lines


def version_of(root: str, relative: str) -> Optional[str]:
    """The first line of a version file inside the package folder, or None."""
    try:
        with open(os.path.join(root, relative), encoding="utf-8") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def _silently(fn, *args):
    """fn(*args) with what it prints discarded: a trainer that prints at import (ROLL's
    logger) must not reach the card's output, which may be JSON."""
    import io
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*args)


@contextlib.contextmanager
def quiet_warnings():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def import_installed(trainer: str, modules: Sequence[str]):
    """The installed trainer's `modules` for code that runs them (the live recorders):
    imported normally, or, where that fails for want of a dependency their math never uses (a
    `--no-deps` install: verl's package init imports ray, OpenRLHF's imports peft), loaded by
    file with the stand-ins above. Returns (the modules, the `Loaded` that keeps them
    importable until its `__exit__`, or None). Raises ModuleNotFoundError in one line, saying
    what to install, when the trainer is not installed or a module cannot load even so."""
    from . import get
    t = get(trainer)
    before = set(sys.modules)
    try:
        return [importlib.import_module(m) for m in modules], None
    except ModuleNotFoundError as exc:
        for k in set(sys.modules) - before:      # what the failed import left of the package
            if k.partition(".")[0] == t.package:
                del sys.modules[k]
        if (exc.name or "").partition(".")[0] == t.package:
            raise ModuleNotFoundError(f"{t.package} is not installed; install it with "
                                      f"pip install --no-deps {t.dist}=={t.pinned}",
                                      name=t.package) from None
        missing = exc.name
    loaded = Loaded(locate(t.package, t.dist, None, t.version_of, needs=modules), modules,
                    real=t.real, stand_in=t.stand_in)
    loaded.__enter__()
    if loaded.failed:
        loaded.__exit__(None, None, None)
        name, why = next(iter(loaded.failed.items()))
        raise ModuleNotFoundError(f"{name} needs {missing}, which is not installed, and does "
                                  f"not load without it ({why}); install {t.dist}'s "
                                  f"dependencies: pip install {t.dist}=={t.pinned}",
                                  name=missing)
    return [loaded.module(m) for m in modules], loaded
