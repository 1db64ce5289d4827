"""No report is lost, no run is wasted: verify, fuzz and bench refuse an output path that cannot be
written before any work (exit 2, naming the option, the path and the reason); reports are written
atomically; the JSON report's exit_code is the process's."""

import json
import os
import types

import pytest
from typer.testing import CliRunner

from capsule_core import output_files
from capsule_core.bench import engine as bench
from capsule_core.fuzz import engine as fuzz
from capsule_core.verify import engine as verify_engine
from cli.app import app

runner = CliRunner()


@pytest.fixture
def no_work(monkeypatch):
    """Fails the test if any command starts its run."""

    def started(*args, **kwargs):
        raise AssertionError("the run started before the output path was refused")

    for module, name in ((verify_engine, "verify_capsule"), (fuzz, "fuzz"), (bench, "run")):
        monkeypatch.setattr(module, name, started)


def unwritable_cases(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    return {
        "missing folder": (tmp_path / "missing" / "out.json", f"the folder {tmp_path / 'missing'} does not exist"),
        "a directory": (tmp_path, "it is a directory"),
        "under a file": (a_file / "out.json", f"{a_file} is not a folder"),
    }


@pytest.mark.parametrize("case", ["missing folder", "a directory", "under a file"])
@pytest.mark.parametrize(
    "command, option",
    [
        (("verify", "relu", "--backend", "numpy"), "--json"),
        (("verify", "relu", "--backend", "numpy"), "--junit"),
        (("bench", "relu", "--backend", "numpy"), "--json"),
        (("bench", "relu", "--backend", "numpy"), "--csv"),
        (("bench", "relu", "--backend", "numpy"), "--plot"),
    ],
)
def test_an_unwritable_output_is_refused_before_any_work(tmp_path, no_work, command, option, case):
    path, reason = unwritable_cases(tmp_path)[case]
    result = runner.invoke(app, [*command, option, str(path)])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == f"capsules: error: {option}: cannot write {path}: {reason}"


def test_the_acceptance_path(no_work):
    result = runner.invoke(app, ["verify", "relu", "--json", "/nonexistent/dir/out.json"])
    assert result.exit_code == 2 and result.stdout == ""
    assert "--json: cannot write /nonexistent/dir/out.json: the folder /nonexistent/dir does not exist" in result.stderr


def test_fuzz_refuses_a_save_folder_it_cannot_create(tmp_path, no_work):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    result = runner.invoke(app, ["fuzz", "relu", "--backend", "numpy", "--save", str(a_file / "failures")])
    assert result.exit_code == 2
    assert f"--save: cannot write into {a_file / 'failures'}: {a_file} is not a folder" in result.stderr


def test_fuzz_checks_its_default_save_folder_too(tmp_path, no_work, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "capsules-fuzz-failures").write_text("a file in the way")
    result = runner.invoke(app, ["fuzz", "relu", "--backend", "numpy"])
    assert result.exit_code == 2 and "--save: cannot write into capsules-fuzz-failures" in result.stderr


def test_no_permission_is_named(tmp_path, no_work, monkeypatch):
    """Root ignores file modes, so the refusal of the file system is simulated."""

    def refused(**kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(output_files, "tempfile", types.SimpleNamespace(mkstemp=refused))
    result = runner.invoke(app, ["verify", "relu", "--backend", "numpy", "--junit", str(tmp_path / "r.xml")])
    assert result.exit_code == 2
    assert (
        f"--junit: cannot write {tmp_path / 'r.xml'}: cannot create a file in {tmp_path}: Permission denied"
        in result.stderr
    )


def test_the_json_report_records_the_process_exit_code_after_ctrl_c(tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(verify_engine, "verify_capsule", interrupted)
    report = tmp_path / "partial.json"
    result = runner.invoke(app, ["verify", "relu", "--backend", "numpy", "--json", str(report)])
    assert result.exit_code == 130 and json.loads(report.read_text())["exit_code"] == 130


def test_reports_are_written_and_leave_no_temporary_files(tmp_path):
    result = runner.invoke(
        app,
        [
            "verify",
            "relu",
            "--backend",
            "numpy",
            "--quick",
            "--check",
            "value",
            "--json",
            str(tmp_path / "r.json"),
            "--junit",
            str(tmp_path / "r.xml"),
        ],
    )
    assert result.exit_code == 0
    assert json.loads((tmp_path / "r.json").read_text())["exit_code"] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "r.xml"]


# -- the helpers ---------------------------------------------------------------------------------------


def test_all_files_or_none(tmp_path):
    first = tmp_path / "first.json"
    first.write_text("the previous report")
    with pytest.raises(OSError):
        output_files.write_texts_atomic({first: "new", tmp_path / "missing" / "second.xml": "new"})
    assert first.read_text() == "the previous report"
    assert [p.name for p in tmp_path.iterdir()] == ["first.json"]


def test_a_failed_writer_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "roof.png"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with output_files.atomic_path(target) as temporary:
            assert temporary.parent == tmp_path and temporary.suffix == ".png"
            temporary.write_bytes(b"half")
            raise RuntimeError("the plot failed")
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["roof.png"]


def test_modes_follow_the_replaced_file_or_the_umask(tmp_path):
    kept = tmp_path / "kept.json"
    kept.write_text("")
    os.chmod(kept, 0o640)
    output_files.write_text_atomic(kept, "x")
    assert kept.stat().st_mode & 0o777 == 0o640
    umask = os.umask(0o022)
    try:
        output_files.write_text_atomic(tmp_path / "new.json", "x")
    finally:
        os.umask(umask)
    assert (tmp_path / "new.json").stat().st_mode & 0o777 == 0o644


def test_a_folder_to_be_made_is_judged_by_its_nearest_existing_parent(tmp_path):
    assert output_files.unwritable_folder(tmp_path / "a" / "b") is None
    assert output_files.unwritable_folder(tmp_path) is None
    assert output_files.unwritable_file(tmp_path / "new.json") is None
