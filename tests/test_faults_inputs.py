"""The fault matrix, continued: bad input, signals in every phase, a full disk, a killed loadgen, the simulator's
own faults, run names and the Locust master's interface. Same contract as test_faults.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from tests.run_helpers import ROOT, read_until, run_cli, start_cli, summary, wait_for
from tests.test_faults import API_KEY, HEADER_SECRET, SCENARIO, assert_clean

SECRET_ARGS = ["--api-key-env", "LOADGEN_FAULT_KEY", "--set", "target.headers={X-Api-Key: " + HEADER_SECRET + "}"]
SECRET_ENV = {"LOADGEN_FAULT_KEY": API_KEY}
ALIAS_BOMB = "\n".join(["a: &a [x, x, x, x, x, x, x, x, x, x]"] +
                       [f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
                        f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
                        f"*{chr(97 + i)}, *{chr(97 + i)}]" for i in range(8)]) + "\nname: bomb\n"


def one_line_exit_2(res, message: str) -> None:
    assert res.returncode == 2, res.stdout + res.stderr
    assert message in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stdout + res.stderr


# ---- 4, 8, 11. input that would exhaust memory, crash, or be blamed on the wrong thing -------------------------
@pytest.mark.parametrize("args, message", [
    (["--duration", "inf"], "--duration inf: give a time, e.g. 20, 20s, 2m or 1h"),
    (["--duration", "nan"], "--duration nan: give a time, e.g. 20, 20s, 2m or 1h"),
    (["--set", "load.duration_s=1e9"], "load.duration_s: Input should be less than or equal to 604800"),
    (["--duration", "1e9"], "--duration: load.duration_s: Input should be less than or equal to 604800"),
    (["--set", "load.rate_per_s=1.0e9"], "the plan would hold ~2,000,000,000 requests"),
    (["--set", "load={arrival: concurrency, concurrency: 100000000, requests: 10}"],
     "load.concurrency: Input should be less than or equal to 10000"),
    (["--set", "workload.classes.0.prompt_tokens={dist: fixed, value: 1000000000}"],
     "workload.classes.0.prompt_tokens.value: Input should be less than or equal to 1048576"),
    (["--set", "target.ttft_timeout_s=.inf"], "Input should be a finite number"),
    (["--base-url", "http://127.0.0.1:abc/v1"], "--base-url: target.base_url: Value error, the port must be a number"),
    (["--base-url", "http://127.0.0.1:99999/v1"], "the port must be a number from 1 to 65535"),
    (["--set", "target.tokenizer=/no/such/tokenizer.json"], "target.tokenizer: no such file"),
])
def test_bad_values_are_one_line_and_exit_2_naming_the_flag(scenario, tmp_path, args, message):
    out = tmp_path / "run"
    res = run_cli("run", str(scenario), "--out", str(out), "--no-progress", *args, *SECRET_ARGS, env=SECRET_ENV,
                  timeout=60)
    one_line_exit_2(res, message)
    assert not out.exists()
    assert_clean(res, None)


def test_help_into_a_pipe_works_through_the_redacting_stdout():
    res = run_cli("run", "--help", timeout=60)  # stdout is a pipe: click probes it with bytes
    assert res.returncode == 0 and "--request-timeout" in res.stdout and "--drain-timeout" in res.stdout


@pytest.mark.parametrize("args", [["run", "scenarios/smoke.yaml", "--bogus"], ["run"],
                                  ["report", "/nonexistent"], ["target", "vllm", "--model", "/m", "--device", "tpu"]])
def test_usage_errors_are_exit_2_without_a_traceback(args):
    res = run_cli(*args, timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stdout + res.stderr and "internal error" not in res.stderr


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(ALIAS_BOMB)  # 10^9 values when expanded
    one_line_exit_2(run_cli("validate", str(path), timeout=30), "the YAML expands to over 100,000 values")
    path.write_text("a: &a [1, *a]\nname: x\n")
    one_line_exit_2(run_cli("validate", str(path), timeout=30), "an alias refers to itself")


def test_non_utf8_yaml_is_exit_2_naming_the_byte(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(SCENARIO.encode() + "description: caf\xe9\n".encode("latin-1"))
    one_line_exit_2(run_cli("validate", str(path), timeout=30), f"latin1.yaml:{SCENARIO.count(chr(10)) + 1}: not UTF-8 text (byte 0xe9")


def test_out_naming_a_file_or_an_unwritable_place_is_exit_2(scenario, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    one_line_exit_2(run_cli("run", str(scenario), "--out", str(afile), timeout=60), f"--out {afile}: not a directory")
    one_line_exit_2(run_cli("run", str(scenario), "--out", "/proc/loadgen-test/run", timeout=60),
                    "--out /proc/loadgen-test/run: cannot write there")


def test_a_tokenizer_file_without_the_tokenizers_library_names_the_extra(scenario, tmp_path):
    blocker = tmp_path / "site"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['tokenizers'] = None\n")
    (tmp_path / "tokenizer.json").write_text("{}")
    res = run_cli("validate", str(scenario), "--set", f"target.tokenizer={tmp_path / 'tokenizer.json'}",
                  env={"PYTHONPATH": f"{blocker}{os.pathsep}{ROOT}"}, timeout=60)
    one_line_exit_2(res, "target.tokenizer needs the tokenizers library: pip install 'loadgen[tokenizers]'")


def test_an_internal_error_is_exit_4_with_one_line_naming_the_traceback_file(scenario, tmp_path):
    code = ("import sys, loadgen.run.runner as r\n"
            "def boom(*a, **k): raise RuntimeError('planted bug ' + 'sk-fault-key-1f2e3d4c')\n"
            "r.build_plan = boom\nsys.argv = ['loadgen'] + sys.argv[1:]\nfrom loadgen.cli.main import main\nmain()\n")
    res = subprocess.run([sys.executable, "-c", code, "run", str(scenario), "--out", str(tmp_path / "run"),
                          *SECRET_ARGS], capture_output=True, text=True, cwd=ROOT, env={**os.environ, **SECRET_ENV},
                         timeout=60)
    assert res.returncode == 4
    line, = res.stderr.strip().splitlines()
    assert line.startswith("loadgen: internal error (RuntimeError: planted bug ***); traceback written to ")
    crash = Path(line.split("traceback written to ")[1].split(" — ")[0])
    assert "Traceback" in crash.read_text() and API_KEY not in crash.read_text()
    crash.unlink()
    assert_clean(res, tmp_path / "run")


# ---- 9. run names are never paths ----------------------------------------------------------------------------
@pytest.mark.slow
def test_a_scenario_name_with_a_path_stays_inside_the_reports_directory(server, scenario, tmp_path):
    cwd = tmp_path / "a" / "b"
    cwd.mkdir(parents=True)
    res = run_cli("run", str(scenario), "--no-progress", "--no-png", "--set", "name=../../x",
                  "--base-url", server.url("ok"), cwd=cwd, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    runs = list((cwd / "reports").iterdir())
    assert len(runs) == 1 and runs[0].name.endswith("-x") and (runs[0] / "summary.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "fault.yaml"]


# ---- 6, 7. signals in every phase, a killed loadgen ------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_the_preflight_is_exit_3_with_a_line(server, scenario, tmp_path, sig):
    out = tmp_path / "run"
    before = len(server.seen)
    proc = start_cli("run", str(scenario), "--out", str(out), "--no-progress", "--base-url",
                     server.url("silent-all"), *SECRET_ARGS, env=SECRET_ENV)
    wait_for(lambda: len(server.seen) > before, 30, "the preflight's first request")
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 3 and stderr.strip() == "loadgen: interrupted before anything was sent"
    assert not out.exists()
    assert_clean(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), None)


@pytest.mark.slow
def test_a_second_ctrl_c_while_reports_are_written_is_exit_3_and_keeps_the_records(tmp_path):
    out = tmp_path / "run"
    proc = start_cli("run", "scenarios/smoke.yaml", "--out", str(out), "--duration", "60", "--no-progress",
                     *SECRET_ARGS, env=SECRET_ENV)
    wait_for(lambda: any(out.glob("requests.part-*.parquet")), 60, "the first flushed records")
    proc.send_signal(signal.SIGINT)  # the first: the run stops, reports begin (PNGs: a few seconds)
    wait_for(lambda: (out / "run.json").exists() and json.loads((out / "run.json").read_text())["finished"],
             60, "run.json marked finished (the reports are being written)")
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 3 and "Traceback" not in stderr
    assert f"interrupted while writing the reports; the records taken are kept in {out}" in stderr
    assert pl.read_parquet(out / "requests.parquet").height > 0
    again = run_cli("report", str(out), "--no-png")
    assert again.returncode == 3 and summary(out)["interrupted"]
    assert_clean(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr + again.stdout), out)


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


@pytest.mark.slow
def test_sigkill_of_loadgen_takes_the_simulator_down_and_report_says_inconclusive(tmp_path):
    out = tmp_path / "run"
    proc = start_cli("run", "scenarios/smoke.yaml", "--out", str(out), "--duration", "60", "--no-progress",
                     *SECRET_ARGS, env=SECRET_ENV)
    wait_for(lambda: any(out.glob("requests.part-*.parquet")), 60, "the first flushed records")
    sims = [c for c in _children(proc.pid) if "local_target.sim" in Path(f"/proc/{c}/cmdline").read_text()]
    assert len(sims) == 1
    proc.kill()
    proc.communicate(timeout=30)
    wait_for(lambda: not Path(f"/proc/{sims[0]}").exists() or "Z" in Path(f"/proc/{sims[0]}/stat").read_text()
             .split(")")[1][:3], 15, "the orphaned simulator to end")
    res = run_cli("report", str(out), "--no-png")
    assert res.returncode == 3 and "INCONCLUSIVE" in res.stdout and "Traceback" not in res.stderr
    assert "the run did not finish" in summary(out)["reasons"][0]
    assert_clean(res, out)


# ---- 5. a full disk ------------------------------------------------------------------------------------------
@pytest.fixture
def tiny_disk(tmp_path: Path):
    """A 1 MiB tmpfs (root only; the machine's CI runs as root)."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if res.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"cannot mount a tmpfs for the disk-full test: {res.stderr.decode().strip()}")
        pytest.skip("mounting a tmpfs needs root")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["asyncio", "locust"])
def test_a_full_disk_stops_the_run_inconclusive_and_report_names_broken_parts(server, scenario, tiny_disk, engine):
    """Either driver (one RunSession owns the flush and its disk-full stop): the run stops, exit 3, records kept."""
    (tiny_disk / "filler").write_bytes(b"\0" * (1024 * 1024 - 96 * 1024))  # leave ~96 KiB
    out = tiny_disk / "run"
    res = run_cli("run", str(scenario), "--out", str(out), "--no-progress", "--base-url", server.url("ok"),
                  "--engine", engine, "--set", "load.rate_per_s=40", "--set", "load.duration_s=20", "--set",
                  "workload.classes.0.output_tokens={dist: fixed, value: 200}", *SECRET_ARGS, env=SECRET_ENV,
                  timeout=120)
    assert res.returncode == 3, res.stdout + res.stderr
    assert "INCONCLUSIVE" in res.stdout and "records could not be written: No space left on device" in res.stdout
    assert_clean(res, out)
    assert json.loads((out / "run.json").read_text())["engine"] == engine
    (tiny_disk / "filler").unlink()
    (out / "requests.part-09998.parquet").write_bytes(b"")  # what the old code left behind on a full disk
    (out / "chunks.part-09998.parquet").write_bytes(b"")
    again = run_cli("report", str(out), "--no-png")
    assert again.returncode == 3 and "Traceback" not in again.stderr
    reasons = " ".join(summary(out)["reasons"])
    assert "requests.part-09998.parquet + chunks.part-09998.parquet: unreadable" in reasons


# ---- the simulator's own faults --------------------------------------------------------------------------------
@pytest.mark.parametrize("faults, sets, code, kind", [
    ("{error_rate: 1.0}", [], 2, None),  # the preflight's probe gets 500s: nothing is sent
    ("{disconnect_rate: 1.0}", [], 1, "protocol"),
    ("{malformed_rate: 1.0}", [], 2, None),  # the probe's answer is malformed too: the preflight refuses it
    # the simulator draws its faults from random.Random(seed + 1): at 0.12 the probe (the first draw, 0.134) is
    # whole, and of the run's 17 requests the 8th gets a malformed chunk (draw 0.094), every time
    ("{malformed_rate: 0.12}", ["load.duration_s=4"], 1, "protocol"),
    ("{stall_ms: 1500, stall_every_s: 0.5}", ["target.idle_timeout_s=0.5"], 1, "timeout_idle"),
], ids=["errors", "disconnects", "malformed-all", "malformed-some", "stalls"])
@pytest.mark.slow
def test_simulator_faults_are_counted_with_their_kind(scenario, tmp_path, faults, sets, code, kind):
    out = tmp_path / "run"
    res = run_cli("run", str(scenario), "--out", str(out), "--no-progress", "--no-png", "--set",
                  f"target.simulator.faults={faults}", *(x for s in sets for x in ("--set", s)), *SECRET_ARGS,
                  env=SECRET_ENV, timeout=120)
    assert res.returncode == code, res.stdout + res.stderr
    assert_clean(res, out)
    if kind is not None:
        s = summary(out)
        assert s["requests"]["errors_by_kind"].get(kind, 0) > 0 and s["verdict"] == "fail"
        assert pl.read_parquet(out / "requests.parquet").height == s["requests"]["sent"]


# ---- 10. the Locust master binds loopback unless told otherwise -------------------------------------------------
def _listening(port: int) -> set[str]:
    addrs = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            host, hex_port = local.rsplit(":", 1)
            if state == "0A" and int(hex_port, 16) == port:
                addrs.add(host)
    return addrs


def test_ui_master_binds_loopback_by_default(tmp_path):
    ui_port, master_port = 18089 + os.getpid() % 500, 15557 + os.getpid() % 500
    proc = start_cli("ui", "scenarios/smoke.yaml", "--master", "--port", str(ui_port), "--master-bind-port",
                     str(master_port), "--reports", str(tmp_path))
    try:
        read_until(proc, "workers:", 60)
        assert _listening(master_port) == {"0100007F"}  # 127.0.0.1 only, not 0.0.0.0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
