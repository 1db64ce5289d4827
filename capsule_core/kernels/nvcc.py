"""The nvcc layer: where the CUDA sources live, which nvcc compiles them, and a content-hash
cache of cubins, PTX and ptxas reports."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Callable, Mapping

from capsule_core.errors import CapsuleError, EnvironmentMissing
from capsule_core.source_files import include_closure

_PACKAGE = Path(__file__).resolve().parent.parent
"""capsule_core: the CUDA sources ship inside it as _cuda (a wheel) or sit beside it as cuda/ (a checkout)."""


SOURCES_ENV = "CAPSULES_CUDA_DIR"
"""A folder that replaces the shipped kernel sources (a patched copy of cuda/, e.g. a planted
defect): every build, nvcc's and the emulator's, reads it instead."""


def cuda_source_dir() -> Path:
    """The folder of the .cu/.cuh sources: $CAPSULES_CUDA_DIR when set, else inside the package in
    a wheel (capsule_core/_cuda), else the top-level cuda/ of a checkout or an editable install.
    cuda/ is data, never a package."""
    return _source_dir(os.environ.get(SOURCES_ENV) or None)


@lru_cache(maxsize=None)
def _source_dir(override: str | None) -> Path:
    """cuda_source_dir for one value of $CAPSULES_CUDA_DIR, looked up once: every launch of the
    emulator asks for it (a lookup globs two folders)."""
    if override:
        folder = Path(override)
        if not folder.is_dir() or not any(folder.glob("*.cu*")):
            raise EnvironmentMissing(f"{SOURCES_ENV}={override}: not a folder of .cu/.cuh kernel sources")
        return folder
    for candidate in (_PACKAGE / "_cuda", _PACKAGE.parent / "cuda"):
        if candidate.is_dir() and any(candidate.glob("*.cu*")):
            return candidate
    raise EnvironmentMissing(
        f"the CUDA sources are missing: looked in {_PACKAGE / '_cuda'} and "
        f"{_PACKAGE.parent / 'cuda'}; reinstall the package"
    )


def source_path(path: str) -> Path:
    """A NativeSymbolRef path resolved to a file on this machine: a library's absolute path as it
    is, a shipped source ("cuda/pointwise.cu") in cuda_source_dir()."""
    if Path(path).is_absolute():
        return Path(path)
    return cuda_source_dir() / Path(path).name


def build_flags(build) -> list[str]:
    """The include folders, defines and extra flags of a library's BuildOptions (None: none)."""
    if build is None:
        return []
    flags = [f for d in build.include_dirs for f in ("-I", d)]
    return flags + [f"-D{d}" for d in build.defines]


DEFAULT_CUDA = Path("/usr/local/cuda")


@dataclass(frozen=True)
class Nvcc:
    path: Path
    version: str
    found_by: str


NVCC_RULES = ("CUDA_HOME", "CUDA_PATH", "PATH", str(DEFAULT_CUDA))
"""Where find_nvcc looks, in order: $CUDA_HOME/bin, $CUDA_PATH/bin, the first nvcc on PATH, then
/usr/local/cuda/bin. An Nvcc's `found_by` names the rule that found it."""


def find_nvcc() -> Nvcc:
    """nvcc through CUDA_HOME, CUDA_PATH, PATH or /usr/local/cuda, in that order. A CUDA_HOME or
    CUDA_PATH that is set names the toolkit the user asked for: without nvcc it is an error, never a
    silent fall back to another toolkit."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            path = Path(os.environ[var]) / "bin" / "nvcc"
            if not _executable(path):
                raise EnvironmentMissing(
                    f"{var}={os.environ[var]} holds no nvcc (no executable {path}): point {var} "
                    f"at a CUDA toolkit, or unset it to search PATH and {DEFAULT_CUDA}"
                )
            return Nvcc(path, _nvcc_version(path), var)
    candidates = []
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append((Path(on_path), "PATH"))
    candidates.append((DEFAULT_CUDA / "bin" / "nvcc", str(DEFAULT_CUDA)))
    for path, how in candidates:
        if _executable(path):
            return Nvcc(path, _nvcc_version(path), how)
    raise EnvironmentMissing(
        "nvcc not found (looked in $CUDA_HOME/bin, $CUDA_PATH/bin, PATH and "
        "/usr/local/cuda/bin): install the CUDA toolkit or set CUDA_HOME"
    )


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _nvcc_version(path: Path) -> str:
    """nvcc's version, asked once per executable file as it is now (a process finds nvcc for
    every capsule it checks, and `nvcc --version` costs 3 ms)."""
    status = path.stat()
    return _version_of(str(path), status.st_ino, status.st_size, status.st_mtime_ns)


@lru_cache(maxsize=None)
def _version_of(path: str, inode: int, size: int, mtime_ns: int) -> str:
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    match = re.search(r"release ([\d.]+), V([\d.]+)", out)
    return match.group(2) if match else out.strip().splitlines()[-1] if out.strip() else "unknown"


def cache_dir() -> Path:
    """The user cache folder for compiled kernels and the fuzz database (CAPSULES_CACHE overrides)."""
    if os.environ.get("CAPSULES_CACHE"):
        return Path(os.environ["CAPSULES_CACHE"])
    import platformdirs

    return Path(platformdirs.user_cache_dir("capsules"))


# -- compilation ------------------------------------------------------------------------------

COMPILE_FLAGS = ("-std=c++17", "-O3", "-prec-div=true", "-prec-sqrt=true", "-ftz=false", "-fmad=true")
"""Every flag that reaches nvcc. Numerics-changing flags are explicit (no fast-math, no
flush-to-zero, IEEE division and square root; FMA contraction on) and recorded in results."""
ARCHES = ("sm_80", "sm_90")
CACHE_FORMAT = 1


class CompileError(CapsuleError):
    """nvcc refused a source: the command, nvcc's message and the source lines around the error."""

    def __init__(self, source: Path, command: list[str], output: str):
        self.source, self.command, self.output = source, command, output
        super().__init__(
            f"nvcc failed on {source.name}:\n{output.strip()}\n{_error_context(output)}command: {' '.join(command)}"
        )


def _error_context(output: str) -> str:
    """The numbered source lines around the first `file(line): error` nvcc reports."""
    match = re.search(r"^(.+?)\((\d+)\): (?:catastrophic )?error", output, re.MULTILINE)
    if not match or not Path(match.group(1)).is_file():
        return ""
    path, line = Path(match.group(1)), int(match.group(2))
    lines = path.read_text(errors="replace").splitlines()
    lo, hi = max(0, line - 3), min(len(lines), line + 2)
    body = "\n".join(f"{'>' if i + 1 == line else ' '}{i + 1:5d} | {lines[i]}" for i in range(lo, hi))
    return f"{path.name}:{line}:\n{body}\n"


def content_key(header: str, paths) -> str:
    """A cache key: `header` (tools, versions, flags) and every file of `paths`, name and bytes."""
    digest = hashlib.sha256()
    digest.update(header.encode())
    for path in sorted(paths, key=lambda p: (p.name, str(p))):
        digest.update(f"{path.name}\n".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:32]


def cache_key(source: Path, arch: str, nvcc: Nvcc, build=None) -> str:
    extra = " ".join(build_flags(build) + list(build.nvcc_flags if build else ()))
    return content_key(
        f"format={CACHE_FORMAT}\narch={arch}\nnvcc={nvcc.version}\nflags={' '.join(COMPILE_FLAGS)}\n"
        + (f"build={extra}\n" if extra else ""),
        include_closure(source, build.include_dirs if build else ()),
    )


@dataclass(frozen=True)
class KernelResources:
    """ptxas's report for one entry point."""

    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    shared_bytes: int


REGISTERS_PER_SM = 65536
"""The register file of one multiprocessor (sm_80, sm_90)."""
MAX_REGISTERS_PER_THREAD = 255


def register_budget(threads: int, blocks_per_sm: int = 1) -> int:
    """The most registers per thread with which `blocks_per_sm` blocks of `threads` threads share
    one multiprocessor: the budget behind __launch_bounds__(threads, blocks_per_sm)."""
    return min(MAX_REGISTERS_PER_THREAD, REGISTERS_PER_SM // (threads * blocks_per_sm))


@dataclass(frozen=True)
class KernelBudget:
    """What a family's kernels may use, declared beside its launch plans (plans/<family>.BUDGET):
    registers per thread (the occupancy the plans are sized for), no spills, no stack frame except
    where a slow path is declared, no nvcc warning. `capsules check` fails a kernel over it and the
    family tests read the same budget, so the gate and the tests cannot disagree."""

    max_registers: int
    """Per thread, for every entry point of the family not in `registers`."""
    registers: Mapping[str, int] = field(default_factory=dict)
    """Entry points with a budget of their own (a GEMM's __launch_bounds__ minimum blocks)."""
    stack_frames: Mapping[str, str] = field(default_factory=dict)
    """Entry points allowed a stack frame, each with the reason (a libm slow path)."""

    def registers_for(self, symbol: str) -> int:
        return self.registers.get(symbol, self.max_registers)

    def describe(self, symbol: str) -> str:
        stack = f"a stack frame for {self.stack_frames[symbol]}" if symbol in self.stack_frames else "no stack frame"
        return f"at most {self.registers_for(symbol)} registers, no spills, {stack}"

    def problems(self, symbol: str, used: KernelResources) -> list[str]:
        """Each way ptxas's figures for `symbol` exceed its budget, naming the figure and the budget."""
        out = []
        if used.registers > self.registers_for(symbol):
            out.append(f"{symbol}: {used.registers} registers, over its budget of {self.registers_for(symbol)}")
        if used.spill_stores or used.spill_loads:
            out.append(
                f"{symbol}: spills {used.spill_stores} bytes stored and {used.spill_loads} loaded, over its budget of 0"
            )
        if used.stack_bytes and symbol not in self.stack_frames:
            out.append(f"{symbol}: a {used.stack_bytes}-byte stack frame, over its budget of 0 (no slow path declared)")
        return out


@dataclass(frozen=True)
class PtxParam:
    ptx_type: str
    """u64, u32, f32, ... (PTX does not mark pointers: a pointer is a u64)."""


@dataclass(frozen=True)
class CompiledFile:
    source: Path
    arch: str
    cubin: bytes
    ptx: str
    log: str
    cached: bool

    @cached_property
    def entries(self) -> dict[str, tuple[PtxParam, ...]]:
        """The PTX's entries and their parameters, parsed once (check asks for every symbol of
        the file, on every size of every capsule that shares it)."""
        return parse_ptx_entries(self.ptx)

    def entry_name(self, ref) -> str | None:
        """The PTX .entry of a NativeSymbolRef: its symbol for C linkage; for C++ linkage the one
        mangled entry whose demangled name (c++filt) is the symbol with its parameter list (None
        when there is none, or several: overloads the declaration cannot tell apart)."""
        if ref.linkage == "C":
            return ref.symbol if ref.symbol in self.entries else None
        found = [m for m, d in demangled_names(tuple(self.entries)).items() if _kernel_name(d) == ref.symbol]
        return found[0] if len(found) == 1 else None

    @cached_property
    def resources(self) -> dict[str, KernelResources]:
        """ptxas's report by PTX entry (a C++ kernel's mangled name), parsed once."""
        return parse_ptxas_resources(self.log)

    def resources_of(self, ref) -> KernelResources | None:
        """ptxas's report for a NativeSymbolRef, found by its entry name."""
        name = self.entry_name(ref)
        return self.resources.get(name) if name else None

    @property
    def warnings(self) -> list[str]:
        """nvcc's and ptxas's warning lines, each once (nvcc's host and device passes both report a
        source warning), without the remark on how to suppress them."""
        return list(dict.fromkeys(line for line in self.log.splitlines() if _WARNING.search(line)))


_WARNING = re.compile(r"\bwarning\s*(#\S+\s*)?:", re.IGNORECASE)
"""nvcc's `file(line): warning #177-D: ...`, ptxas's `ptxas warning : ...`, the host compiler's `warning: ...`."""
_ENTRY = re.compile(r"\.entry\s+(\w+)\s*\(([^)]*)\)", re.DOTALL)
_PARAM = re.compile(r"\.param\s+\.(\w+)(?:\s+\.ptr)?(?:\s+\.\w+)*\s+\w+(\[\d+\])?")


@lru_cache(maxsize=None)
def demangled_names(names: tuple[str, ...]) -> dict[str, str]:
    """{PTX entry: its C++ name with its parameter list} through c++filt, which comes with the
    compiler; a name c++filt does not know (C linkage) stands for itself."""
    tool = shutil.which("c++filt")
    if tool is None or not names:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, timeout=60).stdout
    lines = out.splitlines()
    return dict(zip(names, lines)) if len(lines) == len(names) else {n: n for n in names}


def _kernel_name(demangled: str) -> str:
    """ "lib::scale<float>" of "void lib::scale<float>(float const*, float*, float, unsigned long)"
    (c++filt writes a template instance's return type, and kernels return void)."""
    name = demangled.split("(")[0]
    return name[len("void ") :] if name.startswith("void ") else name


def parse_ptx_entries(ptx: str) -> dict[str, tuple[PtxParam, ...]]:
    entries = {}
    for name, params in _ENTRY.findall(ptx):
        entries[name] = tuple(PtxParam(m.group(1) + (m.group(2) or "")) for m in _PARAM.finditer(params))
    return entries


def parse_ptxas_resources(log: str) -> dict[str, KernelResources]:
    """Registers, spills, stack and shared memory per entry from `-Xptxas -v` output."""
    out = {}
    for block in re.split(r"ptxas info\s*: Compiling entry function ", log)[1:]:
        name = re.match(r"'(\w+)'", block).group(1)
        stack = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", block)
        regs = re.search(r"Used (\d+) registers", block)
        smem = re.search(r"(\d+) bytes smem", block)
        out[name] = KernelResources(
            int(regs.group(1)) if regs else 0,
            int(stack.group(2)) if stack else 0,
            int(stack.group(3)) if stack else 0,
            int(stack.group(1)) if stack else 0,
            int(smem.group(1)) if smem else 0,
        )
    return out


def compile_file(source: Path, arch: str, nvcc: Nvcc | None = None, build=None) -> CompiledFile:
    """One nvcc call for (source, arch): cubin, PTX and ptxas report, from the content-hash cache
    when an intact entry is there. Entries are written to a private folder and renamed into place,
    so concurrent builds never read half a file; a damaged entry is detected and rebuilt. `build`:
    a library's BuildOptions (include folders, defines and nvcc flags), part of the key."""
    nvcc = nvcc or find_nvcc()
    source = Path(source).resolve()

    def make(out: Path, work: Path):
        cmd = [
            str(nvcc.path),
            *COMPILE_FLAGS,
            *(build.nvcc_flags if build else ()),
            *build_flags(build),
            f"-arch={arch}",
            "-cubin",
            "-Xptxas",
            "-v",
            "--keep",
            "--keep-dir",
            str(work),
            "-I",
            str(source.parent),
            "-o",
            str(out / "kernel.cubin"),
            str(source),
        ]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise CompileError(source, cmd, result.stdout + result.stderr)
        (out / "kernel.ptx").write_text(next(work.glob("*.ptx")).read_text())
        (out / "ptxas.log").write_text(result.stdout + result.stderr)

    name = f"{source.stem}-{arch}-{cache_key(source, arch, nvcc, build)}"
    entry, cached = cached_build("kernels", name, _ENTRY_FILES, make)
    data = entry_files(entry, _ENTRY_FILES)
    if data is None:
        raise EnvironmentMissing(f"the kernel cache at {entry} changed while it was read; set CAPSULES_CACHE")
    return CompiledFile(
        source, arch, data["kernel.cubin"], data["kernel.ptx"].decode(), data["ptxas.log"].decode(), cached=cached
    )


_ENTRY_FILES = ("kernel.cubin", "kernel.ptx", "ptxas.log")


def cached_build(
    kind: str, name: str, files: tuple[str, ...], build: Callable[[Path, Path], None]
) -> tuple[Path, bool]:
    """The one build cache, of nvcc's cubins and of the emulator's host builds: the entry
    <cache>/<kind>/<name> holding `files`, with a manifest of their checksums. (entry, True) when
    an intact entry is there; else build(out, work) makes the files in a private folder, they are
    checksummed and renamed into place (so a concurrent reader never sees half an entry, and a
    concurrent identical build simply loses the rename), and (entry, False). A damaged entry (a
    file missing, truncated or changed) is rebuilt."""
    entry = cache_dir() / kind / name
    if entry_files(entry, files) is not None:
        return entry, True
    if entry.exists():
        shutil.rmtree(entry, ignore_errors=True)
    entry.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=entry.parent, prefix=".build-") as work:
        out = Path(work) / "entry"
        out.mkdir()
        build(out, Path(work))
        sums = {f: hashlib.sha256((out / f).read_bytes()).hexdigest() for f in files}
        (out / "manifest.json").write_text(json.dumps(sums))
        try:
            out.rename(entry)
        except OSError:
            pass  # another process renamed its identical build into place first
    if entry_files(entry, files) is None:
        raise EnvironmentMissing(f"the build cache at {entry} cannot be written or read back; set CAPSULES_CACHE")
    return entry, False


def entry_files(entry: Path, files: tuple[str, ...]) -> dict[str, bytes] | None:
    """{file: contents} of an intact cache entry, or None (absent, truncated or corrupted)."""
    try:
        sums = json.loads((entry / "manifest.json").read_text())
        data = {name: (entry / name).read_bytes() for name in files}
    except (OSError, ValueError):
        return None
    if any(hashlib.sha256(data[name]).hexdigest() != sums.get(name) for name in files):
        return None
    return data


def usable_cpus() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def build_name(kind: str, source: Path, build) -> str:
    """A build's name in build_in_parallel's answer: "emulator /path/relu.cu" or
    "nvcc sm_90 /path/relu.cu", with its options."""
    return f"{kind} {source}" + (f" {build}" if build is not None else "")


def build_in_parallel(builds: dict, workers: int | None = None) -> dict[str, str]:
    """Run `builds` ({name: a function that builds into the cache}) side by side, `workers` compiler
    processes at a time (default: one per usable core), so that a run finds its builds in the
    cache instead of making them one capsule at a time on one core. Returns {name: the first line
    of why it failed}; a failed build is left for the run itself to report on its capsule."""

    def one(item):
        name, build = item
        try:
            build()
        except CapsuleError as exc:
            return name, str(exc).splitlines()[0]
        return None

    with ThreadPoolExecutor(max_workers=max(1, workers or usable_cpus())) as pool:
        return dict(failure for failure in pool.map(one, builds.items()) if failure)


def compile_all(jobs: list[tuple], workers: int | None = None) -> dict[tuple, CompiledFile | CompileError]:
    """Compile (source, arch[, build options]) jobs in parallel; each result is a CompiledFile or
    its CompileError."""
    nvcc = find_nvcc()
    workers = workers or max(1, min(len(jobs), os.cpu_count() or 1))

    def one(job):
        try:
            return compile_file(job[0], job[1], nvcc, job[2] if len(job) > 2 else None)
        except CompileError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(zip(jobs, pool.map(one, jobs)))
