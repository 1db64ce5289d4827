"""The catalog: the capsule libraries (the built-in native CUDA capsules first, then those found
by discovery or named by --library) and the CPU reference twins, validated on load. Lookup by
capsule or op name with did-you-mean, and filters (the planner is planner.py)."""

from __future__ import annotations

import difflib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from capsule_core.catalog import native_cuda, reference
from capsule_core.catalog.kernel_capsules import Library
from capsule_core.errors import RegistryError, UnknownNameError
from capsule_core.model import (
    BackendOp,
    KernelCapsule,
    LibraryOp,
    ReductionPolicy,
    VJPMode,
    contracts_aligned,
    same_identity,
)


def validate_catalog(capsules) -> tuple[KernelCapsule, ...]:
    """Unique names, unique identities (module, op, provider, device), aligned contracts; else RegistryError."""
    names: set[str] = set()
    identities: dict[tuple, KernelCapsule] = {}
    for c in capsules:
        if c.name in names:
            raise RegistryError(f"capsule name {c.name!r} is registered twice")
        key = (c.module, c.op, c.provider, c.device)
        twin = identities.get(key)
        if twin is not None and same_identity(twin, c):
            raise RegistryError(
                f"{c.name} and {twin.name} have the same identity ({c.op.value}, {c.provider.value}, {c.device.value})"
            )
        if not contracts_aligned(c):
            raise RegistryError(
                f"{c.name}: contracts are not aligned (each descriptor must state its own "
                f"obligation, the layout claim must be the layout, the VJP claim the VJP mode)"
            )
        names.add(c.name)
        identities[key] = c
    return tuple(capsules)


LIBRARIES_ENV = "CAPSULES_LIBRARIES"
"""Capsule library declarations to load, an os.pathsep-separated list of .py files or folders."""
ENTRY_POINT_GROUP = "capsules.libraries"
"""Installed packages declare their libraries here: `tinylib = "tinylib.capsules:LIBRARY"`."""


@dataclass(frozen=True)
class LibraryFailure:
    """A library that did not load: where it came from and why (the message names the line)."""

    source: str
    message: str


def _library():
    """catalog/library.py, the declaration's loader: imported only when a library is loaded."""
    from capsule_core.catalog import library

    return library


def installed_entry_points(group: str) -> list[tuple[str, str]]:
    """(name, "module:attribute") of each entry point in `group` of the distributions on sys.path,
    read from their entry_points.txt (importlib.metadata would parse every distribution's metadata
    first: 13 ms of `capsules list`). The first distribution on the path wins a name."""
    found: dict[str, str] = {}
    for folder in sys.path:
        try:
            entries = list(os.scandir(folder or "."))
        except OSError:
            continue
        for entry in entries:
            if not entry.name.endswith((".dist-info", ".egg-info")):
                continue
            try:
                text = Path(entry.path, "entry_points.txt").read_text(encoding="utf-8")
            except OSError:
                continue
            for name, value in _section(text, group):
                found.setdefault(name, value)
    return list(found.items())


def _section(text: str, group: str) -> list[tuple[str, str]]:
    """The `name = value` lines of [group] in an entry_points.txt."""
    out, inside = [], False
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            inside = line == f"[{group}]"
        elif inside and "=" in line and not line.startswith(("#", ";")):
            name, _, value = line.partition("=")
            out.append((name.strip(), value.strip()))
    return out


class _Libraries:
    """The libraries of this process: the built-in one, those found by discovery (the entry
    point group and CAPSULES_LIBRARIES, once, on first use) and those added by --library."""

    def __init__(self):
        self.loaded: list[Library] = []
        self.failures: list[LibraryFailure] = []
        self.paths: list[str] = []
        self.discovered = False
        self.catalog: tuple[KernelCapsule, ...] | None = None

    def discover(self):
        if self.discovered:
            return
        self.discovered = True
        for path in filter(None, os.environ.get(LIBRARIES_ENV, "").split(os.pathsep)):
            self._add(path, f"{LIBRARIES_ENV} entry {path}", lambda p=path: _library().load_path(p))
        for name, value in installed_entry_points(ENTRY_POINT_GROUP):
            self._add(value, f"entry point {name}", lambda n=name, v=value: _library().load_entry_point(n, v))

    def add_paths(self, paths) -> list[LibraryFailure]:
        self.discover()
        failures = []
        for path in paths:
            failure = self._add(path, f"--library {path}", lambda p=path: _library().load_path(p))
            if failure is None:
                self.paths.append(str(Path(path).resolve()))
            else:
                failures.append(failure)
        return failures

    def _add(self, key: str, source: str, load) -> LibraryFailure | None:
        resolved = str(Path(key).resolve()) if os.sep in key or key.endswith(".py") else key
        if any(lib.path is not None and str(lib.path) == resolved for lib in self.loaded):
            return None
        try:
            library = load()
            taken = {lib.name: lib.origin for lib in (*BUILT_IN, *self.loaded)}
            if library.name in taken:
                raise RegistryError(f"library {library.name} is already loaded (from {taken[library.name]})")
            validate_catalog([c for lib in (*BUILT_IN, *self.loaded, library) for c in lib.capsules])
        except (_library().LibraryError, RegistryError) as exc:
            failure = LibraryFailure(source, str(exc))
            self.failures.append(failure)
            return failure
        if library.specs:
            from capsule_core.ops import register_spec

            for name, load in library.specs.items():
                register_spec(name, load)
        self.loaded.append(library)
        self.catalog = None
        return None


BUILT_IN: tuple[Library, ...] = (native_cuda.LIBRARY,)
_STATE = _Libraries()


def use_libraries(paths) -> list[LibraryFailure]:
    """Load the libraries declared at `paths` (--library) beside the discovered ones; the
    failures, each naming the library and the line (the libraries that loaded stay)."""
    return _STATE.add_paths(paths)


def libraries() -> tuple[Library, ...]:
    """Every library of this process, the built-in one first."""
    _STATE.discover()
    return (*BUILT_IN, *_STATE.loaded)


def library_failures() -> tuple[LibraryFailure, ...]:
    _STATE.discover()
    return tuple(_STATE.failures)


def library_paths() -> tuple[str, ...]:
    """The declarations added by --library: what a worker process loads again."""
    return tuple(_STATE.paths)


def modules() -> dict[str, tuple[KernelCapsule, ...]]:
    """Registry modules in catalog order: the built-in capsules, their CPU reference twins, then
    each library's capsules."""
    libs = libraries()
    return {
        libs[0].name: libs[0].capsules,
        "reference": reference.CAPSULES,
        **{lib.name: lib.capsules for lib in libs[1:]},
    }


def catalog() -> tuple[KernelCapsule, ...]:
    """Every capsule of every module, validated."""
    _STATE.discover()
    if _STATE.catalog is None:
        _STATE.catalog = validate_catalog([c for m in modules().values() for c in m])
    return _STATE.catalog


def kernel_capsules() -> list[KernelCapsule]:
    """The capsules that launch CUDA kernels (every library's): what --all means."""
    return [c for lib in libraries() for c in lib.capsules]


def library_of(capsule: KernelCapsule) -> Library | None:
    """The library that declares `capsule` (None for a CPU reference twin)."""
    return next((lib for lib in libraries() if lib.name == capsule.module), None)


def launches_kernels(capsule: KernelCapsule) -> bool:
    return library_of(capsule) is not None


def lookup(name: str) -> KernelCapsule:
    """A capsule by its name (`native_cuda.relu`, `tinylib.softmax`) or an op name (`relu`, the
    built-in capsule)."""
    by_name = {c.name: c for c in catalog()}
    if name in by_name:
        return by_name[name]
    built_in = {c.op.value: c for c in BUILT_IN[0].capsules}
    if name in built_in:
        return built_in[name]
    choices = list(built_in) + list(by_name)
    hint = next((f.message for f in library_failures() if name.split(".")[0] in f.message), None)
    error = UnknownNameError("capsule", name, tuple(difflib.get_close_matches(name, choices, n=3, cutoff=0.6)))
    if hint:
        error.args = (f"{error.args[0]} (a library failed to load: {hint})",)
    raise error


def short_name(capsule: KernelCapsule) -> str:
    """The shortest name lookup takes back to `capsule`: its op's for the capsule an op name
    stands for (the built-in one), else its full name."""
    built_in = {c.op.value: c for c in BUILT_IN[0].capsules}
    return capsule.op.value if built_in.get(capsule.op.value) is capsule else capsule.name


def library_option(capsule: KernelCapsule) -> str:
    """ " --library PATH" for a capsule whose library was loaded from a declaration (relative to the
    working folder when inside it), "" for any other: what a rerun line needs."""
    library = library_of(capsule)
    if library is None or library.path is None:
        return ""
    try:
        shown = library.path.relative_to(Path.cwd())
    except ValueError:
        shown = library.path
    return f" --library {shown}"


def lookup_many(names) -> list[KernelCapsule]:
    """Capsules by name; a library's name stands for all its capsules."""
    out = []
    for name in names:
        library = next((lib for lib in libraries() if lib.name == name), None)
        out += list(library.capsules) if library is not None else [lookup(name)]
    return list(dict.fromkeys(out))


def parse_op(name: str) -> BackendOp | LibraryOp:
    if name in BackendOp._value2member_map_:
        return BackendOp(name)
    for c in catalog():
        if c.op.value == name:
            return c.op
    choices = [o.value for o in BackendOp] + [c.op.value for c in catalog() if isinstance(c.op, LibraryOp)]
    raise UnknownNameError("op", name, tuple(difflib.get_close_matches(name, choices, n=3, cutoff=0.6)))


def filter_capsules(
    module: str | None = None,
    family: str | None = None,
    vjp: VJPMode | None = None,
    reduction: ReductionPolicy | None = None,
) -> list[KernelCapsule]:
    names = modules()
    if module is not None and module not in names:
        raise UnknownNameError("module", module, tuple(difflib.get_close_matches(module, names, n=2)))
    families = sorted({c.family for c in catalog()})
    if family is not None and family not in families:
        raise UnknownNameError("family", family, tuple(difflib.get_close_matches(family, families, n=2)))
    return [
        c
        for c in catalog()
        if (module is None or c.module == module)
        and (family is None or c.family == family)
        and (vjp is None or c.vjp_mode is vjp)
        and (reduction is None or c.numerical_policy.reduction is reduction)
    ]
