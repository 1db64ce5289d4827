"""`capsules verify --sanitize`: compute-sanitizer's four tools on the emulator, without a GPU
(design §8).

Each tool is a build of the family's kernels with the emulator header and the runner
(cuda/capsule_emu_runner.h), run in a child process: a sanitizer runtime must be in a process from
its start (preloading libtsan into a pyenv-built CPython crashed at start-up), and a kernel that
corrupts memory must not take the verifier with it. The child reads a script (buffers, launches,
dumps) written by SanitizedBackend, which records the device calls of the one execution path
(capsule_core.backends.device) and replays them there at synchronize; every buffer is its own
exact-size allocation (no guard bands: the sanitizer is the guard).

- memcheck:  AddressSanitizer + UBSan (out-of-bounds and misaligned accesses, undefined behaviour);
- racecheck: ThreadSanitizer, every CUDA thread a TSan fiber, barriers and shuffles release/acquire;
- synccheck: the emulator's own barrier and shuffle bookkeeping (a divergent one is a finding),
  in process on the emu backend's build: it needs no runtime of its own;
- initcheck: valgrind's memcheck over an emulator build that leaves workspaces, outputs and
  shared memory undefined: a value read from memory no one wrote reaching an output or a branch.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from capsule_core.backends.device import DeviceBackend
from capsule_core.backends.emu import (
    HOST_FLAGS,
    EmuBackend,
    KernelFault,
    argument_words,
    build_unit,
    emulator_builds,
    find_host_compiler,
    unit_builds,
    unit_refs,
    unit_source,
)
from capsule_core.children import die_with_parent
from capsule_core.errors import CapsuleError, EnvironmentMissing
from capsule_core.kernels.launch import parse_param
from capsule_core.kernels.nvcc import build_name, cuda_source_dir

TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")

_EMULATOR_ONLY = (
    "-O3",
    "-shared",
    "-fsanitize=alignment",
    "-fno-sanitize-recover=alignment",
    "-fstack-clash-protection",
)
_BASE = tuple(f for f in HOST_FLAGS if f not in (*_EMULATOR_ONLY, "-mfma"))
"""The emulator's flags less those of its own build; less -mfma too: valgrind loses the origin of an
uninitialised value that passes through an FMA instruction (initcheck could no longer say the bytes
came from shared memory)."""
TOOL_FLAGS = {
    "memcheck": (
        *_BASE,
        "-O0",
        "-g",
        "-fsanitize=address,undefined",
        "-fno-sanitize-recover=all",
        "-DCAPSULE_EMU_SANITIZE",
    ),
    "racecheck": (*_BASE, "-O0", "-g", "-fsanitize=thread", "-DCAPSULE_EMU_SANITIZE", "-DCAPSULE_EMU_TSAN"),
    "initcheck": (*_BASE, "-O1", "-g", "-DCAPSULE_EMU_SANITIZE", "-DCAPSULE_EMU_VALGRIND"),
}
"""-O0 for ASan and TSan: a sanitized build of a family compiles four times faster than at -O1 (22 s
against 88 s for softmax with ASan and UBSan). -O1 for valgrind, whose cost is per executed
instruction: a third of -O0's run time (matmul 64x129x65 forward and backward: 1.3 s against 3.8 s),
which the full mode's 1024^3 GEMMs need; valgrind's manual names -O1 as the level where false
uninitialised-value reports stay rare. synccheck needs no build of its own: the emulator's barrier
bookkeeping is in every build (it runs on the emu backend's)."""
TOOL_ENV = {
    "memcheck": {
        "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1:abort_on_error=0:exitcode=66:detect_stack_use_after_return=0",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1:exitcode=66",
    },
    "racecheck": {"TSAN_OPTIONS": "halt_on_error=1:exitcode=66:report_signal_unsafe=0:history_size=4"},
    "initcheck": {},
}
VALGRIND_ARGS = (
    "--tool=memcheck",
    "--error-exitcode=66",
    "--undef-value-errors=yes",
    "--leak-check=no",
    "--max-stackframe=8388608",
    "--num-callers=8",
    "-q",
)
"""Valgrind runs to the end: its address errors (Invalid read/write) are memcheck's findings, not
initcheck's; only uninitialised values are. Without origins: a run that finds an uninitialised value
runs again with ORIGIN_ARGS for the report (where the bytes came from), since tracking origins
doubles the cost of every clean run."""
ORIGIN_ARGS = ("--track-origins=yes",)
TIMEOUT_S = 600
TIMEOUT_ENV = "CAPSULES_SANITIZE_TIMEOUT"


def run_limit() -> float:
    """Seconds one sanitized run may take: $CAPSULES_SANITIZE_TIMEOUT (what `verify
    --sanitize-timeout` sets, so that its worker processes inherit it), else TIMEOUT_S. The large
    cases of a full run under valgrind or TSan can take longer on a small machine; a run limit, never
    a tolerance."""
    text = os.environ.get(TIMEOUT_ENV)
    if text is None:
        return TIMEOUT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"{TIMEOUT_ENV}={text!r}: the sanitizer run limit must be a positive number of seconds")
    return seconds


@dataclass(frozen=True)
class Finding:
    """A sanitizer's first report: `summary` in one line for the table (kernel, block and thread,
    buffer and offset, source lines), `text` the report whole."""

    tool: str
    summary: str
    text: str


class SanitizerFinding(CapsuleError):
    def __init__(self, finding: Finding, case: str | None = None):
        self.finding = finding
        self.case = case
        """In a batch, the case (SanitizedBackend.begin_case) whose run the finding came from."""
        super().__init__(finding.summary)


class SanitizerTimeout(KernelFault):
    """A sanitized run past its limit (--sanitize-timeout); in a batch, `case` is the case that was
    running when the limit struck (the last one the runner had announced), not the batch's first."""

    def __init__(self, message: str, case: str | None = None):
        self.case = case
        super().__init__(message)


def runner_path(source: Path, tool: str, build=None, refs=None) -> Path:
    """The runner of a translation unit (capsule_core.backends.emu.build_unit) built for `tool`,
    content-hash cached like every emulator build."""
    return build_unit(
        source,
        refs,
        build,
        flags=TOOL_FLAGS[tool],
        extra_source='#include "capsule_emu_runner.h"\n',
        output=f"runner-{tool}",
    ).path


def sanitizer_builds(capsules, tools) -> dict:
    """The plain emulator builds of `capsules` (what the kernels and synccheck run on) and the
    runner of each tool of `tools` for each of their units, as {name: build} for build_in_parallel."""
    builds = emulator_builds(capsules)
    for (source, build), refs in unit_builds(capsules).items():
        for tool in (t for t in tools if t in TOOL_FLAGS):
            builds[build_name(tool, source, build)] = partial(runner_path, source, tool, build, refs)
    return builds


def unavailable(tool: str) -> str | None:
    """Why `tool` cannot run here (no compiler, no sanitizer runtime, no valgrind), or None."""
    try:
        if tool == "synccheck":
            find_host_compiler()
            return None
        runner_path(cuda_source_dir() / "random.cu", tool)
    except EnvironmentMissing as exc:
        return str(exc)
    except CapsuleError as exc:
        first = next((line for line in str(exc).splitlines()[1:] if line.strip()), str(exc))
        return f"the {tool} build does not link here ({first.strip()})"
    if tool == "initcheck" and shutil.which("valgrind") is None:
        return "initcheck runs the kernels under valgrind, which is not installed (apt install valgrind)"
    return None


def is_divergence(message: str) -> bool:
    """An emulator error that is synccheck's finding: a barrier or shuffle reached by part of a
    block or warp, or from different lines (capsule_emu.h words them so)."""
    return " reached by " in message or "(a divergent barrier)" in message


def backend_for(tool: str, family_dir: Path | None = None, refs: tuple | None = None, batch: bool = False):
    """The backend that runs kernels under `tool` (`family_dir`, `refs`: see build_family;
    `batch`: see SanitizedBackend)."""
    if tool == "synccheck":
        return SynccheckBackend(family_dir, refs)
    return SanitizedBackend(tool, family_dir, refs, batch)


class SynccheckBackend(EmuBackend):
    """The emu backend, its divergence reports raised as synccheck findings (at once: it has no
    batch to flush)."""

    def begin_case(self, label: str) -> None:
        pass

    def flush(self) -> None:
        pass

    def launch(self, ref, grid, block, shared_bytes, args):
        try:
            super().launch(ref, grid, block, shared_bytes, args)
        except KernelFault as exc:
            if is_divergence(str(exc)):
                raise SanitizerFinding(Finding("synccheck", str(exc), str(exc))) from None
            raise


class SanitizedBackend(DeviceBackend):
    """The emulator under one sanitizer: device calls recorded, replayed by the family's runner in
    a child process at synchronize, results read back from its dumps.

    `batch`: every case recorded into one script, run by one child process at flush() (a sanitizer
    process's start, valgrind's above all, costs more than a quick case's kernels). Results are
    not read back (downloads give the uploaded bytes or zeros): a sanitizer check judges the runs,
    not their values. A finding names its case (begin_case). A backward's recomputed forward comes
    from the emulator in this process: the forward itself runs under the tool as its own case."""

    guard_bands = False

    def __init__(self, tool: str, family_dir: Path | None = None, refs=None, batch: bool = False):
        super().__init__()
        self.batch = batch
        self._script: list[str] = []
        self._emitted: set[int] = set()
        self._work: tempfile.TemporaryDirectory | None = None
        self._emulator: EmuBackend | None = None
        self.family_dir, self.refs = family_dir, refs
        if tool not in TOOL_FLAGS:
            raise ValueError(f"no sanitized build for {tool!r} (builds: {', '.join(TOOL_FLAGS)})")
        self.tool = tool
        self.name = "emu"
        self.description = f"CPU emulator under {tool}"
        self._next = 1
        self._buffers: dict[int, tuple[int, bytes | None]] = {}
        self._launches: list = []
        self._results: dict[int, bytes] = {}
        self._unit: tuple | None = None
        self.names: dict[int, str] = {}
        """Allocation id -> plan buffer name, for the reports."""

    _SPAN = 1 << 40
    """Recorded addresses: buffer id times 2^40 plus the offset (no buffer is that large)."""

    def allocate(self, nbytes: int) -> int:
        ident = self._next
        self._next += 1
        self._buffers[ident] = (int(nbytes), None)
        return ident * self._SPAN

    def free(self, address: int):
        ident = address // self._SPAN
        self._buffers.pop(ident, None)
        self._results.pop(ident, None)
        if ident in self._emitted:
            self._emitted.discard(ident)
            self._script.append(f"free {ident}")

    def begin_case(self, label: str) -> None:
        """In a batch: the runs recorded from now on belong to case `label`."""
        if self.batch:
            self._script.append(f"case {label}")

    def recompute_forward(self, capsule, plan, arrays: dict, out_shape):
        if not self.batch:
            return super().recompute_forward(capsule, plan, arrays, out_shape)
        if self._emulator is None:
            self._emulator = EmuBackend(self.family_dir, self.refs, launch_timeout=0, threads=1)
            self._emulator.bind(self.capsule)
        return self._emulator.recompute_forward(capsule, plan, arrays, out_shape)

    def upload(self, address: int, data: np.ndarray):
        ident, offset = divmod(address, self._SPAN)
        nbytes, contents = self._buffers[ident]
        if offset != 0 or np.asarray(data).nbytes != nbytes:
            raise ValueError("the sanitized device takes whole-buffer uploads")
        self._buffers[ident] = (nbytes, np.ascontiguousarray(data).tobytes())

    def download(self, data: np.ndarray, address: int):
        ident, offset = divmod(address, self._SPAN)
        raw = self._results[ident][offset : offset + data.nbytes]
        data.reshape(-1).view(np.uint8)[:] = np.frombuffer(raw, np.uint8)

    def launch(self, ref, grid, block, shared_bytes, args):
        unit = (
            unit_source(ref, self.family_dir),
            ref.build,
            self.refs if self.refs is not None else unit_refs(unit_source(ref)),
        )
        if self._unit not in (None, unit):
            raise CapsuleError(
                f"{ref.symbol}: under the sanitizers a plan's kernels must come from one source file "
                f"(this plan launches kernels of {self._unit[0]} and {unit[0]})"
            )
        self._unit = unit
        words = []
        # by the declared parameter, not the value's type: a uint64_t scalar (an RNG key) is an
        # np.uint64 just as a device address is
        pointers = [parse_param(p).pointer for p in ref.params]
        for a, w, pointer in zip(args, argument_words(args), pointers):
            if pointer:
                ident, offset = divmod(int(a), self._SPAN)
                words.append(f"b{ident}+{offset}")
            else:
                words.append(str(int(w)))
        self._launches.append(
            f"launch {ref.symbol} {' '.join(map(str, grid))} {' '.join(map(str, block))} {int(shared_bytes)} "
            f"{len(words)} {' '.join(words)}"
        )

    def _device_address(self, address: int) -> str:
        ident, offset = divmod(int(address), self._SPAN)
        return f"b{ident}+{offset}"

    def memset32(self, address: int, word: int, words: int):
        self._launches.append(f"memset {self._device_address(address)} {int(word)} {int(words)}")

    def copy(self, destination: int, source: int, nbytes: int):
        self._launches.append(f"copy {self._device_address(destination)} {self._device_address(source)} {int(nbytes)}")

    def _buffer_lines(self, work: Path) -> list[str]:
        """The buffer lines of the buffers not yet in the script, their uploads written to `work`."""
        lines = []
        for ident, (nbytes, contents) in self._buffers.items():
            if ident in self._emitted:
                continue
            source = "-"
            if contents is not None:
                source = str(work / f"in{ident}.bin")
                Path(source).write_bytes(contents)
            lines.append(f"buffer {ident} {nbytes} {source}")
            if self.batch:
                self._emitted.add(ident)
        return lines

    def synchronize(self):
        launches, self._launches = self._launches, []
        if self.batch:
            if launches:
                if self._work is None:
                    self._work = tempfile.TemporaryDirectory(prefix="capsules-sanitize-")
                self._script += self._buffer_lines(Path(self._work.name)) + launches
                self._script += [f"dump {ident} -" for ident in self._buffers]
            self._results = {i: contents or bytes(n) for i, (n, contents) in self._buffers.items()}
            return
        if not launches:
            self._results = {i: contents or b"" for i, (n, contents) in self._buffers.items()}
            return
        with tempfile.TemporaryDirectory(prefix="capsules-sanitize-") as work:
            work = Path(work)
            lines = self._buffer_lines(work) + launches
            lines += [f"dump {ident} {work / f'out{ident}.bin'}" for ident in self._buffers]
            self._run_script(work, lines)
            self._results = {ident: (work / f"out{ident}.bin").read_bytes() for ident in self._buffers}

    def flush(self) -> None:
        """In a batch: run every case recorded so far in one child process; a SanitizerFinding
        names the case it came from."""
        script, self._script = self._script, []
        work, self._work = self._work, None
        if work is None:
            return
        with work:
            self._run_script(Path(work.name), script)

    def _run_script(self, work: Path, lines: list[str]) -> None:
        """Run `lines` with the unit's runner under the tool; a finding or a failed launch raises."""
        runner = runner_path(self._unit[0], self.tool, self._unit[1], self._unit[2])
        (work / "script").write_text("\n".join(lines) + "\n")
        command = [str(runner), str(work / "script")]
        limit = run_limit()

        def run(prefix: list[str]):
            try:
                return subprocess.run(
                    [*prefix, *command],
                    capture_output=True,
                    text=True,
                    timeout=limit,
                    env={**os.environ, **TOOL_ENV[self.tool]},
                    preexec_fn=die_with_parent,
                )
            except subprocess.TimeoutExpired as exc:
                raise _timeout(self.tool, limit, lines, exc.stderr) from None

        proc = run(["valgrind", *VALGRIND_ARGS] if self.tool == "initcheck" else [])
        if self.tool == "initcheck" and proc.returncode != 0 and "ninitialised" in proc.stderr:
            proc = run(["valgrind", *VALGRIND_ARGS, *ORIGIN_ARGS])
        address_errors_only = (
            self.tool == "initcheck"
            and proc.returncode == 66
            and "ninitialised" not in proc.stderr
            and "capsule-emu: error" not in proc.stderr
        )
        if proc.returncode != 0 and not address_errors_only:
            case, stderr = _failing_case(proc.stderr)
            failure = _failure(self.tool, stderr, proc.returncode, self.names)
            if isinstance(failure, SanitizerFinding):
                failure.case = case
            elif case is not None:
                failure = KernelFault(f"case {case}: {failure}")
            raise failure

    def execute(self, capsule, plan, host, outputs):
        """DeviceBackend.execute (one allocation per plan buffer, in order), remembering which plan
        buffer each allocation is."""
        order = [b for b in plan.buffers if b.name not in plan.aliases]
        self.names.update({self._next + i: b.name for i, b in enumerate(order)})
        return super().execute(capsule, plan, host, outputs)


_ADDRESS = re.compile(r"capsule-emu: buffer (\d+) 0x([0-9a-f]+) (\d+)")
_SOURCE = re.compile(r"([^\s(]+\.cuh?):(\d+)")


_CASE = re.compile(r"^capsule-emu: case (.+)$", re.MULTILINE)


def _timeout(tool: str, limit: float, lines: list[str], stderr: str | bytes | None) -> SanitizerTimeout:
    """The limit's error, naming the first kernel of the case that was running (the last case
    announced on the runner's stderr so far), or of the whole script outside a batch."""
    if isinstance(stderr, bytes):
        stderr = stderr.decode(errors="replace")
    announced = _CASE.findall(stderr or "")
    case = announced[-1] if announced else None
    if case is not None and f"case {case}" in lines:
        lines = lines[lines.index(f"case {case}") :]
    kernel = next((line.split()[1] for line in lines if line.startswith("launch ")), "the plan")
    return SanitizerTimeout(
        (f"case {case}: " if case is not None else "")
        + f"the {tool} run of {kernel} did not finish in {limit:g} s (--sanitize-timeout)",
        case,
    )


def _failing_case(stderr: str) -> tuple[str | None, str]:
    """(the case of a batch whose run the first report came from, the stderr of that case on):
    the runner announces each case, and the first line that is neither an announcement nor a
    buffer line starts the report."""
    case, start, position = None, 0, 0
    for line in stderr.splitlines(keepends=True):
        m = _CASE.match(line.rstrip("\n"))
        if m:
            case, start = m.group(1), position
        elif line.strip() and not line.startswith("capsule-emu: buffer "):
            break
        position += len(line)
    return case, stderr[start:]


def _where(stderr: str) -> str:
    m = re.search(r"capsule-emu: in (.+)", stderr)
    return m.group(1).strip() if m else ""


def _buffer_at(stderr: str, address: int, names: dict) -> str:
    """The buffer that holds `address`, else the nearest one it lies up to 4 KiB past the end of
    (an overrun): buffers can sit back to back, so the first within reach is not always the one."""
    near = []
    for m in _ADDRESS.finditer(stderr):
        ident, start, size = int(m.group(1)), int(m.group(2), 16), int(m.group(3))
        if start <= address < start + max(size, 1) + 4096:
            near.append((address >= start + size, address - start, ident, size))
    if not near:
        return f"address {address:#x}"
    _, offset, ident, size = min(near)
    return f"buffer {names.get(ident, f'#{ident}')} ({size} bytes) byte {offset}"


def _source_lines(text: str, limit: int = 2) -> list[str]:
    """The first kernel-source locations (cuda/*.cu, *.cuh) of the stack frames in a report."""
    out = []
    for line in text.splitlines():
        m = _SOURCE.search(line) if line.lstrip().startswith("#") else None
        if m and f"{Path(m.group(1)).name}:{m.group(2)}" not in out:
            out.append(f"{Path(m.group(1)).name}:{m.group(2)}")
        if len(out) >= limit:
            break
    return out


def _race_accesses(report: str) -> list[str]:
    """Each access of a TSan data race: "write at FILE:LINE by block (..) thread (..)"."""
    names = dict(re.findall(r"Thread (T\d+) '([^']*)'", report))
    out = []
    for m in re.finditer(
        r"(?:Previous )?(write|read|Write|Read)[^\n]* by thread (T\d+)[^\n]*:\n((?:\s+#[^\n]*\n)+)", report
    ):
        lines = _source_lines(m.group(3), 1)
        who = names.get(m.group(2), m.group(2))
        out.append(f"{m.group(1).lower()} at {lines[0] if lines else '?'} by {who}")
    return out


def _memcheck_summary(stderr: str, names: dict) -> str | None:
    where = _where(stderr)
    if "ERROR: AddressSanitizer" in stderr:
        kind = re.search(r"ERROR: AddressSanitizer: (\S+)", stderr).group(1)
        access = re.search(r"(READ|WRITE) of size (\d+) at 0x([0-9a-f]+)", stderr)
        what = (
            (
                f"{access.group(1).lower()} of {access.group(2)} bytes at "
                f"{_buffer_at(stderr, int(access.group(3), 16), names)}"
            )
            if access
            else "an invalid access"
        )
        lines = _source_lines(stderr, 1)
        return f"{kind}: {what}" + (f" in {where}" if where else "") + (f" at {lines[0]}" if lines else "")
    if "runtime error:" in stderr:
        m = re.search(r"(\S+?):(\d+):\d+: runtime error: (.+)", stderr)
        summary = (
            f"undefined behaviour: {m.group(3)} at {Path(m.group(1)).name}:{m.group(2)}" if m else "undefined behaviour"
        )
        return summary + (f" in {where}" if where else "")
    return None


def _racecheck_summary(stderr: str, names: dict) -> str | None:
    if "WARNING: ThreadSanitizer: data race" not in stderr:
        return None
    access = re.search(r"(Write|Read) of size (\d+) at 0x([0-9a-f]+)", stderr)
    target = _buffer_at(stderr, int(access.group(3), 16), names) if access else "memory"
    if target.startswith("address") and "Location is global" in stderr:
        target = "shared memory"
    accesses = _race_accesses(stderr)
    return f"data race on {target}: {' and '.join(accesses) or 'two threads'}; no barrier orders them"


def _initcheck_summary(stderr: str, names: dict) -> str | None:
    if "ninitialised" not in stderr:
        return None
    origin = (
        "a workspace or output"
        if "heap allocation" in stderr
        else "shared memory"
        if "client request" in stderr
        else "memory no one wrote"
    )
    use = re.search(
        r"== (Conditional jump or move depends on uninitialised value\(s\)|Use of uninitialised value[^\n]*)", stderr
    )
    at = re.search(r"Address 0x([0-9a-f]+) is (\d+) bytes inside a block of size (\d+)", stderr)
    if at and not use:
        summary = f"{_buffer_at(stderr, int(at.group(1), 16), names)} holds bytes read from {origin} that no one wrote"
    else:
        summary = f"{use.group(1) if use else 'an uninitialised value is used'} (origin: {origin})"
    frame = re.search(r"(?:at|by) 0x[0-9A-F]+: \S+ \(([^:()]+\.cuh?):(\d+)\)", stderr)
    return summary + (f" at {frame.group(1)}:{frame.group(2)}" if frame else "")


_SUMMARIES = {"memcheck": _memcheck_summary, "racecheck": _racecheck_summary, "initcheck": _initcheck_summary}


def _failure(tool: str, stderr: str, code: int, names: dict) -> Exception:
    """The child's stderr as this tool's Finding, or, for an error that is no finding of this tool
    (the emulator's own: a divergent barrier, __trap), a KernelFault."""
    summary = _SUMMARIES[tool](stderr, names)
    if summary is not None:
        report = "\n".join(
            line for line in stderr.splitlines() if not line.startswith(("capsule-emu: buffer ", "capsule-emu: case "))
        )
        return SanitizerFinding(Finding(tool, summary, report))
    own = re.search(r"capsule-emu: error: (.+)", stderr)
    if own:
        return KernelFault(own.group(1))
    tail = "\n".join(stderr.strip().splitlines()[-5:])
    return KernelFault(f"the {tool} runner exited with {code}: {tail}")


@dataclass(frozen=True)
class GpuSanitizerOutcome:
    status: str
    """"finding", "clean" or "skipped"."""
    summary: str
    text: str = ""


def compute_sanitizer(tool: str, op: str, seed: int, quick: bool, case: str | None) -> GpuSanitizerOutcome:
    """On a GPU: NVIDIA's compute-sanitizer runs the value and vjp checks of OP on the cuda backend
    (drivers.sanitized_verify) in a child process under `--tool TOOL`; its first error becomes the finding. SKIPPED where it
    is not on PATH or refuses the device."""
    import sys

    from capsule_core.catalog.registry import library_paths

    binary = shutil.which("compute-sanitizer")
    if binary is None:
        return GpuSanitizerOutcome("skipped", "compute-sanitizer is not on PATH (it comes with the CUDA toolkit)")
    command = [
        binary,
        "--tool",
        tool,
        "--error-exitcode",
        "66",
        sys.executable,
        "-m",
        "capsule_core.drivers.sanitized_verify",
        op,
        "--seed",
        str(seed),
        *(["--quick"] if quick else []),
        *(["--case", case] if case else []),
        *(f for path in library_paths() for f in ("--library", path)),
    ]
    try:
        proc = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=run_limit(),
            env={**os.environ, "CAPSULES_PROGRESS": "0"},
            preexec_fn=die_with_parent,
        )
    except subprocess.TimeoutExpired:
        return GpuSanitizerOutcome(
            "skipped", f"compute-sanitizer did not finish in {run_limit():g} s (--sanitize-timeout)"
        )
    text = proc.stdout + proc.stderr
    errors = [
        line[len("========= ") :].strip()
        for line in text.splitlines()
        if line.startswith("========= ") and not line.startswith("========= COMPUTE-SANITIZER")
    ]
    if proc.returncode == 66 and errors:
        located = next((e for e in errors if re.search(r"\.cuh?:\d+", e)), "")
        return GpuSanitizerOutcome(
            "finding", f"{errors[0]}" + (f" ({located})" if located and located != errors[0] else ""), text
        )
    refused = re.search(
        r"(Error: .*|Target application terminated before first instrumented API call.*|"
        r"Device not supported.*|unable to .*)",
        text,
    )
    if proc.returncode not in (0, 1) or refused:
        why = refused.group(1) if refused else (text.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return GpuSanitizerOutcome("skipped", f"compute-sanitizer could not run on this device: {why}", text)
    return GpuSanitizerOutcome("clean", f"compute-sanitizer --tool {tool}: no error", text)
