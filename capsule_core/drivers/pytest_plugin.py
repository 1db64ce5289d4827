"""pytest plugin (entry point `pytest11: capsules`): capsule verification as test items.

`pytest --capsules all` (or a comma list of capsule or op names) adds one item per capsule and
check id, `capsules::softmax::vjp`, so a kernel library puts `capsules verify` in its own test
suite and gets pytest's JUnit, -k, -x and xdist for free. A FAILED or ERROR check fails its item
with the verify message and rerun line, SKIPPED (and MISTRUSTED: it ran but could not tell)
skips with the reason, PASSED passes. Each capsule is verified once, lazily when its first
selected item runs, for the checks of its selected items; the other items read the cached
report. On emu and cuda the kernels run in a worker process (as `capsules verify` does), so a
kernel that crashes or hangs fails its own capsule's items and the session goes on. Without
--capsules the plugin adds nothing, and this module imports nothing but pytest (the library is
imported only when --capsules is given).
"""

from __future__ import annotations

import math

import pytest

ROOT = "capsules"
"""The collector's name: every item's node id starts with it."""


def pytest_addoption(parser):
    group = parser.getgroup("capsules", "capsule verification (capsules verify as test items)")
    group.addoption(
        "--capsules",
        metavar="NAMES",
        default=None,
        help="verify these capsules as test items: 'all' or a comma list of capsule or op names",
    )
    group.addoption(
        "--capsules-backend",
        choices=("auto", "cuda", "emu", "numpy"),
        default="auto",
        help="auto: cuda when a GPU answers, else the emulator, else numpy (default: auto)",
    )
    group.addoption(
        "--capsules-quick", action="store_true", default=False, help="small samples and edges only (a CI smoke run)"
    )
    group.addoption(
        "--capsules-seed", type=int, default=0, help="seed of the sample inputs and cotangents (default: 0)"
    )
    group.addoption(
        "--capsules-no-isolate",
        action="store_true",
        default=False,
        help="run the kernels in the pytest process (default on emu and cuda: in a worker process, "
        "so that a kernel that crashes or hangs fails its own capsule's items only)",
    )
    group.addoption(
        "--capsules-launch-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the emulator's watchdog: a launch running longer is ended as hung "
        "(default 120, or CAPSULES_LAUNCH_TIMEOUT; 0: none)",
    )
    group.addoption(
        "--capsules-library",
        action="append",
        default=[],
        metavar="PATH",
        help="load a capsule library's declaration (a .py file or a package folder); repeatable "
        "(CAPSULES_LIBRARIES and installed entry points load too)",
    )


def pytest_configure(config):
    names = config.getoption("capsules")
    if names is None:
        return
    timeout = config.getoption("capsules_launch_timeout")
    if timeout is not None and not 0 <= timeout < math.inf:
        raise pytest.UsageError(
            f"--capsules-launch-timeout: must be a number of seconds >= 0 (0: no watchdog), got {timeout:g}"
        )
    from capsule_core.catalog import registry

    failed = registry.use_libraries(config.getoption("capsules_library"))
    if failed:
        raise pytest.UsageError("; ".join(f"{f.source}: {f.message}" for f in failed))
    config.pluginmanager.register(CapsuleVerification(config, _capsules(names)), "capsules-verification")


def _capsules(names: str) -> list:
    """The capsules `--capsules` names, in the order given; UsageError naming an unknown name."""
    from capsule_core.catalog import registry
    from capsule_core.errors import UnknownNameError

    wanted = [n.strip() for n in names.split(",") if n.strip()]
    if not wanted:
        raise pytest.UsageError("--capsules: give 'all' or a comma list of capsule, op or library names")
    if wanted == ["all"]:
        return registry.kernel_capsules()
    try:
        capsules = registry.lookup_many(wanted)
    except UnknownNameError as exc:
        raise pytest.UsageError(f"--capsules: {exc}") from None
    return list({c.name: c for c in capsules}.values())


def _short(capsule) -> str:
    """`softmax` for the capsule an op name stands for (the built-in one), the full name for any other."""
    from capsule_core.catalog.registry import short_name

    return short_name(capsule)


class CapsuleVerification:
    """The plugin's state when --capsules is given: the capsules, the backend (resolved on first
    use) and one verify report per capsule (made on first use)."""

    def __init__(self, config, capsules: list):
        self.config, self.capsules = config, capsules
        self.quick = config.getoption("capsules_quick")
        self.seed = config.getoption("capsules_seed")
        self.backend_name = config.getoption("capsules_backend")
        self.isolate = not config.getoption("capsules_no_isolate")
        self.launch_timeout = config.getoption("capsules_launch_timeout")
        self._backend = None
        self._reports: dict = {}
        self._contained: dict = {}
        """checks -> the open capsule_core.drivers.parallel.verify of the capsules selected for those checks."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, session, config, items):
        """Append the capsule items (collected as pytest collects, so they are counted and
        reported) before -k, -m and --deselect filter the list."""
        items.extend(session.genitems(CapsulesCollector.from_parent(session, name=ROOT, nodeid=ROOT)))

    def backend(self):
        """(backend, note); EnvironmentMissing for a backend this machine cannot run."""
        if self._backend is None:
            from capsule_core.backends.select import resolve

            self._backend = resolve(self.backend_name, launch_timeout=self.launch_timeout)
        return self._backend

    def report(self, capsule, session):
        """The capsule's CapsuleReport, for the checks of its items still in the session. On emu
        and cuda the capsules that share those checks go through one worker process, in turn, as
        their items ask (a dead worker is an ERROR of its capsule, and a fresh one goes on)."""
        if capsule.name not in self._reports:
            from capsule_core.drivers import parallel
            from capsule_core.verify.engine import verify_capsule

            backend, _ = self.backend()
            checks = self._checks(capsule, session)
            workers = parallel.contained(backend.name, 0, self.launch_timeout) if self.isolate else ()
            if not workers:
                self._reports[capsule.name] = verify_capsule(
                    capsule, backend, quick=self.quick, seed=self.seed, checks=checks
                )
                return self._reports[capsule.name]
            if checks not in self._contained:
                sharing = [
                    c for c in self.capsules if c.name not in self._reports and self._checks(c, session) == checks
                ]
                self._contained[checks] = (
                    sharing,
                    parallel.verify(sharing, workers, quick=self.quick, seed=self.seed, checks=checks),
                )
            sharing, reports = self._contained[checks]
            for index, one in reports:
                self._reports[sharing[index].name] = one
                if sharing[index] is capsule:
                    break
        return self._reports[capsule.name]

    @staticmethod
    def _checks(capsule, session) -> tuple:
        return tuple(
            dict.fromkeys(i.check for i in session.items if isinstance(i, CapsuleCheckItem) and i.capsule is capsule)
        )

    def pytest_sessionfinish(self, session):
        """End the worker processes."""
        for _, reports in self._contained.values():
            reports.close()

    def pytest_report_header(self, config):
        return (
            f"capsules: {len(self.capsules)} capsule(s) on backend {self.backend_name}"
            f"{' (quick)' if self.quick else ''}, seed {self.seed}"
        )

    def pytest_terminal_summary(self, terminalreporter):
        if self._backend is not None:
            terminalreporter.write_line(f"capsules: {self._backend[1]}")


class CapsulesCollector(pytest.Collector):
    """`capsules`: one item per (capsule, check id), in the registry's order and design §4's."""

    def collect(self):
        from capsule_core.verify.checks import CHECKS

        plugin = self.config.pluginmanager.get_plugin("capsules-verification")
        return [
            CapsuleCheckItem.from_parent(self, name=f"{_short(c)}::{check}", capsule=c, check=check)
            for c in plugin.capsules
            for check in CHECKS
        ]


class CheckFailed(Exception):
    """A FAILED or ERROR check: its message is verify's line and rerun line."""


class CapsuleCheckItem(pytest.Item):
    def __init__(self, *, capsule, check: str, **kwargs):
        super().__init__(**kwargs)
        self.capsule, self.check = capsule, check

    def runtest(self):
        from capsule_core.errors import EnvironmentMissing

        plugin = self.config.pluginmanager.get_plugin("capsules-verification")
        try:
            report = plugin.report(self.capsule, self.session)
        except EnvironmentMissing as exc:
            raise CheckFailed(f"--capsules-backend {plugin.backend_name}: {exc}") from None
        result = next(r for r in report.results if r.check == self.check)
        status = result.status.value
        if status in ("FAILED", "ERROR"):
            measured = result.worst is not None and math.isfinite(result.worst)
            worst = f" (worst {result.worst:.3g} of the bound)" if measured else ""
            rerun = result.repro or (
                f"capsules verify {_short(self.capsule)} --check {self.check} "
                f"--seed {plugin.seed} --backend {plugin.backend()[0].name}"
            )
            raise CheckFailed(f"{status} {self.capsule.name} {self.check}: {result.reason}{worst}\n    rerun: {rerun}")
        if status == "SKIPPED":
            pytest.skip(result.reason)
        if status == "MISTRUSTED":
            pytest.skip(f"MISTRUSTED (could not tell): {result.reason}")

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CheckFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, ""
