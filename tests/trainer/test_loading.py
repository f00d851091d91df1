"""Loading a trainer's math modules by file: package inits not run, relative re-exports resolved,
missing third-party modules stood in (and listed), sys.modules restored afterwards, and usage
errors for a trainer that is not there. The fake trainer here is written for these tests."""
import sys
import textwrap

import pytest

from crosscheck.trainer import loading


def _write(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


@pytest.fixture
def fake(tmp_path):
    _write(tmp_path, {
        "faketrainer/__init__.py": """
            import not_a_real_dependency_xyz      # would fail: the init must not run
            __version__ = "9.9"
            """,
        "faketrainer/utils/__init__.py": """
            from .stats import centred
            from .more import *
            """,
        "faketrainer/utils/stats.py": """
            def centred(x):
                return [v - sum(x) / len(x) for v in x]
            """,
        "faketrainer/utils/more.py": """
            def doubled(x):
                return [2 * v for v in x]
            """,
        "faketrainer/algos.py": """
            import torch
            from missing_heavy_pkg import Trainer, helper
            from missing_heavy_pkg.sub import decorate
            from faketrainer.utils import centred, doubled
            from faketrainer import __version__

            class Mine(Trainer):
                FIELDS = Trainer.FIELDS + ["a"]

            @decorate
            def advantages(x):
                return centred(x)

            def twice(x):
                return doubled(x)
            """,
    })
    return tmp_path


def test_a_module_loads_by_file_with_its_package_init_not_run_and_stand_ins_listed(fake):
    source = loading.locate("faketrainer", "faketrainer", str(fake))
    before = set(sys.modules)
    with loading.Loaded(source, ["faketrainer.algos"]) as loaded:
        assert loaded.failed == {}
        algos = loaded.module("faketrainer.algos")
        assert algos.advantages([1.0, 3.0]) == [-1.0, 1.0]     # the decorator stood in
        assert algos.twice([1.0]) == [2.0]                      # a star re-export
        assert algos.__version__ == "9.9"       # a constant read from the init, not run
        assert loaded.stood_in == {"missing_heavy_pkg": "not installed"}
        assert "missing_heavy_pkg" in " ".join(loaded.describe())
    assert not [m for m in set(sys.modules) - before
                if m.startswith(("faketrainer", "missing_heavy_pkg"))]


def test_a_wrapper_around_the_finder_does_not_hide_the_trainers_imports(fake, monkeypatch):
    """A mutation tester's trampoline calls the finder's methods through frames of its own
    module: the importing frame is still the trainer's, past importlib's frames."""
    namespace = {"__name__": "some_trampoline_module"}
    exec("def wrap(f):\n    def wrapper(*a, **k):\n        return f(*a, **k)\n"
         "    return wrapper\n", namespace)
    monkeypatch.setattr(loading._Finder, "find_spec",
                        namespace["wrap"](loading._Finder.find_spec))
    monkeypatch.setattr(loading._Finder, "_importer",
                        namespace["wrap"](loading._Finder._importer))
    source = loading.locate("faketrainer", "faketrainer", str(fake))
    with loading.Loaded(source, ["faketrainer.algos"]) as loaded:
        assert loaded.failed == {}
        assert loaded.stood_in == {"missing_heavy_pkg": "not installed"}


def test_optional_imports_outside_the_trainer_are_not_stood_in(fake):
    source = loading.locate("faketrainer", "faketrainer", str(fake))
    with loading.Loaded(source, ["faketrainer.algos"]):
        with pytest.raises(ImportError):
            __import__("another_missing_module_abc")          # imported by us, not the trainer


def test_a_path_without_the_package_is_a_usage_error_naming_it(tmp_path):
    with pytest.raises(loading.TrainerNotFound, match="does not hold verl"):
        loading.locate("verl", "verl", str(tmp_path))
    with pytest.raises(loading.TrainerNotFound, match="is not a directory"):
        loading.locate("verl", "verl", str(tmp_path / "nowhere"))


def test_a_package_missing_a_math_module_is_a_usage_error(fake):
    with pytest.raises(loading.TrainerNotFound, match="lacks faketrainer/gone.py"):
        loading.locate("faketrainer", "faketrainer", str(fake), needs=("faketrainer.gone",))


def test_an_uninstalled_trainer_is_a_usage_error_saying_how_to_install():
    with pytest.raises(loading.TrainerNotFound, match="pip install --no-deps"):
        loading.locate("no_such_trainer_pkg", "no-such-trainer")


def test_stand_ins_are_inert():
    mod = loading.StandInModule("heavy")
    cls = mod.Anything
    assert isinstance(cls(1, k=2), loading.StandIn)
    assert not cls() and list(cls()) == [] and len(cls()) == 0

    def f():
        return 1
    assert cls(f) is f and cls()(f) is f and mod.deep.er(f) is f
    assert cls[int] is cls and cls + [1] == [1]


def test_a_class_constant_computed_from_a_stood_in_class_is_a_stand_in():
    # open-instruct: priority: ClassVar[int] = min(CometCallback.priority - 1, ...) where the
    # callbacks come from a library that is not installed
    mod = loading.StandInModule("heavy")
    derived = min(mod.Comet.priority - 1, mod.WandB.priority - 1)
    assert issubclass(derived, loading.StandIn)
    assert issubclass(1 - mod.X, loading.StandIn) and issubclass(mod.X * 2, loading.StandIn)
    assert issubclass(-mod.X, loading.StandIn) and issubclass(mod.X / 2, loading.StandIn)
    assert (mod.X < 0) is True and (mod.X >= 5) is True


def test_a_guarded_import_takes_its_except_branch_and_unpacked_stand_ins_give_tuples(tmp_path):
    _write(tmp_path, {
        "oldtrainer/__init__.py": "",
        "oldtrainer/algos.py": """
            try:
                import torch_npu_missing_xyz                  # guarded: not stood in
                HAS_NPU = True
            except ImportError:
                HAS_NPU = False
            try:
                import vllm                                   # a GPU runtime, guarded
                HAS_VLLM = True
            except Exception:
                HAS_VLLM = False
            from missing_transformers_xyz.utils import is_available

            OK, VERSION = is_available("vllm", return_version=True)
            FIRST, *REST = is_available("x")

            def mean(x):
                return sum(x) / len(x)
            """,
    })
    source = loading.locate("oldtrainer", "oldtrainer", str(tmp_path))
    with loading.Loaded(source, ["oldtrainer.algos"]) as loaded:
        assert loaded.failed == {}, loaded.failed
        algos = loaded.module("oldtrainer.algos")
        assert algos.HAS_NPU is False and algos.HAS_VLLM is False
        assert not algos.OK and isinstance(algos.VERSION, loading.StandIn)
        assert list(algos.REST) == [] and algos.mean([1.0, 3.0]) == 2.0
        assert "torch_npu_missing_xyz" not in loaded.stood_in
        assert "missing_transformers_xyz" in loaded.stood_in


def test_a_release_lacking_one_module_loads_the_others(tmp_path):
    _write(tmp_path, {"partial/__init__.py": "", "partial/a.py": "X = 1\n"})
    source = loading.locate("partial", "partial", str(tmp_path),
                            needs=("partial.a", "partial.b"))
    with loading.Loaded(source, ["partial.a", "partial.b"]) as loaded:
        assert loaded.module("partial.a").X == 1
        assert "not in this version" in loaded.failed["partial.b"]
    with pytest.raises(loading.TrainerNotFound):
        loading.locate("partial", "partial", str(tmp_path), needs=("partial.c",))


def test_a_git_checkout_reports_its_commit_and_whether_it_was_edited(fake):
    import shutil
    import subprocess
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    git = ["git", "-C", str(fake), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "x"], check=True)
    head = subprocess.run(git + ["rev-parse", "--short=12", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    src = loading.locate("faketrainer", "faketrainer", str(fake))
    assert src.version == f"commit {head}"
    (fake / "faketrainer" / "algos.py").write_text("# edited\n")
    src = loading.locate("faketrainer", "faketrainer", str(fake))
    assert src.version == f"commit {head} with uncommitted edits"


def test_a_folder_that_is_not_a_git_checkout_says_so(fake):
    assert loading.locate("faketrainer", "faketrainer", str(fake)).version.startswith(
        "not a git checkout")


def test_a_failed_normal_import_keeps_the_whole_modules_it_imported(tmp_path, monkeypatch):
    # an installed release whose normal import fails after a dependency imported cleanly; that
    # dependency cannot run twice in one process (as datasets registers its Arrow types once),
    # so the by-file load must reuse it rather than import it again
    _write(tmp_path, {
        "oncelib_xyz.py": """
            import sys
            if getattr(sys, "_oncelib_xyz_ran", False):
                raise RuntimeError("oncelib_xyz registered twice")
            sys._oncelib_xyz_ran = True
            VALUE = 3
            """,
        "oldrelease_xyz/__init__.py": "",
        "oldrelease_xyz/algos.py": """
            import oncelib_xyz
            from not_installed_dep_xyz import Thing

            def value():
                return oncelib_xyz.VALUE
            """,
    })
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delattr(sys, "_oncelib_xyz_ran", raising=False)
    source = loading.locate("oldrelease_xyz", "oldrelease_xyz")
    assert source.origin == "installed"
    try:
        with loading.Loaded(source, ["oldrelease_xyz.algos"]) as loaded:
            assert loaded.failed == {}
            assert loaded.how.startswith("loaded by file")
            assert loaded.module("oldrelease_xyz.algos").value() == 3
            assert loaded.stood_in == {"not_installed_dep_xyz": "not installed"}
    finally:
        sys.modules.pop("oncelib_xyz", None)


def test_a_checkout_is_loaded_even_when_the_installed_package_was_imported(tmp_path,
                                                                             monkeypatch):
    # a process that imported the installed trainer (a live audit, say) then audits a patched
    # checkout of it: the card must run the checkout's code, not the imported one
    installed, checkout = tmp_path / "site", tmp_path / "fork"
    for root, value in ((installed, 1), (checkout, 2)):
        _write(root, {"forkme_xyz/__init__.py": "", "forkme_xyz/algos.py": f"VALUE = {value}\n"})
    monkeypatch.syspath_prepend(str(installed))
    import importlib
    assert importlib.import_module("forkme_xyz.algos").VALUE == 1
    try:
        source = loading.locate("forkme_xyz", "forkme_xyz", str(checkout))
        with loading.Loaded(source, ["forkme_xyz.algos"]) as loaded:
            assert loaded.module("forkme_xyz.algos").VALUE == 2
        assert sys.modules["forkme_xyz.algos"].VALUE == 1          # restored afterwards
    finally:
        for k in [k for k in sys.modules if k.startswith("forkme_xyz")]:
            del sys.modules[k]


def test_a_module_that_exits_at_import_fails_its_rows_not_the_card(tmp_path):
    _write(tmp_path, {"exiting_xyz/__init__.py": "",
                      "exiting_xyz/a.py": "import sys\nsys.exit(3)\n",
                      "exiting_xyz/b.py": "X = 1\n"})
    source = loading.locate("exiting_xyz", "exiting_xyz", str(tmp_path))
    with loading.Loaded(source, ["exiting_xyz.a", "exiting_xyz.b"]) as loaded:
        assert loaded.failed == {"exiting_xyz.a": "SystemExit(3) at import"}
        assert loaded.module("exiting_xyz.b").X == 1


def test_a_stand_in_unpacks_through_a_wrapper_around_its_iter(monkeypatch):
    namespace = {"__name__": "some_trampoline_module"}
    exec("def wrap(f):\n    def wrapper(*a, **k):\n        return f(*a, **k)\n"
         "    return wrapper\n", namespace)
    monkeypatch.setattr(loading.StandIn, "__iter__", namespace["wrap"](loading.StandIn.__iter__))
    a, b, *rest = loading.StandIn()()
    assert isinstance(a, loading.StandIn) and isinstance(b, loading.StandIn) and rest == []
    assert list(loading.StandIn()) == []


def test_a_name_a_package_init_defines_or_serves_lazily_comes_from_running_that_init(tmp_path):
    """AReaL's `from areal.infra.platforms import current_platform` (an object the __init__
    builds) and `from areal.api import TrainEngine` (a PEP 562 table): that one __init__ runs,
    once, under the stand-ins; the top package's __init__ still does not."""
    _write(tmp_path, {
        "lazytrainer/__init__.py": """
            raise RuntimeError("the top package's init must not run")
            """,
        "lazytrainer/platforms/__init__.py": """
            import gpu_probe_not_installed_xyz            # stood in
            RUNS = []
            RUNS.append(1)

            class _Platform:
                device = "cpu"

            current_platform = _Platform()
            """,
        "lazytrainer/api/__init__.py": """
            _LAZY = {"Engine": "lazytrainer.api.engine"}

            def __getattr__(name):
                if name in _LAZY:
                    import importlib
                    return getattr(importlib.import_module(_LAZY[name]), name)
                raise AttributeError(name)
            """,
        "lazytrainer/api/engine.py": """
            class Engine:
                kind = "engine"
            """,
        "lazytrainer/broken/__init__.py": """
            raise ValueError("no cluster here")
            """,
        "lazytrainer/math.py": """
            from lazytrainer.platforms import current_platform
            from lazytrainer.api import Engine
            from lazytrainer import platforms

            def device():
                return current_platform.device, Engine.kind, len(platforms.RUNS)
            """,
        "lazytrainer/uses_broken.py": """
            from lazytrainer.broken import thing
            """,
    })
    source = loading.locate("lazytrainer", "lazytrainer", str(tmp_path))
    with loading.Loaded(source, ["lazytrainer.math", "lazytrainer.uses_broken"]) as loaded:
        assert loaded.module("lazytrainer.math").device() == ("cpu", "engine", 1)
        assert "gpu_probe_not_installed_xyz" in loaded.stood_in
        why = loaded.failed["lazytrainer.uses_broken"]
        assert "lazytrainer.broken" in why and "ValueError: no cluster here" in why, why
    assert "lazytrainer" not in sys.modules and "lazytrainer.platforms" not in sys.modules


def test_a_checkout_split_over_several_source_roots_loads_as_one_package(tmp_path):
    """prime-rl's layout: src/ and packages/<name>/src/ each hold part of one package, neither
    with a top __init__.py; a module in one root imports from the other."""
    _write(tmp_path, {
        "src/splittrainer/trainer/rl/__init__.py": "",
        "src/splittrainer/trainer/rl/loss.py": """
            from splittrainer.configs.trainer import LossConfig
            from splittrainer.utils.helpers import doubled

            def scaled(x):
                return doubled(x) * LossConfig.tau
            """,
        "src/splittrainer/utils/helpers.py": """
            def doubled(x):
                return 2 * x
            """,
        "packages/splittrainer-configs/src/splittrainer/configs/__init__.py": "",
        "packages/splittrainer-configs/src/splittrainer/configs/trainer.py": """
            import missing_settings_lib_xyz

            class LossConfig:
                tau = 0.5
            """,
        "packages/splittrainer-configs/src/splittrainer/utils/config.py": "X = 1\n",
    })
    source = loading.locate("splittrainer", "splittrainer", str(tmp_path))
    assert source.root == str(tmp_path / "src")
    assert source.more_roots == (str(tmp_path / "packages/splittrainer-configs/src"),)
    configs = source.file("splittrainer.configs.trainer")
    assert configs == str(tmp_path / "packages/splittrainer-configs/src/splittrainer/configs"
                                     "/trainer.py")
    assert source.relative(configs) == "splittrainer/configs/trainer.py"
    with loading.Loaded(source, ["splittrainer.trainer.rl.loss"]) as loaded:
        assert loaded.module("splittrainer.trainer.rl.loss").scaled(3) == 3.0
        assert "missing_settings_lib_xyz" in loaded.stood_in
        assert sys.modules["splittrainer.utils"].__path__ == [
            str(tmp_path / "src/splittrainer/utils"),
            str(tmp_path / "packages/splittrainer-configs/src/splittrainer/utils")]


def test_an_unpacked_wheel_gives_its_version_from_the_metadata_beside_the_package(tmp_path):
    _write(tmp_path, {"wheeltrainer_xyz/__init__.py": "",
                      "wheeltrainer_xyz-1.2.3.dist-info/METADATA":
                          "Metadata-Version: 2.1\nName: wheeltrainer-xyz\nVersion: 1.2.3\n"})
    source = loading.locate("wheeltrainer_xyz", "wheeltrainer-xyz", str(tmp_path))
    assert source.package_version == "1.2.3"
    assert source.version == "not a git checkout (package version 1.2.3)"


def test_an_importable_package_without_distribution_metadata_reads_its_version_file(
        tmp_path, monkeypatch):
    _write(tmp_path, {"bareinstall_xyz/__init__.py": "", "bareinstall_xyz/VERSION": "0.4.2\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    source = loading.locate("bareinstall_xyz", "bareinstall-xyz", version_file=lambda root:
                            loading.version_of(root, "bareinstall_xyz/VERSION"))
    assert (source.origin, source.root, source.version) == ("installed", str(tmp_path), "0.4.2")
    # without a version file either, the card says it does not know
    bare = loading.locate("bareinstall_xyz", "bareinstall-xyz")
    assert bare.version == "unknown version"


def test_an_installed_module_the_math_never_uses_can_be_stood_in_to_save_its_import(
        tmp_path, monkeypatch):
    """verl's DataProto imports tensordict, which no row uses: the verl card stands it in
    (Trainer.stand_in) and says why."""
    monkeypatch.delitem(sys.modules, "cloudpickle", raising=False)
    _write(tmp_path, {"slowimport_xyz/__init__.py": "",
                      "slowimport_xyz/math.py": "import cloudpickle\n\ndef f(x):\n    return x\n"})
    source = loading.locate("slowimport_xyz", "slowimport_xyz", str(tmp_path))
    with loading.Loaded(source, ["slowimport_xyz.math"], stand_in=("cloudpickle",)) as loaded:
        assert loaded.module("slowimport_xyz.math").f(2) == 2
        assert isinstance(loaded.module("slowimport_xyz.math").cloudpickle,
                          loading.StandInModule)
        assert loaded.stood_in["cloudpickle"] == ("installed, not used by the math: stood in to "
                                                  "save its import")
    import cloudpickle                               # the real module is untouched afterwards
    assert not isinstance(cloudpickle, loading.StandInModule)


def test_an_import_time_version_gate_on_a_stood_in_library_passes():
    # NeMo-RL's policy package asserts Version(transformers.__version__) < Version("5.12.0")
    # at import; with packaging itself stood in (a bare environment) the gate must not raise
    version = loading.StandInModule("packaging.version").Version
    assert version("0+stand.in") < version("5.12.0")
    assert version("1") >= version("2") and version("1") <= version("2")


def test_a_stood_in_object_indexed_at_import_and_a_base_method_deleted_load(tmp_path):
    # ms-swift's logger does `ms_logger.handlers[0].setFormatter(...)` on modelscope's logger,
    # and its GRPOTrainer module `del HFGRPOTrainer.__init__` on TRL's class, both at import
    _write(tmp_path, {"indexing_xyz/__init__.py": "", "indexing_xyz/math.py": """
        from missing_logger_pkg import get_logger
        from missing_base_pkg import Base

        get_logger().handlers[0].setFormatter("fmt")
        del Base.__init__

        class Mine(Base):
            def double(self, x):
                return 2 * x
        """})
    source = loading.locate("indexing_xyz", "indexing_xyz", str(tmp_path))
    with loading.Loaded(source, ["indexing_xyz.math"]) as loaded:
        assert not loaded.failed
        assert loaded.module("indexing_xyz.math").Mine().double(3) == 6


def test_a_trainer_loaded_by_file_never_tries_its_normal_import(tmp_path, monkeypatch):
    """Trainer.by_file (ms-swift): an installed package whose normal import would pull in a
    whole stack only to fail is loaded by file at once, its package __init__ not run."""
    _write(tmp_path, {"byfile_xyz/__init__.py": "raise RuntimeError('the init ran')\n",
                      "byfile_xyz/math.py": "def f(x):\n    return x + 1\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    source = loading.locate("byfile_xyz", "byfile_xyz", str(tmp_path))
    source.origin = "installed"              # as find_spec reports an installed package
    tried = []
    monkeypatch.setattr(loading.Loaded, "_import_normally",
                        lambda self: tried.append(True) or False)
    with loading.Loaded(source, ["byfile_xyz.math"], by_file=True) as loaded:
        assert loaded.how.startswith("loaded by file") and not tried
        assert loaded.module("byfile_xyz.math").f(1) == 2
    with loading.Loaded(source, ["byfile_xyz.math"]) as loaded:
        assert tried == [True]                # without by_file it tries the normal import first


def test_a_failed_normal_import_leaves_no_real_copy_of_a_module_the_trainer_stands_in(
        tmp_path, monkeypatch):
    """The normal import of an installed trainer imports a library the card stands in, then
    fails: the by-file load must meet the stand-in, not the real module left behind (ms-swift's
    trl, whose real GRPOTrainer would fail under stood-in transformers)."""
    _write(tmp_path, {"realdep_xyz/__init__.py": "VALUE = 'real'\n",
                      "partial_xyz/__init__.py": "import realdep_xyz\nimport missing_pkg_xyz\n",
                      "partial_xyz/math.py": "import realdep_xyz\n\ndef f():\n"
                                             "    return realdep_xyz.VALUE\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "realdep_xyz", raising=False)
    source = loading.locate("partial_xyz", "partial_xyz", str(tmp_path))
    source.origin = "installed"
    with loading.Loaded(source, ["partial_xyz.math"], stand_in=("realdep_xyz",)) as loaded:
        assert loaded.how.startswith("loaded by file")
        assert isinstance(loaded.module("partial_xyz.math").realdep_xyz, loading.StandInModule)


def test_a_module_always_stood_in_is_stood_in_also_where_it_was_imported_before(tmp_path):
    """A by-file load is the same whatever the process imported first (a user's session, an
    earlier test): NeMo-RL's policy package asserts a transformers version at import, which the
    stand-in passes and the installed transformers fails. The real module is back afterwards."""
    import cloudpickle                               # imported before the load
    _write(tmp_path, {"preimported_xyz/__init__.py": "",
                      "preimported_xyz/math.py": "import cloudpickle\n\ndef f(x):\n    return x\n"})
    source = loading.locate("preimported_xyz", "preimported_xyz", str(tmp_path))
    with loading.Loaded(source, ["preimported_xyz.math"], stand_in=("cloudpickle",)) as loaded:
        assert isinstance(loaded.module("preimported_xyz.math").cloudpickle,
                          loading.StandInModule)
    assert sys.modules["cloudpickle"] is cloudpickle
