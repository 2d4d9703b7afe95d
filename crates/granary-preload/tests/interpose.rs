//! Real programs under LD_PRELOAD against a real table: every output and every byte must equal
//! the same program's run without the library, and the job counters must show that the catalog
//! and the tier copies were actually used.

mod common;

use std::fs;

use common::{Fixture, BIG, PY};
use granary_shm::{job, request, State};

const READS: &str = r#"
import sys, os, mmap, hashlib
root = sys.argv[1]
for rel in ["a.txt", "train/big.bin", "train/cls0/img1.jpg", "train/cls1/img3.jpg", "link_rel", "link_abs",
            "with space.txt", "train/cls1/up_link", "train/cls1/deeper/x.dat"]:
    p = os.path.join(root, rel)
    data = open(p, "rb").read()
    fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
    part = os.pread(fd, 1000, 7)
    st = os.fstat(fd)
    os.close(fd)
    with open(p, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) if os.path.getsize(p) else b""
        mm = hashlib.sha256(m[:]).hexdigest()
    print(rel, len(data), hashlib.sha256(data).hexdigest(), hashlib.sha256(part).hexdigest(), mm,
          st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_mode, st.st_dev, st.st_nlink)
"#;

#[test]
fn reads_are_byte_identical_and_placed_files_come_from_the_tier() {
    let f = Fixture::new();
    f.same_py(READS);
    f.same(
        "cat",
        &[&f.p("a.txt"), &f.p(BIG), &f.p("train/cls1/img2.jpg")],
    );
    f.same(
        "sha256sum",
        &[&f.p(BIG), &f.p("link_abs"), &f.p("train/cls0/img0.jpg")],
    );
    f.same("cp", &[&f.p(BIG), "/dev/stdout"]);
    assert!(
        f.counter(job::TIER_FILES) >= 6,
        "tier opens: {}",
        f.counter(job::TIER_FILES)
    );
    assert!(
        f.counter(job::TIER_BYTES) >= 128 * 1024,
        "tier bytes: {}",
        f.counter(job::TIER_BYTES)
    );
    assert!(f.counter(job::SOURCE_OPENS) > 0);
    assert!(f.counter(job::SOURCE_BYTES) > 0);
    assert_eq!(f.counter(job::FALLBACKS), 0);
    let reqs = f.requests();
    // A small unplaced file read and closed: its close asks for the copy, its open did not.
    let img3 = "train/cls1/img3.jpg";
    assert!(reqs.contains(&(request::CLOSED, img3.into())), "{reqs:?}");
    assert!(
        !reqs.contains(&(request::OPEN_UNPLACED, img3.into())),
        "{reqs:?}"
    );
    assert!(
        !reqs.iter().any(|(_, p)| p == BIG),
        "a placed file was requested: {reqs:?}"
    );
}

#[test]
fn the_cached_copy_is_what_gets_opened() {
    let f = Fixture::new();
    // Same size, different bytes (as the agent recorded them): only a read of the copy can
    // print them.
    fs::write(f.object("a.txt"), b"HELLO GRANARY\n").unwrap();
    f.record_identity("a.txt");
    for args in [vec![f.p("a.txt")], vec![f.p("link_rel")]] {
        let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        let out = f.run("cat", &args, true);
        assert_eq!(out.stdout, b"HELLO GRANARY\n");
    }
    let out = f.run(
        PY,
        &[
            "-c",
            "import sys; sys.stdout.write(open(sys.argv[1]).read())",
            &f.p("a.txt"),
        ],
        true,
    );
    assert_eq!(out.stdout, b"HELLO GRANARY\n");
    // Disabled: the source, untouched.
    let out = f
        .cmd("cat", &[&f.p("a.txt")], true)
        .env("GRANARY_DISABLE", "1")
        .output()
        .unwrap();
    assert_eq!(out.stdout, b"hello granary\n");
    let before = f.counter(job::OPENS);
    assert_eq!(
        f.run("cat", &[&f.p("a.txt")], false).stdout,
        b"hello granary\n"
    );
    assert_eq!(f.counter(job::OPENS), before);
}

#[test]
fn a_damaged_copy_falls_back_to_the_source() {
    let f = Fixture::new();
    let obj = f.object(BIG);
    let data = fs::read(&obj).unwrap();
    fs::write(&obj, &data[..1000]).unwrap();
    f.same("sha256sum", &[&f.p(BIG)]);
    f.same_py(READS);
    assert!(f.counter(job::FALLBACKS) >= 1);
    assert!(f.requests().contains(&(request::DAMAGED, BIG.into())));
    // A symlink planted in place of a copy is never followed.
    fs::remove_file(&obj).unwrap();
    std::os::unix::fs::symlink(f.real_src().join("a.txt"), &obj).unwrap();
    f.same("sha256sum", &[&f.p(BIG)]);
}

const STATS: &str = r#"
import sys, os
root = sys.argv[1]
def show(label, fn, *a, **kw):
    try:
        st = fn(*a, **kw)
        print(label, st.st_mode, st.st_ino, st.st_dev, st.st_nlink, st.st_uid, st.st_gid, st.st_size,
              st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns, st.st_blocks, st.st_blksize, st.st_rdev)
    except OSError as e:
        print(label, "errno", e.errno)
rels = ["", "a.txt", "train", "train/big.bin", "link_rel", "link_dir", "link_abs", "dangling",
        "train/cls1/up_link", "link_dir/img0.jpg", "emptydir", "missing", "a.txt/", "a.txt/x",
        "train/", "train/.", "train/..", "train/../a.txt", "link_dir/", "locked/inner.txt", "private.txt",
        "./a.txt", "train//cls0", "dangling/"]
for rel in rels:
    p = root + "/" + rel if rel else root
    show("stat " + rel, os.stat, p)
    show("lstat " + rel, os.lstat, p)
    for mode, name in [(os.F_OK, "F"), (os.R_OK, "R"), (os.X_OK, "X"), (os.W_OK, "W"), (os.R_OK | os.X_OK, "RX")]:
        print("access", name, rel, os.access(p, mode))
    try:
        fd = os.open(p, os.O_RDONLY)
        show("fstat " + rel, os.fstat, fd)
        os.close(fd)
    except OSError as e:
        print("open", rel, "errno", e.errno)
dfd = os.open(root + "/train", os.O_RDONLY | os.O_DIRECTORY)
show("fstat dirfd", os.fstat, dfd)
show("at cls0", os.stat, "cls0", dir_fd=dfd)
show("at ../a.txt", os.stat, "../a.txt", dir_fd=dfd)
show("at missing", os.stat, "missing", dir_fd=dfd)
show("at link", os.stat, "cls1/up_link", dir_fd=dfd, follow_symlinks=False)
fd2 = os.open("big.bin", os.O_RDONLY, dir_fd=dfd)
show("fstat at", os.fstat, fd2)
print(len(os.read(fd2, 1 << 20)))
os.close(fd2)
print("access at", os.access("cls0", os.R_OK, dir_fd=dfd), os.access("nope", os.F_OK, dir_fd=dfd))
os.close(dfd)
os.chdir(root + "/train/cls1")
show("rel", os.stat, "img0.jpg")
show("rel up", os.stat, "../../a.txt")
show("rel up link", os.lstat, "up_link")
print(len(open("../big.bin", "rb").read()), open("up_link").read())
"#;

#[test]
fn stat_family_answers_like_the_kernel() {
    let f = Fixture::new();
    f.same_py(STATS);
    // Directory fds are real fds now, described by the kernel: the rest is the catalog's.
    assert!(
        f.counter(job::CATALOG_META) > 80,
        "catalog answers: {}",
        f.counter(job::CATALOG_META)
    );
    let files: Vec<String> = [
        "", "a.txt", "train", BIG, "link_rel", "link_dir", "dangling", "emptydir",
    ]
    .iter()
    .map(|r| f.p(r))
    .collect();
    let args: Vec<&str> = files.iter().map(|s| s.as_str()).collect();
    f.same("stat", &args);
    let mut l = vec!["-L"];
    l.extend(&args);
    f.same("stat", &l);
    // GNU tar compares fstat of the open fd with the stat of the path: a placed file must agree.
    f.same("tar", &["cf", "/dev/null", &f.p(BIG)]);
}

#[test]
fn stat_through_a_symlinked_source_root() {
    let f = Fixture::with_root_link(true);
    f.same_py(STATS);
    f.same_py(LISTS);
    assert!(f.counter(job::CATALOG_META) > 100);
    assert!(f.counter(job::TIER_FILES) > 0);
}

const LISTS: &str = r#"
import sys, os, glob, pathlib
root = sys.argv[1]
print(sorted(os.listdir(root)))
print(os.listdir(root + "/train/cls0"))
for e in os.scandir(root):
    print(e.name, e.is_dir(), e.is_file(), e.is_symlink(), e.inode(), e.stat(follow_symlinks=False).st_size)
for d, dirs, files in os.walk(root):
    print(d, dirs, files)
for d, dirs, files in os.walk(root, followlinks=True):
    print(d, sorted(dirs), sorted(files))
print(sorted(glob.glob(root + "/train/*/*.jpg")))
print(sorted(glob.glob(root + "/**", recursive=True)))
print(sorted(str(p) for p in pathlib.Path(root).rglob("*")))
for d, dirs, files, fd in os.fwalk(root):
    print(d, dirs, files, [os.stat(n, dir_fd=fd, follow_symlinks=False).st_ino for n in files])
print(os.listdir(root + "/emptydir"), os.listdir(root + "/link_dir"))
fd = os.open(root + "/train", os.O_RDONLY)
print(sorted(os.listdir(fd)))
os.chdir(fd)
print(os.getcwd() == os.path.realpath(root + "/train"), sorted(os.listdir(".")), open("cls0/img1.jpg", "rb").read()[:4])
os.chdir("..")
print(sorted(os.listdir("train/cls1")))
for bad in ["a.txt", "missing", "locked"]:
    try:
        print(bad, os.listdir(root + "/" + bad))
    except OSError as e:
        print(bad, "errno", e.errno)
"#;

#[test]
fn listings_come_from_the_catalog() {
    let f = Fixture::new();
    let walk = "import os, sys\nfor d, ds, fs in os.walk(sys.argv[1]):\n    print(d, ds, fs, [e.stat(follow_symlinks=False).st_ino for e in os.scandir(d)], os.listdir(d))";
    f.same_py(walk);
    // os.walk's is_dir() on the dangling symlink is the one call only the source can answer.
    assert_eq!(
        f.counter(job::SOURCE_META),
        1,
        "metadata calls went to the source"
    );
    assert!(f.counter(job::CATALOG_META) > 20);
    f.same_py(LISTS);
    f.same(
        "ls",
        &[
            "-la",
            &f.p(""),
            &f.p("train"),
            &f.p("train/cls1"),
            &f.p("emptydir"),
        ],
    );
    f.same("ls", &["-laRi", &f.p("")]);
    f.same("ls", &["-lL", &f.p("link_dir")]);
    f.same("find", &[&f.p(""), "-printf", "%p %y %s %i %m %n %T@ %l\n"]);
    f.same("find", &["-L", &f.p(""), "-name", "*.jpg", "-size", "+1k"]);
    f.same("find", &[&f.p(""), "-type", "d", "-empty"]);
    let cat = f.same("tar", &["cf", "-", "-C", &f.p(""), "."]);
    assert!(cat.stdout.len() > 128 * 1024);
    f.same("tar", &["cf", "-", &f.p("train")]);
    // A listing must not have touched the source directory: a name created there after the
    // catalog was built stays invisible through the library.
    fs::write(f.real_src().join("train/late.txt"), b"x").unwrap();
    let out = f.run(
        PY,
        &[
            "-c",
            "import os,sys; print(sorted(os.listdir(sys.argv[1])))",
            &f.p("train"),
        ],
        true,
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("late.txt"));
}

#[test]
fn copies_of_the_tree_are_identical() {
    let f = Fixture::new();
    let out = f.dir.path().join("copy-with");
    let st = f
        .cmd("cp", &["-a", &f.p(""), out.to_str().unwrap()], true)
        .status()
        .unwrap();
    assert!(st.success());
    let diff = f.run(
        "diff",
        &[
            "-r",
            "--no-dereference",
            &f.real_src().display().to_string(),
            out.to_str().unwrap(),
        ],
        false,
    );
    assert!(
        diff.status.success(),
        "{}",
        String::from_utf8_lossy(&diff.stdout)
    );
    let ls = |p: &std::path::Path| {
        let mut c = f.cmd("ls", &["-laR", "--time-style=full-iso", "."], false);
        c.current_dir(p);
        c.output().unwrap().stdout
    };
    let a = String::from_utf8(ls(&out)).unwrap();
    let b = String::from_utf8(ls(&f.real_src())).unwrap();
    // Directory sizes and totals aside, cp -a must have preserved names, modes, times and links.
    let strip = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| !l.starts_with("total") && !l.starts_with('d'))
            .map(|l| l.to_string())
            .collect()
    };
    assert_eq!(strip(&a), strip(&b));
}

const LINKS: &str = r#"
import sys, os, ctypes
root = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)
libc.realpath.restype = ctypes.c_char_p
for rel in ["link_rel", "link_dir", "link_abs", "dangling", "train/cls1/up_link", "a.txt", "missing"]:
    p = root + "/" + rel
    try:
        print("readlink", rel, os.readlink(p))
    except OSError as e:
        print("readlink", rel, "errno", e.errno)
    buf = ctypes.create_string_buffer(4096)
    r = libc.realpath(p.encode(), buf)
    print("realpath", rel, r, ctypes.get_errno() if r is None else 0)
    small = ctypes.create_string_buffer(3)
    print("short", rel, libc.readlink(p.encode(), small, 3), small.raw)
    print("py realpath", os.path.realpath(p))
"#;

#[test]
fn readlink_and_realpath() {
    let f = Fixture::new();
    f.same_py(LINKS);
    f.same(
        "readlink",
        &[
            &f.p("link_rel"),
            &f.p("train/cls1/up_link"),
            &f.p("dangling"),
        ],
    );
    f.same(
        "readlink",
        &["-f", &f.p("link_dir"), &f.p("train/cls1/up_link")],
    );
    f.same("realpath", &[&f.p("train/cls0/img2.jpg"), &f.p("link_abs")]);
    assert!(f.counter(job::CATALOG_META) > 0);
}

const ERRORS: &str = r#"
import sys, os
root = sys.argv[1]
def attempt(label, fn):
    try:
        r = fn()
        print(label, "ok", r if not hasattr(r, "read") else r.read()[:8])
    except OSError as e:
        print(label, "errno", e.errno)
for rel in ["a.txt", "train/big.bin", "missing", "a.txt/", "a.txt/x", "private.txt", "locked/inner.txt", "locked", "train", "dangling",
            "train/missing/x", "run.sh"]:
    p = root + "/" + rel
    attempt("open " + rel, lambda: open(p, "rb"))
    attempt("os.open " + rel, lambda: os.close(os.open(p, os.O_RDONLY)))
    attempt("opendir " + rel, lambda: os.open(p, os.O_RDONLY | os.O_DIRECTORY))
    attempt("stat " + rel, lambda: os.stat(p).st_size)
    attempt("listdir " + rel, lambda: os.listdir(p))
    attempt("access " + rel, lambda: (os.access(p, os.R_OK), os.access(p, os.X_OK), os.access(p, os.F_OK)))
"#;

#[test]
fn errors_are_the_kernels() {
    let f = Fixture::new();
    f.same_py(ERRORS);
    f.same("cat", &[&f.p("missing"), &f.p("train")]);
}

#[test]
fn permissions_hold_for_an_unprivileged_user() {
    let f = Fixture::new();
    f.hand_to(65534);
    let src = f.p("");
    let args = [
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        PY,
        "-c",
        ERRORS,
        &src,
    ];
    let without = f.run("setpriv", &args, false);
    let with = f.run("setpriv", &args, true);
    assert!(
        without.status.success(),
        "{}",
        String::from_utf8_lossy(&without.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&with.stdout),
        String::from_utf8_lossy(&without.stdout)
    );
    let text = String::from_utf8_lossy(&with.stdout);
    assert!(text.contains("open private.txt errno 13"), "{text}");
    assert!(text.contains("stat locked/inner.txt errno 13"), "{text}");
    // The catalog speaks for the agent's credentials (root here), not this user's: nothing was
    // answered from it, no copy was served, and the process said why.
    assert_eq!(f.counter(job::CATALOG_META), 0);
    assert_eq!(f.counter(job::TIER_FILES), 0);
    assert!(f.counter(job::CREDS_MISMATCH) > 0);
}

#[test]
fn writes_pass_through_and_invalidate() {
    let f = Fixture::new();
    let script = r#"
import sys, os
p = sys.argv[1]
print(open(p).read())
with open(p, "w") as w:
    w.write("rewritten, longer than before\n")
print(open(p).read(), os.stat(p).st_size)
"#;
    let out = f.run(PY, &["-c", script, &f.p("a.txt")], true);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hello granary\n\nrewritten, longer than before\n 30\n"
    );
    assert_eq!(f.state_of("a.txt"), State::Stale);
    assert!(f
        .requests()
        .contains(&(request::INVALIDATE, "a.txt".into())));
    // A later process sees the new bytes too (the placed copy is no longer used).
    assert_eq!(
        f.run("cat", &[&f.p("a.txt")], true).stdout,
        b"rewritten, longer than before\n"
    );
    assert_eq!(
        f.run("cat", &[&f.p("link_rel")], true).stdout,
        b"rewritten, longer than before\n"
    );
    // Creating a new name makes its directory's listing pass through.
    let out = f.run(
        PY,
        &["-c", "import os,sys; open(sys.argv[1]+'/train/new.txt','w').write('n'); print(sorted(os.listdir(sys.argv[1]+'/train')))", &f.p("")],
        true,
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("new.txt"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(f.state_of("train"), State::Stale);
    // Shell redirection (creat/open O_TRUNC from a C program) and O_APPEND.
    let st = f
        .cmd("sh", &["-c", &format!("echo more >> '{}'", f.p(BIG))], true)
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(f.state_of(BIG), State::Stale);
    let tail = f.run("tail", &["-c", "5", &f.p(BIG)], true).stdout;
    assert_eq!(tail, b"more\n");
}

#[test]
fn fork_pool_and_subprocess_from_a_worker() {
    let f = Fixture::new();
    let script = r#"
import sys, os, hashlib, subprocess, multiprocessing as mp
root = sys.argv[1]
def work(rel):
    p = os.path.join(root, rel)
    h = hashlib.sha256(open(p, "rb").read()).hexdigest()
    sub = subprocess.run(["sha256sum", p], capture_output=True, check=True).stdout.split()[0].decode()
    ls = subprocess.run(["ls", os.path.dirname(p)], capture_output=True, check=True).stdout.decode().split()
    return rel, h, sub == h, os.stat(p).st_size, ls
if __name__ == "__main__":
    rels = ["a.txt", "train/big.bin", "train/cls0/img1.jpg", "train/cls1/img4.jpg", "link_abs"]
    with mp.get_context("fork").Pool(3) as pool:
        for r in pool.map(work, rels * 3):
            print(r)
    print(subprocess.run(["cat", os.path.join(root, "a.txt")], capture_output=True).stdout)
    # The child of a vfork closes every fd in its parent's memory: our tracking must survive it.
    p = os.path.join(root, "train/big.bin")
    fd = os.open(p, os.O_RDONLY)
    subprocess.run(["true"], close_fds=True, check=True)
    a, b = os.fstat(fd), os.stat(p)
    print((a.st_ino, a.st_dev, a.st_ctime_ns, a.st_mtime_ns) == (b.st_ino, b.st_dev, b.st_ctime_ns, b.st_mtime_ns))
"#;
    f.same_py(script);
    assert!(f.counter(job::TIER_FILES) >= 9);
}

#[test]
fn an_unusable_table_passes_everything_through() {
    let f = Fixture::new();
    fs::write(f.object("a.txt"), b"HELLO GRANARY\n").unwrap();
    f.record_identity("a.txt");
    let junk = f.dir.path().join("junk");
    fs::write(&junk, vec![7u8; 200_000]).unwrap();
    for table in [junk.as_path(), std::path::Path::new("/nonexistent/table")] {
        let out = f
            .cmd("cat", &[&f.p("a.txt")], true)
            .env("GRANARY_TABLE", table)
            .output()
            .unwrap();
        assert_eq!(out.stdout, b"hello granary\n");
    }
    // A table the agent withdrew.
    f.t().set_valid(false);
    assert_eq!(
        f.run("cat", &[&f.p("a.txt")], true).stdout,
        b"hello granary\n"
    );
    f.t().set_valid(true);
    assert_eq!(
        f.run("cat", &[&f.p("a.txt")], true).stdout,
        b"HELLO GRANARY\n"
    );
}

/// `GRANARY_LOG=debug` says why a call on the dataset passed through, and only for the dataset:
/// a file with no copy yet, a path the program changed, an open for writing; not a path outside
/// the source.
#[test]
fn the_debug_log_says_why_a_call_passed_through() {
    let f = Fixture::new();
    let log = f.dir.path().join("preload.log");
    let script = r#"
import os, sys
root = sys.argv[1]
open(os.path.join(root, "train/cls1/img2.jpg"), "rb").read()
try:
    os.stat(os.path.join(root, "nothing.here"))
except FileNotFoundError:
    pass
open("/proc/self/status", "rb").read()
open(os.path.join(root, "a.txt"), "rb").read()
"#;
    let out = f
        .cmd(PY, &["-c", script, &f.p("")], true)
        .env("GRANARY_LOG", format!("debug:{}", log.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = fs::read_to_string(&log).unwrap();
    let unplaced = format!(
        "open passed through (no complete copy yet): {}",
        f.p("train/cls1/img2.jpg")
    );
    assert!(text.contains(&unplaced), "{text}");
    let missing = format!(
        "stat passed through (not in the catalog): {}",
        f.p("nothing.here")
    );
    assert!(text.contains(&missing), "{text}");
    assert!(text.contains("open from tier: a.txt"), "{text}");
    assert!(!text.contains("/proc/self/status"), "{text}");
}
