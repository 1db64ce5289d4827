"""The emu backend: the kernels themselves on the CPU (design §8).

Each translation unit (a family's cuda/<family>.cu, each .cu of a capsule library) is compiled
unchanged by the host C++ compiler against cuda/capsule_emu.h (forced in first), with a generated
table `capsule_emu_run(symbol, dims, args)` of its declared entry points, into a shared library
loaded with ctypes. Builds are
cached by content hash (sources, includes, the emulator header, the table, compiler and version,
flags) beside the cubins, written atomically. Device memory is host memory: allocations are
256-byte aligned and start as a NaN pattern (a GPU gives stale bits, never zeros).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path

import numpy as np

from capsule_core.backends.device import DeviceBackend
from capsule_core.backends.emu_memory import address_space
from capsule_core.errors import CapsuleError, EnvironmentMissing
from capsule_core.kernels.c_types import C_TYPES, argument_word
from capsule_core.kernels.launch import MAX_THREADS_PER_BLOCK
from capsule_core.kernels.nvcc import build_name, usable_cpus

EMULATOR_HEADER = "capsule_emu.h"
LINKER_SCRIPT = "capsule_emu.ld"


def _host_fma() -> tuple[str, ...]:
    """-mfma where this CPU has the instruction: the kernels' fmaf (__fmaf_rn, the SGEMM's inner
    product) becomes one instruction instead of a call into libm, the same correctly rounded result."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("flags"):
                    return ("-mfma",) if " fma " in f"{line.rstrip()} " else ()
    except OSError:
        pass
    return ()


HOST_FLAGS = (
    "-std=c++20",
    "-O3",
    "-fPIC",
    "-shared",
    "-ffp-contract=off",
    "-fno-fast-math",
    "-fsanitize=alignment",
    "-fno-sanitize-recover=alignment",
    "-fstack-clash-protection",
    "-fdata-sections",
    "-g1",
    "-w",
    *_host_fma(),
)
"""-O3: the loops the kernels unroll on a GPU (#pragma unroll, which g++ does not read) unrolled
and vectorised here too, which keeps a thread's register tile in registers: an emulated SGEMM
1.65x and conv 2.2x faster than at -O2, for builds 27 % slower (results bitwise the same: no
reassociation without fast-math); -ffp-contract=off: no FMA the source does not write;
-fsanitize=alignment: every typed access checked, the handler in the emulator header ends the
launch (a GPU faults; -fno-sanitize-recover: the handler never returns, so the checks cost the
optimiser nothing); -fstack-clash-protection:
a frame larger than a page is touched page by page, so a thread that outgrows its fiber stack hits
the guard page below it rather than the stack of the thread below; -fdata-sections: each
__shared__ variable in its own section, for capsule_emu.ld."""
BUILD_FORMAT = 1
DEVICE_FILL = np.uint32(0x7FC0FEED)
"""What fresh device memory holds: a NaN, so that a workspace read before it is written shows."""
ALIGNMENT = 256


class KernelFault(CapsuleError):
    """A launch on the emulator ended with an error a GPU would fault or hang on: a divergent
    barrier or shuffle, __trap(), a misaligned access, an illegal address, a hang past the launch
    timeout. The emulator itself stays usable."""

    poisoned = False
    kernel_fault = True
    """The kernel broke its contract (verify FAILS the case); not the tool."""

    def __init__(self, message: str, hung: bool = False):
        super().__init__(message)
        self.hung = hung
        """The launch ran past its timeout: the kernel's other cases would hang too, so verify
        fails them without launching (as a GPU's watchdog leaves the context unusable)."""


@dataclass(frozen=True)
class HostCompiler:
    path: Path
    version: str
    rule: str
    """How it was found: "CXX" or "PATH"."""


def find_host_compiler() -> HostCompiler:
    """The C++ compiler for the emulator: $CXX when set (an error when it is not a compiler), else
    g++ or clang++ on PATH. Raises EnvironmentMissing when there is none."""
    wanted = os.environ.get("CXX")
    if wanted:
        path = shutil.which(wanted)
        if path is None:
            raise EnvironmentMissing(f"CXX={wanted}: no such compiler; unset CXX or point it at g++ or clang++")
        return HostCompiler(Path(path), _version(Path(path)), "CXX")
    for name in ("g++", "clang++"):
        path = shutil.which(name)
        if path:
            return HostCompiler(Path(path), _version(Path(path)), "PATH")
    raise EnvironmentMissing("the emu backend needs a C++ compiler (g++ or clang++ on PATH, or CXX); install g++")


@lru_cache(maxsize=None)
def _version(path: Path) -> str:
    try:
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EnvironmentMissing(f"{path} does not run: {exc}") from exc
    return (out.splitlines() or ["unknown"])[0].strip()


class EmuBuildError(CapsuleError):
    """The host compiler refused a family (a kernel uses a device feature the emulator lacks)."""


def _argument(param, index: int) -> str:
    """The C++ expression of parameter `param` from the raw 64-bit argument word a[index]."""
    ctype = f"{'const ' if param.const else ''}{param.ctype}"
    if param.pointer:
        return f"reinterpret_cast<{ctype}*>(a[{index}])"
    if C_TYPES[param.ctype].is_float:
        return f"capsule_emu_bits<{param.ctype}>(static_cast<uint32_t>(a[{index}]))"
    return f"static_cast<{param.ctype}>(a[{index}])"


def dispatch_source(source: Path, refs) -> str:
    """The generated table of a translation unit: capsule_emu_run(symbol, dims[7], args) launches
    one entry point (1 ok, 0 an error in capsule_emu_error(), -1 an unknown symbol). A symbol is
    named as the declaration names it, so a C++ kernel ("lib::scale<float>") is called as C++ does.
    The source is included by name (its folder is the first -I): the table, and so the build's
    key, is the same for every folder that holds the same files, so a build made for one copy of
    a folder (a planted defect, prebuilt) is found by another."""
    from capsule_core.kernels.launch import parse_param

    lines = [
        f'#include "{source.name}"',
        "",
        'extern "C" int capsule_emu_run(const char* symbol, const unsigned* d, const uint64_t* a) {',
        "    const dim3 grid{d[0], d[1], d[2]}, block{d[3], d[4], d[5]};",
    ]
    for ref in sorted(refs, key=lambda r: r.symbol):
        params = [parse_param(p) for p in ref.params]
        args = "".join(f", {_argument(p, i)}" for i, p in enumerate(params))
        lines.append(
            f'    if (std::strcmp(symbol, "{ref.symbol}") == 0)\n'
            f'        return capsule_emu::launch("{ref.symbol}", grid, block, d[6], &{ref.symbol}{args}) ? 1 : 0;'
        )
    lines += [
        "    return -1;",
        "}",
        "",
        'extern "C" const char* capsule_emu_error() { return capsule_emu::state.error.c_str(); }',
        "// The last launch's fault: signal, address, access (0 unknown, 1 read, 2 write, 3 fetch), pc.",
        'extern "C" int capsule_emu_fault(uint64_t* out) {',
        "    const auto& s = capsule_emu::state;",
        "    out[0] = uint64_t(s.fault_signal), out[1] = reinterpret_cast<uintptr_t>(s.fault_address);",
        "    out[2] = uint64_t(s.fault_access), out[3] = reinterpret_cast<uintptr_t>(s.fault_pc);",
        "    return s.fault_signal;",
        "}",
        'extern "C" void capsule_emu_set_launch_timeout(double seconds) { capsule_emu::state.timeout_seconds = seconds; }',
        'extern "C" int capsule_emu_timed_out() { return capsule_emu::state.timed_out; }',
        'extern "C" void capsule_emu_set_order(int order, uint64_t seed) {',
        "    capsule_emu::state.order = order, capsule_emu::state.order_seed = seed;",
        "}",
        "#if !defined(CAPSULE_EMU_SANITIZE)",
        'extern "C" void capsule_emu_set_threads(unsigned threads) { capsule_emu::threads_wanted = threads ? threads : 1; }',
        "#endif",
        "",
    ]
    return "\n".join(lines)


def emulated_families() -> list[str]:
    """The translation units (cuda/<family>.cu, a library's .cu files) behind the loaded capsules: what emu runs."""
    from capsule_core.catalog import registry

    return sorted({Path(ref.path).stem for c in registry.kernel_capsules() for ref in c.symbols})


def unit_source(ref, family_dir: Path | None = None) -> Path:
    """The translation unit that defines `ref`: a library's file, or the shipped family file
    (from `family_dir` when given: a patched copy of cuda/)."""
    from capsule_core.kernels.nvcc import source_path

    if family_dir is not None and not Path(ref.path).is_absolute():
        return Path(family_dir) / Path(ref.path).name
    return source_path(ref.path)


def unit_refs(source: Path) -> tuple:
    """Every loaded kernel defined in the translation unit `source`."""
    from capsule_core.catalog import registry

    seen = {}
    for capsule in registry.kernel_capsules():
        for ref in capsule.symbols:
            if unit_source(ref) == source:
                seen[ref.symbol] = ref
    return tuple(seen.values())


def family_refs(family: str) -> tuple:
    """The kernels of the shipped cuda/<family>.cu."""
    from capsule_core.kernels.nvcc import cuda_source_dir

    return unit_refs(cuda_source_dir() / f"{family}.cu")


def _include_flags(source: Path, build) -> list[str]:
    from capsule_core.kernels.nvcc import build_flags, cuda_source_dir

    return ["-I", str(source.parent), "-I", str(cuda_source_dir()), *build_flags(build)]


def build_key(source: Path, driver: str, compiler: HostCompiler, flags: tuple[str, ...], build=None) -> str:
    from capsule_core.kernels.nvcc import build_flags, content_key, cuda_source_dir
    from capsule_core.source_files import include_closure

    source_dir = cuda_source_dir()
    paths = (
        set(include_closure(source, build.include_dirs if build else ()))
        | set(include_closure(source_dir / EMULATOR_HEADER))
        | {source_dir / LINKER_SCRIPT}
    )
    if "capsule_emu_runner.h" in driver:
        paths.add(source_dir / "capsule_emu_runner.h")
    return content_key(
        f"format={BUILD_FORMAT}\ncompiler={compiler.path}\nversion={compiler.version}\n"
        f"flags={' '.join(flags + tuple(build_flags(build)))}\n{driver}",
        paths,
    )


@dataclass(frozen=True)
class EmuBuild:
    family: str
    path: Path
    cached: bool


def build_unit(
    source: Path,
    refs=None,
    build=None,
    flags: tuple[str, ...] = HOST_FLAGS,
    extra_source: str = "",
    output: str = "libfamily.so",
) -> EmuBuild:
    """One translation unit (a shipped cuda/<family>.cu or a library's .cu, with the library's
    include folders and defines) built for the CPU with its dispatch table (plus `extra_source`,
    e.g. a runner's main), from the build cache (kernels.nvcc.cached_build: atomic, checksummed,
    a damaged entry rebuilt) when an intact build is there. `refs`: its entry points (default:
    every loaded kernel it defines)."""
    from capsule_core.kernels.nvcc import cached_build, cuda_source_dir

    compiler = find_host_compiler()
    source = Path(source)
    driver = dispatch_source(source, refs if refs is not None else unit_refs(source)) + extra_source
    key = build_key(source, driver, compiler, flags, build)
    source_dir = cuda_source_dir()

    def make(out: Path, work: Path):
        (out / "dispatch.cpp").write_text(driver)
        cmd = [
            str(compiler.path),
            *flags,
            "-include",
            str(source_dir / EMULATOR_HEADER),
            *_include_flags(source, build),
            "-o",
            str(out / output),
            str(out / "dispatch.cpp"),
            f"-Wl,-T,{source_dir / LINKER_SCRIPT}",
        ]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise EmuBuildError(
                f"the emulator build of {source.name} failed ({compiler.path.name}):\n"
                f"{result.stderr.strip()[:4000]}\ncommand: {' '.join(cmd)}"
            )

    entry, cached = cached_build("emu", f"{source.stem}-{key}", (output,), make)
    return EmuBuild(source.stem, entry / output, cached)


def build_family(
    family: str, flags: tuple[str, ...] = HOST_FLAGS, family_dir: Path | None = None, refs=None
) -> EmuBuild:
    """The shipped cuda/<family>.cu (or `family_dir`'s copy, with `refs`: kernels that are not
    the registry's, e.g. planted defects) built for the emulator."""
    from capsule_core.kernels.nvcc import cuda_source_dir

    source = Path(family_dir or cuda_source_dir()) / f"{family}.cu"
    return build_unit(source, refs if refs is not None else family_refs(family), flags=flags)


def unit_builds(capsules) -> dict:
    """{(translation unit, its BuildOptions): the unit's kernels} behind `capsules`: the builds a
    run of them on the emulator loads."""
    sources = {(unit_source(ref), ref.build) for capsule in capsules for ref in capsule.symbols}
    return {(source, build): unit_refs(source) for source, build in sources}


def emulator_builds(capsules) -> dict:
    """The plain emulator build of every unit behind `capsules`, for build_in_parallel."""
    return {
        build_name("emulator", source, build): partial(build_unit, source, refs, build)
        for (source, build), refs in unit_builds(capsules).items()
    }


@lru_cache(maxsize=None)
def load_unit(source: Path, build=None, refs: tuple | None = None) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(build_unit(source, refs, build).path))
    lib.capsule_emu_run.restype = ctypes.c_int
    lib.capsule_emu_run.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint64)]
    lib.capsule_emu_error.restype = ctypes.c_char_p
    lib.capsule_emu_fault.restype = ctypes.c_int
    lib.capsule_emu_fault.argtypes = [ctypes.POINTER(ctypes.c_uint64)]
    lib.capsule_emu_set_launch_timeout.restype = None
    lib.capsule_emu_set_launch_timeout.argtypes = [ctypes.c_double]
    lib.capsule_emu_timed_out.restype = ctypes.c_int
    lib.capsule_emu_set_order.restype = None
    lib.capsule_emu_set_order.argtypes = [ctypes.c_int, ctypes.c_uint64]
    lib.capsule_emu_set_threads.restype = None
    lib.capsule_emu_set_threads.argtypes = [ctypes.c_uint]
    return lib


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def source_line(lib: ctypes.CDLL, pc: int) -> str:
    """ "pointwise.cu:42 (in capsule_relu_fwd)" for an instruction address inside `lib`, from the
    build's line table (addr2line); "" when the address is elsewhere or the table says nothing."""
    if not pc:
        return ""
    info = _DlInfo()
    libdl = ctypes.CDLL(None)
    libdl.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    if (
        not libdl.dladdr(ctypes.c_void_p(pc), ctypes.byref(info))
        or not info.dli_fname
        or info.dli_fname.decode() != lib._name
    ):
        return ""
    tool = shutil.which("addr2line")
    if tool is None:
        return ""
    try:
        out = subprocess.run(
            [tool, "-f", "-C", "-i", "-e", lib._name, hex(pc - info.dli_fbase)],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.split("\n")
    except (OSError, subprocess.TimeoutExpired):
        return ""
    frames = [(out[i].strip(), out[i + 1].strip()) for i in range(0, len(out) - 1, 2)]
    for function, place in frames:
        if place and not place.startswith("??") and "capsule_emu.h" not in place:
            file, _, line = place.partition(" ")[0].rpartition(":")
            return f"{Path(file).name}:{line} (in {function.split('(')[0]})"
    return ""


def argument_words(args: list) -> np.ndarray:
    """Typed launch arguments as the 64-bit words capsule_emu_run reads (a float in the low 32 bits)."""
    words = np.zeros(max(len(args), 1), np.uint64)
    for i, a in enumerate(args):
        words[i] = argument_word(a)
    return words


SCHEDULES = ("index", "reversed", "shuffled")
"""The emulator's launch schedules (capsule_emu.h's state.order, in this order)."""

LAUNCH_TIMEOUT_ENV = "CAPSULES_LAUNCH_TIMEOUT"
DEFAULT_LAUNCH_TIMEOUT = 120.0
"""Seconds one emulated launch may run before the watchdog ends it: the slowest launch of a full
verify (a 1024-cubed GEMM's backward) takes under 10 s on one core."""


EMU_THREADS_ENV = "CAPSULES_EMU_THREADS"


def emu_threads_from_env() -> int | None:
    """CAPSULES_EMU_THREADS (OS threads running a launch's blocks; 1: one block after another),
    None when unset; a bad value is a usage error."""
    text = os.environ.get(EMU_THREADS_ENV)
    if text is None or not text.strip():
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise CapsuleError(
            f"{EMU_THREADS_ENV}: must be a whole number of threads >= 1 (1: blocks one after another), got {text!r}"
        )
    return int(text)


def max_map_count() -> int:
    """vm.max_map_count: the mappings a process may hold (Linux's default when unreadable)."""
    try:
        return int(Path("/proc/sys/vm/max_map_count").read_text())
    except (OSError, ValueError):
        return 65530


def default_emu_threads() -> int:
    """One OS thread per usable core, but no more than half of vm.max_map_count can hold: each
    thread keeps the stacks of a block's up to 1,024 kernel threads, two mappings apiece (the
    stack and its guard page); with Linux's default that is 15 threads."""
    return max(1, min(usable_cpus(), (max_map_count() // 2) // (2 * MAX_THREADS_PER_BLOCK + 1)))


def launch_timeout_from_env() -> float:
    """CAPSULES_LAUNCH_TIMEOUT (seconds; 0: no watchdog), else the default; a bad value is a usage error."""
    text = os.environ.get(LAUNCH_TIMEOUT_ENV)
    if text is None or not text.strip():
        return DEFAULT_LAUNCH_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise CapsuleError(f"{LAUNCH_TIMEOUT_ENV}: must be a number of seconds (0: no watchdog), got {text!r}")
    return seconds


class EmuBackend(DeviceBackend):
    """The kernels on the CPU emulator, behind the same device interface as the GPU. Device
    memory is the process's emulated address space (emu_memory): a stray access faults and the
    launch ends with a KernelFault naming the access, the buffer it missed and the source line."""

    name = "emu"

    def __init__(
        self,
        family_dir: Path | None = None,
        refs: tuple | None = None,
        launch_timeout: float | None = None,
        threads: int | None = None,
    ):
        """`family_dir` and `refs`: kernels of another folder (build_family), for planted defects.
        `launch_timeout`: seconds a launch may run (0: no watchdog; default CAPSULES_LAUNCH_TIMEOUT or 120).
        `threads`: OS threads that run a launch's blocks (default CAPSULES_EMU_THREADS, else one
        per usable core within default_emu_threads' bound; 1: one block after another)."""
        super().__init__()
        if threads is not None and int(threads) < 1:
            raise CapsuleError(f"--emu-threads: must be >= 1 (1: blocks one after another), got {threads}")
        self.threads = int(threads) if threads is not None else (emu_threads_from_env() or default_emu_threads())
        self.family_dir, self.refs = family_dir, refs
        self.compiler = find_host_compiler()
        self.description = f"CPU emulator of the CUDA kernels ({self.compiler.version})"
        self.launch_timeout = launch_timeout_from_env() if launch_timeout is None else float(launch_timeout)
        self._memory = address_space()
        self._units: dict = {}
        self.order, self.order_seed = "index", 0
        """The schedule of every launch: "index" (blocks, and each block's threads, in index
        order), "reversed", or "shuffled" by order_seed. The kernels' results must not depend on it."""

    def allocate(self, nbytes: int) -> int:
        address = self._memory.allocate(max(int(nbytes), ALIGNMENT))
        words = -(-int(nbytes) // 4)
        if words:
            np.frombuffer((ctypes.c_uint32 * words).from_address(address), np.uint32)[:] = DEVICE_FILL
        return address

    def free(self, address: int):
        self._memory.free(address)

    def name_buffer(self, address: int, nbytes: int, name: str):
        self._memory.name_buffer(address, nbytes, name)

    def upload(self, address: int, data: np.ndarray):
        data = np.ascontiguousarray(data)
        ctypes.memmove(address, data.ctypes.data, data.nbytes)

    def download(self, data: np.ndarray, address: int):
        if not data.flags.c_contiguous:
            raise ValueError("download needs a contiguous host array")
        ctypes.memmove(data.ctypes.data, address, data.nbytes)

    def memset32(self, address: int, word: int, words: int):
        if words:
            np.frombuffer((ctypes.c_uint32 * words).from_address(address), np.uint32)[:] = word

    def copy(self, destination: int, source: int, nbytes: int):
        ctypes.memmove(destination, source, nbytes)

    def _unit(self, ref) -> tuple[Path, ctypes.CDLL]:
        """The translation unit of `ref` and its loaded build, found once per unit: which kernels
        a unit holds is a walk over every loaded capsule."""
        key = (ref.path, ref.build)
        if key not in self._units:
            source = unit_source(ref, self.family_dir)
            refs = self.refs if self.refs is not None else unit_refs(unit_source(ref))
            self._units[key] = source, load_unit(source, ref.build, refs)
        return self._units[key]

    def launch(self, ref, grid, block, shared_bytes, args):
        source, lib = self._unit(ref)
        family = source.stem
        lib.capsule_emu_set_launch_timeout(ctypes.c_double(self.launch_timeout))
        lib.capsule_emu_set_order(SCHEDULES.index(self.order), self.order_seed)
        lib.capsule_emu_set_threads(self.threads)
        dims = (ctypes.c_uint * 7)(*grid, *block, int(shared_bytes))
        words = argument_words(args)
        status = lib.capsule_emu_run(ref.symbol.encode(), dims, words.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)))
        if status == -1:
            raise KernelFault(f"{ref.symbol} is not in the emulator build of {ref.path}")
        if status != 1:
            raise KernelFault(self._fault_text(lib, family), hung=bool(lib.capsule_emu_timed_out()))

    @contextmanager
    def other_schedule(self):
        """Launches in reversed order while the block runs (determinism's second execution): a
        result that depends on the schedule, as a float atomicAdd sum does, changes its bits."""
        saved, self.order = self.order, "reversed" if self.order != "reversed" else "index"
        try:
            yield
        finally:
            self.order = saved

    def _fault_text(self, lib, family: str) -> str:
        """The emulator's error, and for a memory fault where the address lies against the run's
        buffers, the source line of the access, and the launch in the plan."""
        text = lib.capsule_emu_error().decode(errors="replace")
        fault = (ctypes.c_uint64 * 4)()
        signal_number = lib.capsule_emu_fault(fault)
        if signal_number in (signal.SIGSEGV, signal.SIGBUS):
            address, pc = int(fault[1]), int(fault[3])
            if address or "general protection" not in text:
                text += f"; address {address:#x} is {self._memory.describe(address)}"
            line = source_line(lib, pc)
            if line:
                text += f"; the access is at {line}"
        if self.current_launch:
            text += f" (launch {self.current_launch})"
        return text

    def synchronize(self):
        """Launches run to completion on the calling thread: nothing is in flight."""
