"""What a new user meets in the first hour, through the real binary: mistakes are refused before the
program starts (bad `GRANARY_*` values, an output file that cannot be written, a missing `--`);
`--strict` refuses a job granary cannot serve without starting it; a job that was not served says
so on its report's first line, with the fix; a batch job's log shows the walk moving; `--help`
teaches; `granary status --metrics-file` writes what a collector parses."""
import json
import os
import subprocess
import sys
import time

import pytest

from conftest import Granary, make_dataset

STRICT_EXIT = 69


@pytest.fixture
def g(tmp_path):
    gr = Granary(tmp_path)
    yield gr
    gr.stop()


def run(g, *args, env=None, timeout=120):
    return subprocess.run([g.bin, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env={**g.env, **(env or {})})


def test_strict_refuses_a_missing_source_without_running_the_program(g, tmp_path, tier):
    marker = tmp_path / "ran"
    p = run(g, "run", "--strict", "--source", tmp_path / "no-such-dir", "--tier", tier, "--",
            "touch", marker)
    assert p.returncode == STRICT_EXIT, p
    assert not marker.exists(), "the program must not run"
    assert "cannot serve this job" in p.stderr and "fix:" in p.stderr, p.stderr
    # The same through the environment.
    p = run(g, "run", "--source", tmp_path / "no-such-dir", "--tier", tier, "--", "touch", marker,
            env={"GRANARY_STRICT": "1"})
    assert p.returncode == STRICT_EXIT and not marker.exists(), p


def test_strict_serves_a_job_granary_can_serve(g, dataset, tier, tmp_path):
    stats = tmp_path / "s.json"
    p = run(g, "run", "--strict", "--source", dataset, "--tier", tier, "--stats-json", stats, "--",
            sys.executable, "-c", f"import os; print(len(os.listdir({str(dataset)!r})))")
    assert p.returncode == 0, p
    assert p.stdout.strip() == str(len(os.listdir(dataset)))
    s = json.loads(stats.read_text())
    assert not s["disabled"] and s["fallback"] is None, s


def test_an_unserved_job_says_so_first_with_the_fix(g, tmp_path, tier):
    stats = tmp_path / "s.json"
    source = tmp_path / "typo"
    p = run(g, "run", "--source", source, "--tier", tier, "--stats-json", stats, "--", "true")
    assert p.returncode == 0, p
    lines = p.stderr.splitlines()
    assert lines[0].startswith(f"granary: source {source}") and "fix:" in lines[0], p.stderr
    assert any(line.startswith("granary: NOT SERVED") and "fix:" in line for line in lines), p.stderr
    s = json.loads(stats.read_text())
    assert s["disabled"] and str(source) in s["fallback"] and s["fix"], s


def test_an_unwritable_stats_file_fails_before_the_program_runs(g, dataset, tier, tmp_path):
    marker = tmp_path / "ran"
    p = run(g, "run", "--source", dataset, "--tier", tier, "--stats-json", "/nonexistent/x.json",
            "--", "touch", marker)
    assert p.returncode == 2, p
    assert not marker.exists(), "the program must not run"
    assert "--stats-json /nonexistent/x.json" in p.stderr, p.stderr


@pytest.mark.parametrize("var,value", [
    ("GRANARY_LOG", "shouty"),
    ("GRANARY_AGENT_TIMEOUT", "abc"),
    ("GRANARY_AGENT_TIMEOUT", "0"),
    ("GRANARY_AGENT_TIMEOUT", "-1s"),
    ("GRANARY_CACHE_DIR", "/nonexistent/cache"),
    ("GRANARY_STRICT", "maybe"),
    ("GRANARY_CONFIG", "/nonexistent/granary.toml"),
])
def test_a_bad_variable_is_an_error_naming_it(g, dataset, tmp_path, var, value):
    marker = tmp_path / "ran"
    p = run(g, "run", "--source", dataset, "--", "touch", marker, env={var: value})
    assert p.returncode == 2, p
    assert not marker.exists(), "the program must not run"
    assert f"{var}={value}" in p.stderr and "expected" in p.stderr, p.stderr


def test_a_mistyped_variable_name_is_pointed_out(g, dataset, tier):
    p = run(g, "run", "--source", dataset, "--tier", tier, "-q", "--", "true",
            env={"GRANARY_CACHEDIR": "/somewhere"})
    assert p.returncode == 0, p
    assert "GRANARY_CACHEDIR" in p.stderr and "did you mean GRANARY_CACHE_DIR" in p.stderr, p.stderr


def test_a_bad_idle_timeout_is_refused_before_the_program_runs(g, dataset, tier, tmp_path):
    marker = tmp_path / "ran"
    p = run(g, "run", "--source", dataset, "--tier", tier, "--idle-timeout", "soon", "--",
            "touch", marker)
    assert p.returncode == 2 and not marker.exists(), p
    assert "--idle-timeout `soon`" in p.stderr, p.stderr


def test_workers_zero_is_refused_as_the_configuration_refuses_it(g, dataset, tier, tmp_path):
    p = run(g, "run", "--source", dataset, "--tier", tier, "--workers", "0", "--", "true")
    assert p.returncode == 2, p
    cfg = tmp_path / "g.toml"
    cfg.write_text("[placement]\nworkers = 0\n")
    p2 = run(g, "run", "--source", dataset, "--tier", tier, "--config", cfg, "--", "true")
    assert p2.returncode == 2, p2


def test_a_forgotten_separator_gets_a_hint(g, dataset):
    p = run(g, "run", "--source", dataset, "python3", "train.py")
    assert p.returncode == 2, p
    assert "hint: put `--`" in p.stderr, p.stderr


def test_a_tier_larger_than_its_file_system_is_warned_about(g, dataset, tier):
    p = run(g, "run", "--source", dataset, "--tier", f"{tier}=1E", "-q", "--", "true")
    assert p.returncode == 0, p
    st = os.statvfs(tier)
    real = st.f_blocks * st.f_frsize / (1 << 30)
    assert "is given 1.0 EiB but its file system holds" in p.stderr, p.stderr
    assert f"{real:.1f} GiB" in p.stderr or real >= 1024, (real, p.stderr)


def test_help_puts_basic_options_first_and_shows_examples(g):
    top = run(g, "--help")
    assert top.returncode == 0 and "Examples:" in top.stdout, top
    h = run(g, "run", "--help", env={"COLUMNS": "80"})
    assert h.returncode == 0
    assert max(len(line) for line in h.stdout.splitlines()) <= 100, h.stdout
    basic, tuning = h.stdout.index("--source"), h.stdout.index("Placement tuning:")
    assert basic < tuning < h.stdout.index("--block-size"), h.stdout
    assert "Examples:" in h.stdout


def test_serve_is_listed_only_where_it_works(g):
    top = run(g, "--help").stdout
    p = run(g, "serve", "--source", "/nonexistent")
    if "serve" in top.split("Options:")[0]:
        return  # a build with MPI: `granary serve` is a command (test_cluster.py runs it)
    assert p.returncode == 2 and "built without MPI" in p.stderr and "--features mpi" in p.stderr, p


def test_a_batch_log_shows_the_walk_moving(g, tmp_path, tier):
    """stderr is a file here, as in a Slurm job: the walk's progress appears as lines. The tree is
    large enough (160,000 empty files) that its walk outlasts the agent's first progress reply
    (100 ms) on any machine; GRANARY_PROGRESS_EVERY is shorter than that reply's period."""
    source = tmp_path / "big"
    for d in range(400):
        cls = source / f"c{d:03}"
        cls.mkdir(parents=True)
        for f in range(400):
            os.close(os.open(cls / f"{f:04}.bin", os.O_CREAT | os.O_WRONLY, 0o644))
    log = tmp_path / "job.log"
    with open(log, "w") as err:
        p = subprocess.run([g.bin, "run", "--source", str(source), "--tier", str(tier), "--",
                            "true"], stderr=err, timeout=600,
                           env={**g.env, "GRANARY_PROGRESS_EVERY": "1ms"})
    text = log.read_text()
    assert p.returncode == 0, text
    assert "granary: cataloguing" in text, text
    assert "granary: catalogued " in text and "160000 files, 401 dirs" in text, text


def test_status_writes_metrics_a_collector_parses(g, dataset, tier, tmp_path):
    prom = pytest.importorskip("prometheus_client.parser")
    metrics = tmp_path / "granary.prom"
    p = run(g, "status", "--metrics-file", metrics)
    assert p.returncode == 0 and "granary_agent_up 0" in metrics.read_text(), p
    p = run(g, "run", "--source", dataset, "--tier", tier, "-q", "--", sys.executable, "-c",
            f"import os\nfor d,_,fs in os.walk({str(dataset)!r}):\n for f in fs:\n  p=os.path.join(d,f)\n  if os.path.isfile(p): open(p,'rb').read()")
    assert p.returncode == 0, p
    g.settle(dataset)
    p = run(g, "status", "--metrics-file", metrics)
    assert p.returncode == 0, p
    assert oct(os.stat(metrics).st_mode & 0o777) == "0o644"
    families = {f.name: f for f in prom.text_string_to_metric_families(metrics.read_text())}
    assert families["granary_agent_up"].samples[0].value == 1
    placed = {s.labels["source"]: s.value for s in families["granary_placed_files"].samples}
    assert placed[str(dataset)] > 0, placed
    opens = families["granary_served_opens"]
    assert opens.type == "counter" and sum(s.value for s in opens.samples) > 0, opens


def test_a_job_joining_a_running_agent_is_told_which_agent_wide_settings_it_does_not_get(
        g, dataset, tier, tmp_path):
    """The agent takes its pool, reuse and `[agent]` settings when it starts; a later job's
    configuration cannot change them, and must not be ignored silently."""
    fifo = tmp_path / "hold"
    os.mkfifo(fifo)
    # The first job starts the agent without a configuration and holds it.
    first = subprocess.Popen([g.bin, "run", "--source", dataset, "--tier", tier, "--", "cat", fifo],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=g.env)
    try:
        conf = tmp_path / "job.toml"
        conf.write_text('[reuse]\nverify = "checksum"\n[placement]\nblock_size = "8M"\n'
                        '[agent]\nidle_timeout = "45s"\n')
        # The agent's own defaults (block_size 8M among them) are not reported, the others are.
        deadline = time.monotonic() + 120
        while not g.agent_pids() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert g.agent_pids(), "the first job's agent never started"
        p = run(g, "run", "--config", conf, "--source", dataset, "--tier", tier, "--", "cat",
                dataset / sorted(os.listdir(dataset))[0])
        assert p.returncode == 0, p
        notes = [line for line in p.stderr.splitlines() if "is not applied" in line]
        assert any('[reuse] verify = "checksum"' in n and '"identity"' in n for n in notes), p.stderr
        assert any('[agent] idle_timeout = "45s"' in n and '"30s"' in n for n in notes), p.stderr
        assert not any("block_size" in n for n in notes), p.stderr
        assert all("granary stop" in n for n in notes), p.stderr
        # A job whose settings are the agent's hears nothing of them.
        same = tmp_path / "same.toml"
        same.write_text('[reuse]\nverify = "identity"\n')
        p = run(g, "run", "--config", same, "--source", dataset, "--tier", tier, "--", "true")
        assert p.returncode == 0 and "is not applied" not in p.stderr, p.stderr
    finally:
        with open(fifo, "w"):
            pass
        first.wait(timeout=120)
    assert first.returncode == 0, first.stderr
    assert "is not applied" not in first.stderr, first.stderr


def test_a_job_that_starts_the_agent_with_its_configuration_hears_no_setting_unapplied(
        g, dataset, tier, tmp_path):
    conf = tmp_path / "job.toml"
    conf.write_text('[reuse]\nverify = "checksum"\n[placement]\nworkers = 1\nblock_size = "4M"\n'
                    '[mmap]\nmode = "watch"\n[agent]\nidle_timeout = "45s"\nlog_level = "warn"\n')
    p = run(g, "run", "--config", conf, "--workers", "2", "--source", dataset, "--tier", tier,
            "--", "true")
    assert p.returncode == 0, p
    assert "is not applied" not in p.stderr, p.stderr
