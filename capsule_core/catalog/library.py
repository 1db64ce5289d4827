"""Capsule libraries: kernels that live elsewhere, described so that capsules can hold them to
their contracts. A library is a declaration in Python (CapsuleLibrary: its name, sources, build
options, launch plans, own ops and capsules); `load_path` and `load_entry_point` turn one into a
`Library` of KernelCapsules (catalog/kernel_capsules.py, through `kernel_capsule`, as the 46
built-in capsules are made in catalog/native_cuda.py). Imported only when a library is loaded.

A broken declaration (an import error, an unknown op, a kernel its sources do not define) is a
LibraryError naming the library and the line of the declaration at fault.
"""

from __future__ import annotations

import importlib
import re
import sys
import types
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

from capsule_core.catalog.kernel_capsules import Library, kernel_capsule
from capsule_core.errors import CapsuleError
from capsule_core.model import (
    BackendOp,
    BuildOptions,
    KernelCapsule,
    LibraryOp,
    NativeSymbolRef,
    ReductionPolicy,
    TensorLayout,
    TrustLevel,
    VJPMode,
)
from capsule_core.source_files import include_closure


class LibraryError(CapsuleError):
    """A capsule library that cannot be loaded: the message names the library and the line."""


# -- the declaration ------------------------------------------------------------------------


def _caller() -> str:
    """file:line of the declaration being made (the frame that called the dataclass)."""
    frame = sys._getframe(2)
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}"


@dataclass(frozen=True)
class Kernel:
    """One __global__ kernel of a capsule: its name as C++ writes it ("tinylib::row_max",
    "relu_forward<float>", or an extern "C" name), the direction it serves, its C parameter list
    (None: read from the source's definition; a template needs it written out) and its linkage
    (None: as the source defines it)."""

    symbol: str
    direction: str = "forward"
    params: tuple[str, ...] | None = None
    linkage: str | None = None
    declared_at: str = field(default_factory=_caller, compare=False)

    def __post_init__(self):
        if self.direction not in ("forward", "backward"):
            raise LibraryError(
                f"{self.declared_at}: Kernel {self.symbol!r}: direction must be forward or backward, got {self.direction!r}"
            )
        if self.linkage not in (None, "C", "C++"):
            raise LibraryError(f"{self.declared_at}: Kernel {self.symbol!r}: linkage must be C or C++")


@dataclass(frozen=True)
class Capsule:
    """One capsule of a library: the op it implements (a built-in op's name, or one of the
    library's own ops), its kernels, its VJP mode, reduction policy and trust level."""

    op: str
    kernels: tuple[Kernel, ...]
    vjp: str = "backend_vjp"
    reduction: str = "n/a"
    trust: str = "trusted_external"
    layout: str = "flat_row_major"
    description: str = ""
    declared_at: str = field(default_factory=_caller, compare=False)


@dataclass(frozen=True)
class CapsuleLibrary:
    """A library's declaration. Paths are relative to the declaring file's folder. `plans` names
    the module beside it holding PLANS = {op: (forward plan, backward plan)} and optionally
    BUDGET (a KernelBudget); `ops` the library's own ops, each op name to "module:ATTRIBUTE" of
    its OpSpec beside it (imported when the op is first needed, so `list` stays light)."""

    name: str
    capsules: tuple[Capsule, ...]
    sources: tuple[str, ...] = ()
    include_dirs: tuple[str, ...] = ()
    defines: tuple[str, ...] = ()
    nvcc_flags: tuple[str, ...] = ()
    plans: str = "plans"
    ops: Mapping[str, str] = field(default_factory=dict)
    declared_at: str = field(default_factory=_caller, compare=False)


_MODULE_PREFIX = "capsules_library_"


def _package_for(folder: Path) -> str:
    """A synthetic package whose __path__ is `folder`: a declaration and its plans import as
    its modules, relative imports included, without touching sys.path."""
    import hashlib

    name = _MODULE_PREFIX + hashlib.sha256(str(folder).encode()).hexdigest()[:12]
    if name not in sys.modules:
        package = types.ModuleType(name)
        package.__path__ = [str(folder)]
        package.__package__ = name
        sys.modules[name] = package
    return name


def _where(exc: BaseException, folder: Path) -> str:
    """file:line inside the library's folder where `exc` arose (a SyntaxError's own line)."""
    import traceback

    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{Path(exc.filename).name}:{exc.lineno}"
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if Path(frame.filename).resolve().is_relative_to(folder):
            return f"{Path(frame.filename).name}:{frame.lineno}"
    return ""


def _import(module: str, folder: Path, what: str):
    try:
        return importlib.import_module(module)
    except LibraryError:
        raise
    except Exception as exc:  # anything a user's module raises is a broken library, never a traceback
        where = _where(exc, folder)
        raise LibraryError(f"{what}{f' ({where})' if where else ''}: {type(exc).__name__}: {exc}") from exc


def declaration_module(path: Path) -> tuple[str, Path]:
    """(module name, folder) of a declaration: a .py file, or a package folder (its __init__.py,
    else its capsules.py)."""
    path = path.resolve()
    if path.is_file() and path.suffix == ".py":
        return f"{_package_for(path.parent)}.{path.stem}", path.parent
    if path.is_dir():
        if (path / "__init__.py").is_file():
            return f"{_package_for(path.parent)}.{path.name}", path
        if (path / "capsules.py").is_file():
            return f"{_package_for(path)}.capsules", path
        raise LibraryError(f"{path}: a library folder needs an __init__.py or a capsules.py that declares LIBRARY")
    raise LibraryError(f"{path}: not a .py file or a folder")


def load_path(path: str | Path) -> Library:
    """The library declared by a .py file or a package folder (its LIBRARY)."""
    module_name, folder = declaration_module(Path(path))
    module = _import(module_name, folder, f"library {path}")
    declared = getattr(module, "LIBRARY", None)
    if not isinstance(declared, CapsuleLibrary):
        raise LibraryError(
            f"library {path}: {module_name.rsplit('.', 1)[-1]}.py declares no LIBRARY = CapsuleLibrary(...)"
        )
    library = resolve(declared, folder, module.__package__ or module_name, str(path))
    library.path = Path(path).resolve()
    return library


def load_entry_point(name: str, value: str) -> Library:
    """The library of one `capsules.libraries` entry point, "module:ATTRIBUTE" of a CapsuleLibrary."""
    what = f"library entry point {name} ({value})"
    module_name, _, attribute = value.partition(":")
    try:
        module = importlib.import_module(module_name.strip())
        declared = module
        for part in attribute.strip().split("."):
            declared = getattr(declared, part)
    except Exception as exc:  # anything the user's package raises is a broken library
        raise LibraryError(f"{what}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(declared, CapsuleLibrary):
        raise LibraryError(f"{what}: is not a CapsuleLibrary")
    folder = Path(module.__file__).resolve().parent
    return resolve(declared, folder, module.__package__ or module_name, f"entry point {name}")


_NAME = re.compile(r"^[A-Za-z_]\w*$")


def resolve(declared: CapsuleLibrary, folder: Path, package: str, origin: str) -> Library:
    """A declaration's capsules: every kernel found in its sources, every op known."""
    name = declared.name
    at = f"library {name} ({declared.declared_at})"
    if not _NAME.match(name) or name in ("native_cuda", "reference"):
        raise LibraryError(f"{at}: name {name!r} must be an identifier other than native_cuda and reference")
    sources = _translation_units(declared, folder, at)
    include_dirs = tuple(str((folder / d).resolve()) for d in declared.include_dirs)
    for d in include_dirs:
        if not Path(d).is_dir():
            raise LibraryError(f"{at}: include folder {d} does not exist")
    build = BuildOptions(
        name, tuple(map(str, sources)), include_dirs, tuple(declared.defines), tuple(declared.nvcc_flags)
    )
    own = _own_specs(declared, package, folder)
    definitions = _definitions(sources, [Path(d) for d in include_dirs])
    capsules = []
    for c in declared.capsules:
        capsules.append(_capsule(name, c, own, definitions, build, folder))
    seen = set()
    for c in capsules:
        if c.name in seen:
            raise LibraryError(f"{at}: capsule {c.name} is declared twice")
        seen.add(c.name)
    module_name = f"{package}.{declared.plans}"

    def plan_module(capsule):
        return _import(module_name, folder, f"library {name}: plans {declared.plans}.py")

    return Library(name, origin, tuple(capsules), plan_module, own, folder)


def _translation_units(declared: CapsuleLibrary, folder: Path, at: str) -> list[Path]:
    units = []
    for entry in declared.sources:
        path = (folder / entry).resolve()
        if path.is_dir():
            units += sorted(path.rglob("*.cu"))
        elif path.is_file():
            if path.suffix == ".cu":
                units.append(path)
        else:
            raise LibraryError(f"{at}: source {entry} does not exist (looked for {path})")
    if not units:
        raise LibraryError(f"{at}: its sources {list(declared.sources)} hold no .cu file")
    return list(dict.fromkeys(units))


def _own_specs(declared: CapsuleLibrary, package: str, folder: Path) -> dict:
    """{"<library>.<op>": a function returning its OpSpec, renamed so and of family <library>}."""
    specs = {}
    for op, where in declared.ops.items():
        module, _, attribute = where.partition(":")
        at = f"library {declared.name} ({declared.declared_at})"
        if not _NAME.match(op) or not attribute:
            raise LibraryError(
                f"{at}: ops: {op!r}: {where!r} must be 'module:ATTRIBUTE' of an OpSpec, op an identifier"
            )
        specs[f"{declared.name}.{op}"] = _spec_loader(declared.name, op, f"{package}.{module}", attribute, folder)
    return specs


def _spec_loader(library: str, op: str, module: str, attribute: str, folder: Path):
    loaded = []

    def load():
        if not loaded:
            what = f"library {library}: op {op} ({module.rsplit('.', 1)[-1]}:{attribute})"
            spec = getattr(_import(module, folder, what), attribute, None)
            if spec is None or not hasattr(spec, "forward"):
                raise LibraryError(f"{what}: is not an OpSpec")
            loaded.append(replace(spec, name=f"{library}.{op}", family=library))
        return loaded[0]

    return load


def _did_you_mean(name: str, choices) -> str:
    import difflib

    close = difflib.get_close_matches(name, list(choices), n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def _capsule(library: str, c: Capsule, own: dict, definitions, build: BuildOptions, folder: Path) -> KernelCapsule:
    at = f"library {library} ({c.declared_at})"
    if c.op in BackendOp._value2member_map_:
        op = BackendOp(c.op)
    elif f"{library}.{c.op}" in own:
        op = LibraryOp(f"{library}.{c.op}")
    else:
        choices = list(BackendOp._value2member_map_) + [n.split(".", 1)[1] for n in own]
        raise LibraryError(
            f"{at}: unknown op {c.op!r}{_did_you_mean(c.op, choices)} (an op of the library's own goes in its ops=)"
        )
    try:
        vjp_mode, reduction = VJPMode(c.vjp), ReductionPolicy(c.reduction)
        trust, layout = TrustLevel(c.trust), TensorLayout(c.layout)
    except ValueError as exc:
        raise LibraryError(f"{at}: {exc}") from None
    if not c.kernels:
        raise LibraryError(f"{at}: capsule {c.op} declares no kernel")
    refs = {"forward": [], "backward": []}
    for k in c.kernels:
        refs[k.direction].append(_ref(library, k, definitions, build, folder))
    if vjp_mode is not VJPMode.NONE and not refs["backward"]:
        raise LibraryError(f"{at}: capsule {c.op} has a VJP ({vjp_mode.value}) but no backward kernel")
    return kernel_capsule(
        library,
        op,
        tuple(refs["forward"]),
        tuple(refs["backward"]),
        value_summary=f"y = {op.value}(inputs) as the OpSpec's float64 reference computes it.",
        vjp_summary="The OpSpec's reference VJP." if vjp_mode is not VJPMode.NONE else "No reverse derivative.",
        description=c.description or f"{library}'s {op.value} kernels.",
        family=library,
        vjp_mode=vjp_mode,
        reduction=reduction,
        trust=trust,
        layout=layout,
    )


# -- reading the sources ----------------------------------------------------------------------

_GLOBAL = re.compile(
    r'(extern\s+"C"\s+)?__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+'
    r"(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\("
)


@dataclass(frozen=True)
class Definition:
    """Where a source defines a __global__ kernel: its translation unit, file and line, linkage
    and parameter list as written."""

    unit: Path
    file: Path
    line: int
    linkage: str
    params: tuple[str, ...]


def _definitions(units: list[Path], include_dirs: list[Path]) -> dict[str, list[Definition]]:
    """Every __global__ kernel the units define (by its unqualified name)."""
    found: dict[str, list[Definition]] = {}
    for unit in units:
        for file in include_closure(unit, include_dirs):
            text = _strip_comments(file.read_text(errors="replace"))
            for m in _GLOBAL.finditer(text):
                params = _parameter_list(text, m.end())
                line = text.count("\n", 0, m.start(2)) + 1
                linkage = "C" if m.group(1) or _in_extern_c_block(text, m.start()) else "C++"
                found.setdefault(m.group(2), []).append(Definition(unit, file, line, linkage, params))
    return found


def _strip_comments(text: str) -> str:
    """Comments blanked out, newlines kept (so that line numbers stay true)."""

    def blank(m):
        return re.sub(r"[^\n]", " ", m.group(0))

    return re.sub(r"/\*.*?\*/|//[^\n]*", blank, text, flags=re.DOTALL)


def _in_extern_c_block(text: str, position: int) -> bool:
    opened = [m.end() for m in re.finditer(r'extern\s+"C"\s*\{', text[:position])]
    return bool(opened) and text.count("{", opened[-1], position) <= text.count("}", opened[-1], position)


def _parameter_list(text: str, start: int) -> tuple[str, ...]:
    """The parameters of the list that opens at text[start - 1], split at top-level commas."""
    depth, i, parts, current = 1, start, [], []
    while i < len(text) and depth:
        ch = text[i]
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
        if depth and not (ch == "," and depth == 1):
            current.append(ch)
        elif ch == ",":
            parts.append("".join(current))
            current = []
        i += 1
    parts.append("".join(current))
    return tuple(_normalise(p) for p in parts if p.strip() and p.strip() != "void")


def _normalise(param: str) -> str:
    """A parameter as the C-type table spells it: "const float *__restrict__ x" -> "const float* __restrict__ x"."""
    return re.sub(r"\s*\*\s*", "* ", " ".join(param.split())).strip()


def _ref(library: str, k: Kernel, definitions, build: BuildOptions, folder: Path) -> NativeSymbolRef:
    at = f"library {library} ({k.declared_at})"
    short = re.sub(r"<.*>$", "", k.symbol).split("::")[-1]
    found = definitions.get(short, [])
    if not found:
        raise LibraryError(
            f"{at}: kernel {k.symbol!r} is not defined in its sources "
            f"({', '.join(_relative(Path(u), folder) for u in build.sources)})"
            f"{_did_you_mean(short, definitions)}"
        )
    d = found[0]
    linkage = k.linkage or d.linkage
    params = tuple(k.params) if k.params is not None else d.params
    return NativeSymbolRef(
        str(d.unit), k.symbol, params, linkage, build, definition=f"{_relative(d.file, folder)}:{d.line}"
    )


def _relative(path: Path, folder: Path) -> str:
    try:
        return str(path.relative_to(folder))
    except ValueError:
        return str(path)
