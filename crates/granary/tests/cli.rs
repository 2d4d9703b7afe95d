//! Drives the real `granary` binary. Each test gets its own runtime directory (so its own agent),
//! source and tier, and stops its agent at the end.

mod common;

use common::{ensure_preload, granary_cmd};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new(files: usize) -> Env {
        ensure_preload();
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        for i in 0..files {
            let d = src.join(format!("c{}", i % 3));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join(format!("f{i}")), vec![i as u8; 1000 + i * 37]).unwrap();
        }
        std::fs::create_dir_all(&src).unwrap();
        Env { dir }
    }
    fn src(&self) -> PathBuf {
        self.dir.path().join("src")
    }
    /// The paths of the first `n` files `new` wrote, as a program's arguments.
    fn files(&self, n: usize) -> Vec<String> {
        (0..n)
            .map(|i| {
                self.src()
                    .join(format!("c{}/f{i}", i % 3))
                    .display()
                    .to_string()
            })
            .collect()
    }
    fn tier(&self) -> PathBuf {
        self.dir.path().join("tier")
    }
    fn rt(&self) -> PathBuf {
        self.dir.path().join("rt")
    }
    fn cmd(&self) -> Command {
        granary_cmd(&self.rt())
    }
    fn run(&self, extra: &[&str], program: &[&str]) -> Output {
        let mut c = self.cmd();
        c.arg("run")
            .arg("--source")
            .arg(self.src())
            .arg("--tier")
            .arg(format!("{}=64M", self.tier().display()))
            .arg("--idle-timeout=20s")
            .args(extra)
            .arg("--")
            .args(program);
        c.output().unwrap()
    }
    fn status(&self) -> serde_json::Value {
        let o = self.cmd().args(["status", "--json"]).output().unwrap();
        serde_json::from_slice(&o.stdout).unwrap()
    }
    fn agent_pid(&self) -> Option<i64> {
        self.status()["pid"].as_i64()
    }
    fn stop(&self) {
        let _ = self.cmd().arg("stop").output();
    }
    fn wait_placed(&self, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let s = self.status();
            let placed = s["sources"][0]["files_placed_now"].as_u64().unwrap_or(0);
            if placed >= n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "only {placed} of {n} placed: {s}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        self.stop();
    }
}

#[test]
fn exit_status_is_the_programs() {
    let e = Env::new(3);
    assert_eq!(e.run(&["-q"], &["true"]).status.code(), Some(0));
    assert_eq!(e.run(&["-q"], &["false"]).status.code(), Some(1));
    assert_eq!(
        e.run(&["-q"], &["sh", "-c", "exit 3"]).status.code(),
        Some(3)
    );
    assert_eq!(
        e.run(&["-q"], &["sh", "-c", "kill -TERM $$"]).status.code(),
        Some(128 + 15)
    );
}

#[test]
fn disabled_runs_the_program_plainly() {
    let e = Env::new(1);
    let json = e.dir.path().join("s.json");
    let o = e
        .cmd()
        .env("GRANARY_DISABLE", "1")
        .arg("run")
        .arg("--source")
        .arg(e.src())
        .arg("--stats-json")
        .arg(&json)
        .args(["--", "sh", "-c", "exit 5"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(5));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["disabled"], true);
    assert_eq!(v["exit_status"], 5);
    assert!(
        !e.rt().join("agent.sock").exists(),
        "no agent when disabled"
    );
}

#[test]
fn stats_json_has_the_documented_keys() {
    let e = Env::new(6);
    let json = e.dir.path().join("s.json");
    let o = e.run(
        &["--stats-json", json.to_str().unwrap()],
        &["sh", "-c", "exit 0"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["version"], 1);
    assert_eq!(v["exit_status"], 0);
    assert_eq!(v["catalog"]["files"], 6);
    assert_eq!(v["catalog"]["dirs"], 4);
    assert!(v["job_slot"].as_u64().unwrap() >= 1);
    for k in ["opens", "reads", "bytes", "metadata_calls"] {
        assert!(v["source_io"][k].is_u64(), "source_io.{k}");
    }
    for k in [
        "files_placed",
        "bytes_placed",
        "agent_source_opens",
        "failures",
    ] {
        assert!(v["placement"][k].is_u64(), "placement.{k}");
    }
    let t = &v["tiers"][0];
    for k in [
        "capacity",
        "used",
        "files_served",
        "bytes_served",
        "files_placed",
        "bytes_placed",
    ] {
        assert!(t[k].is_u64(), "tiers[0].{k}");
    }
    assert_eq!(t["capacity"], 64 << 20);
    assert!(v["wall_time_s"].is_f64());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("tier 0"), "report table on stderr: {err}");
}

#[test]
fn bad_config_is_one_line_naming_the_key() {
    let e = Env::new(1);
    let cfg = e.dir.path().join("g.toml");
    std::fs::write(&cfg, "[[tier]]\npath = \"/tmp/x\"\ncapcity = \"8G\"\n").unwrap();
    let o = e
        .cmd()
        .arg("run")
        .arg("--source")
        .arg(e.src())
        .arg("--config")
        .arg(&cfg)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        err.trim_end(),
        format!(
            "granary: config {}: unknown key `tier[0].capcity` (line 3)",
            cfg.display()
        )
    );
    // The same through GRANARY_CONFIG.
    let o = e
        .cmd()
        .env("GRANARY_CONFIG", &cfg)
        .arg("run")
        .arg("--source")
        .arg(e.src())
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn config_file_tiers_are_used() {
    let e = Env::new(2);
    let cfg = e.dir.path().join("g.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[tier]]\npath = \"{}\"\ncapacity = \"10M\"\nblock_size = \"64K\"\n[agent]\nidle_timeout = \"20s\"\n",
            e.tier().display()
        ),
    )
    .unwrap();
    let json = e.dir.path().join("s.json");
    let o = e
        .cmd()
        .arg("run")
        .arg("--source")
        .arg(e.src())
        .arg("--config")
        .arg(&cfg)
        .arg("--stats-json")
        .arg(&json)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["tiers"][0]["capacity"], 10 << 20);
    assert_eq!(e.status()["idle_timeout_s"], 20.0);
}

#[test]
fn agent_is_reused_by_sequential_runs() {
    let e = Env::new(2);
    assert!(e.run(&["-q"], &["true"]).status.success());
    let pid = e.agent_pid().expect("agent running");
    assert!(e.run(&["-q"], &["true"]).status.success());
    assert_eq!(e.agent_pid(), Some(pid));
    assert_eq!(e.status()["jobs"], 0);
}

#[test]
fn agent_exits_when_idle() {
    let e = Env::new(1);
    let o = e
        .cmd()
        .arg("run")
        .arg("-q")
        .arg("--source")
        .arg(e.src())
        .arg("--tier")
        .arg(e.tier())
        .arg("--idle-timeout=1s")
        .args(["--", "true"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let deadline = Instant::now() + Duration::from_secs(15);
    while e.rt().join("agent.sock").exists() {
        assert!(Instant::now() < deadline, "agent still running");
        std::thread::sleep(Duration::from_millis(100));
    }
    let tables = std::fs::read_dir(e.rt())
        .unwrap()
        .filter(|d| {
            d.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".table")
        })
        .count();
    assert_eq!(tables, 0, "tables removed on exit");
    assert!(std::fs::read_dir(e.tier()).unwrap().count() > 0);
}

#[test]
fn killed_agent_is_replaced() {
    let e = Env::new(2);
    assert!(e.run(&["-q"], &["true"]).status.success());
    let pid = e.agent_pid().unwrap();
    // SAFETY: kill(2) on the agent this test started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        e.rt().join("agent.sock").exists(),
        "stale socket left behind"
    );
    let o = e.run(&["-q"], &["sh", "-c", "exit 4"]);
    assert_eq!(
        o.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let new = e.agent_pid().unwrap();
    assert_ne!(new, pid);
}

/// In a memory cgroup that runs out, the kernel must kill the agent (jobs survive that), not
/// the job; and the program keeps the oom_score_adj it was started with.
#[test]
fn the_agent_volunteers_as_oom_victim_and_the_program_does_not() {
    let e = Env::new(1);
    let mine = std::fs::read_to_string("/proc/self/oom_score_adj").unwrap();
    let o = e.run(&["-q"], &["cat", "/proc/self/oom_score_adj"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout), mine);
    let pid = e.agent_pid().expect("agent running");
    let agent = std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).unwrap();
    assert_eq!(agent.trim(), "1000");
}

#[test]
fn placed_files_persist_across_agents() {
    let e = Env::new(9);
    let files = e.files(9);
    let mut prog = vec!["cat"];
    prog.extend(files.iter().map(|s| s.as_str()));
    let o = e.run(&["-q"], &prog);
    assert!(o.status.success());
    assert_eq!(o.stdout.len(), (0..9).map(|i| 1000 + i * 37).sum::<usize>());
    e.wait_placed(9);
    e.stop();
    let catalog = std::fs::read_dir(e.tier())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    assert!(catalog.join("catalog.table").exists());
    assert_eq!(
        std::fs::read_dir(catalog.join("objects")).unwrap().count(),
        9
    );

    // A changed file is not reused.
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(&files[0], b"changed").unwrap();
    let json = e.dir.path().join("s.json");
    let o = e.run(&["-q", "--stats-json", json.to_str().unwrap()], &prog);
    assert!(o.status.success());
    assert!(o.stdout.starts_with(b"changed"), "never served stale");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    // Adopted when the catalog is loaded; the changed one is voided when it is checked against
    // the source (before it is ever served).
    assert_eq!(v["catalog"]["reused_files"], 9);
    if v["opens"].as_u64().unwrap_or(0) > 0 {
        // The preload library is counting: the reused copies were served from the tier.
        assert_eq!(v["tiers"][0]["files_served"], 8, "{v}");
        assert_eq!(v["source_io"]["bytes"], 7, "{v}");
    }
}

/// The status entry of one source.
fn source_status(status: &serde_json::Value, src: &Path) -> serde_json::Value {
    status["sources"]
        .as_array()
        .and_then(|a| {
            a.iter()
                .find(|s| s["source"].as_str() == Some(src.to_str().unwrap()))
        })
        .cloned()
        .unwrap_or_else(|| panic!("{} not in status: {status}", src.display()))
}

/// Polls `granary status` until the source has no placement work left (and was not busy, so
/// the whole entry is filled in); checks on every poll
/// that none of its tiers holds more than its capacity. Returns the last status entry.
fn wait_settled(e: &Env, src: &Path) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = source_status(&e.status(), src);
        for t in s["tiers"].as_array().unwrap() {
            let (used, reserved) = (t["used"].as_u64().unwrap(), t["reserved"].as_u64().unwrap());
            assert!(used + reserved <= t["capacity"].as_u64().unwrap(), "{t}");
        }
        if s["pending"] == 0 && s["busy"] == false {
            return s;
        }
        assert!(Instant::now() < deadline, "placement never settled: {s}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Writes `n` files of `size` bytes under `dir`; returns their paths.
fn make_files(dir: &Path, n: usize, size: usize) -> Vec<String> {
    std::fs::create_dir_all(dir).unwrap();
    (0..n)
        .map(|i| {
            let p = dir.join(format!("g{i}"));
            std::fs::write(&p, vec![b'a' + (i % 26) as u8; size]).unwrap();
            p.display().to_string()
        })
        .collect()
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// One agent, two sources run one after the other with different tier directories and
/// capacities: each source's copies go to its own tier, and the small tier's capacity holds. A
/// tier's capacity changes when no job uses it; while one does, a job asking another is told
/// once (and not under `-q`). A source moved to another tier keeps its copies in the old one,
/// and takes them up again when it comes back.
#[test]
fn each_source_uses_its_own_tiers() {
    let e = Env::new(0);
    let (src_a, src_b) = (e.dir.path().join("a"), e.dir.path().join("b"));
    let (tier_x, tier_y) = (e.dir.path().join("x"), e.dir.path().join("y"));
    let files_a = make_files(&src_a, 6, 3000);
    // 20 files of 10000 bytes cost 12288 bytes each in 4 KiB blocks: exactly 5 fit in 64 KiB.
    let files_b = make_files(&src_b, 20, 10_000);
    let run = |src: &Path, tier: String, files: &[String], extra: &[&str]| {
        let mut c = e.cmd();
        c.arg("run")
            .args(extra)
            .arg("--source")
            .arg(src)
            .arg("--tier")
            .arg(tier)
            .arg("--idle-timeout=30s")
            .arg("--")
            .arg("cat")
            .args(files);
        let o = c.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        o
    };

    let o = run(&src_a, format!("{}=1G", tier_x.display()), &files_a, &[]);
    assert_eq!(o.stdout.len(), 6 * 3000);
    let pid = e.agent_pid().expect("agent running");
    let a = wait_settled(&e, &src_a);
    assert_eq!(a["files_placed_now"], 6, "{a}");
    let id_a = a["id"].as_str().unwrap().to_string();

    let o = run(&src_b, format!("{}=64K", tier_y.display()), &files_b, &[]);
    assert_eq!(o.stdout.len(), 20 * 10_000);
    assert_eq!(e.agent_pid(), Some(pid), "the same agent served both");
    let b = wait_settled(&e, &src_b);
    let id_b = b["id"].as_str().unwrap().to_string();
    assert_eq!(b["tiers"].as_array().unwrap().len(), 1, "{b}");
    assert_eq!(b["tiers"][0]["path"], tier_y.to_str().unwrap());
    assert_eq!(b["tiers"][0]["capacity"], 64 << 10);
    assert_eq!(b["files_placed_now"], 5, "{b}");
    assert_eq!(b["tiers"][0]["used"], 5 * 12288);
    // A keeps its own tier, untouched by B.
    let a = source_status(&e.status(), &src_a);
    assert_eq!(a["tiers"][0]["path"], tier_x.to_str().unwrap());
    assert_eq!(a["files_placed_now"], 6);
    assert_eq!(entries(&tier_x), vec![id_a.clone()]);
    assert_eq!(entries(&tier_y), vec![id_b.clone()]);
    assert_eq!(entries(&tier_y.join(&id_b).join("objects")).len(), 5);
    assert_eq!(entries(&tier_x.join(&id_a).join("objects")).len(), 6);
    let all = e.status();
    assert_eq!(all["tiers"].as_array().unwrap().len(), 2, "{all}");

    // B again, asking for more room in the same directory while no job uses it: the new
    // capacity is applied (nothing to say), the five copies are reused, the rest placed.
    let o = run(&src_b, format!("{}=1M", tier_y.display()), &files_b, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("capacity"), "{err}");
    let b = wait_settled(&e, &src_b);
    assert_eq!(b["catalog"]["reused_files"], 5, "{b}");
    assert_eq!(b["files_placed_now"], 20, "{b}");
    assert_eq!(b["tiers"][0]["capacity"], 1 << 20);
    assert_eq!(entries(&tier_y.join(&id_b).join("objects")).len(), 20);

    // While a job of B uses y, A moves from x to y and asks another capacity: y keeps B's, A
    // is told once; A's copies in x stay there (and it is said).
    let mut holder = e.cmd();
    holder
        .arg("run")
        .arg("-q")
        .arg("--source")
        .arg(&src_b)
        .arg("--tier")
        .arg(format!("{}=1M", tier_y.display()))
        .args(["--", "sh", "-c", "read line"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut holder = holder.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while source_status(&e.status(), &src_b)["jobs"] != 1 {
        assert!(Instant::now() < deadline, "the holding job never attached");
        std::thread::sleep(Duration::from_millis(50));
    }
    let conflict = "in use by another job with capacity 1048576";
    let o = run(&src_a, format!("{}=64K", tier_y.display()), &files_a, &[]);
    assert_eq!(o.stdout.len(), 6 * 3000);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.matches(conflict).count(), 1, "{err}");
    assert!(
        err.contains("its 6 copies there (17.6 KiB) are kept"),
        "{err}"
    );
    assert_eq!(entries(&tier_x.join(&id_a).join("objects")).len(), 6);
    // Said once: the same request again is quiet.
    let o = run(&src_a, format!("{}=64K", tier_y.display()), &files_a, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains(conflict), "said twice: {err}");
    // A new conflict under -q is not printed.
    let o = run(
        &src_a,
        format!("{}=128K", tier_y.display()),
        &files_a,
        &["-q"],
    );
    assert_eq!(String::from_utf8_lossy(&o.stderr), "", "-q prints nothing");
    {
        use std::io::Write;
        holder.stdin.take().unwrap().write_all(b"done\n").unwrap();
    }
    assert!(holder.wait().unwrap().success());
    let a = wait_settled(&e, &src_a);
    assert_eq!(a["tiers"][0]["path"], tier_y.to_str().unwrap());
    assert_eq!(a["tiers"][0]["capacity"], 1 << 20, "kept while B used it");
    assert_eq!(a["files_placed_now"], 6, "{a}");
    assert_eq!(a["tiers"][0]["used"], 20 * 12288 + 6 * 4096);
    assert_eq!(e.agent_pid(), Some(pid));

    // Back to x: the six copies left there are taken up again, none placed anew.
    let o = run(&src_a, format!("{}=1G", tier_x.display()), &files_a, &[]);
    assert_eq!(o.stdout.len(), 6 * 3000);
    let a = wait_settled(&e, &src_a);
    assert_eq!(a["catalog"]["reused_files"], 6, "{a}");
    assert_eq!(
        a["placement"]["files_placed"],
        6 + 6,
        "nothing placed again: {a}"
    );
}

/// `pending` counts work not yet decided and returns to 0 once every opened file is placed.
#[test]
fn pending_drains_to_zero() {
    let e = Env::new(12);
    let files = e.files(12);
    let mut prog = vec!["cat"];
    prog.extend(files.iter().map(|s| s.as_str()));
    assert!(e.run(&["-q"], &prog).status.success());
    let s = wait_settled(&e, &e.src());
    // Settled means decided: all twelve fit, so all twelve are placed.
    assert_eq!(s["files_placed_now"], 12, "{s}");
    assert_eq!(s["placement"]["files_placed"], 12, "{s}");
}
