//! `granary pack` and its tools, driven through the real binary: odd trees round-trip byte for
//! byte, packing is deterministic and atomic (SIGKILL mid-pack leaves nothing that looks like a
//! pack), damage gives clear errors and never wrong bytes, and the tools say what they should.

mod common;

use common::{pattern, BIN};

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use granary_pack::format::entry::flags;
use granary_pack::Pack;

fn granary(args: &[&OsStr]) -> Output {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running granary")
}

fn ok(args: &[&OsStr]) -> Output {
    let out = granary(args);
    assert!(
        out.status.success(),
        "granary {:?} failed: {}",
        args,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `out` (a command's stdout or stderr) contains `needle`; shows it when not.
fn assert_has(out: &[u8], needle: &str) {
    let text = String::from_utf8_lossy(out);
    assert!(text.contains(needle), "{needle:?} not in: {text}");
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn rel_os(b: &[u8]) -> &OsStr {
    OsStr::from_bytes(b)
}

/// Every regular file below `root`: relative path → bytes.
fn files_of(root: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    fn walk(root: &Path, rel: &[u8], out: &mut BTreeMap<Vec<u8>, Vec<u8>>) {
        let dir = if rel.is_empty() {
            root.to_path_buf()
        } else {
            root.join(rel_os(rel))
        };
        for de in std::fs::read_dir(dir).unwrap() {
            let de = de.unwrap();
            let mut r = rel.to_vec();
            if !r.is_empty() {
                r.push(b'/');
            }
            r.extend_from_slice(de.file_name().as_bytes());
            let ft = de.file_type().unwrap();
            if ft.is_dir() {
                walk(root, &r, out);
            } else if ft.is_file() {
                out.insert(r, std::fs::read(de.path()).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, b"", &mut out);
    out
}

/// Names with spaces, newlines and non-UTF-8 bytes, a 3,800-byte path, empty files, hard
/// links, symlinks inside and pointing out, a sparse file, compressible and random data.
fn odd_tree(src: &Path) {
    let w = |rel: &[u8], data: &[u8]| {
        let p = src.join(rel_os(rel));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    };
    w(b"plain/a.bin", &pattern(1, 110_000));
    w(b"plain/text.txt", &b"the same words again ".repeat(20_000));
    w(b"with space/file name.txt", b"spaces");
    w(b"new\nline/new\nline", b"newlines");
    w(b"bytes\xff\xfe/\x80latin\xe9", &pattern(2, 5_000));
    w(b"empty/zero", b"");
    std::fs::create_dir_all(src.join("empty/dir")).unwrap();
    let long: Vec<u8> = (0..19)
        .map(|i| vec![b'a' + i as u8; 200])
        .collect::<Vec<_>>()
        .join(&b'/');
    assert!(long.len() >= 3_800, "{}", long.len());
    w(&long, &pattern(3, 777));
    std::fs::hard_link(src.join("plain/a.bin"), src.join("plain/hard link")).unwrap();
    std::os::unix::fs::symlink("a.bin", src.join("plain/inside")).unwrap();
    std::os::unix::fs::symlink("../plain/text.txt", src.join("empty/up")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", src.join("pointing out")).unwrap();
    std::os::unix::fs::symlink("../../outside", src.join("plain/escapes")).unwrap();
    let sparse = std::fs::File::create(src.join("sparse")).unwrap();
    sparse.set_len(24 << 20).unwrap();
    sparse.write_all_at(&pattern(4, 4096), 10 << 20).unwrap();
}

struct T {
    dir: tempfile::TempDir,
}

impl T {
    fn new() -> T {
        let t = T {
            dir: tempfile::tempdir().unwrap(),
        };
        odd_tree(&t.src());
        t
    }
    fn src(&self) -> PathBuf {
        self.dir.path().join("src")
    }
    fn p(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

#[test]
fn odd_trees_round_trip_through_every_codec() {
    let t = T::new();
    let src_files = files_of(&t.src());
    for (name, codec) in [("none", "none"), ("lz4", "lz4"), ("zstd", "zstd:3")] {
        let out = t.p(name);
        ok(&[
            os("pack"),
            t.src().as_os_str(),
            out.as_os_str(),
            os("--compress"),
            os(codec),
            os("--partitions"),
            os("3"),
        ]);
        for (rel, bytes) in &src_files {
            let got = ok(&[os("pack"), os("cat"), out.as_os_str(), rel_os(rel)]).stdout;
            assert!(
                &got == bytes,
                "{codec}: {} differs",
                String::from_utf8_lossy(rel)
            );
        }
        // Symlinks inside the pack are followed; out of it, an error naming the link.
        let got = ok(&[
            os("pack"),
            os("cat"),
            out.as_os_str(),
            os("plain/inside"),
            os("empty/up"),
        ])
        .stdout;
        assert_eq!(
            got,
            [
                src_files[&b"plain/a.bin"[..]].clone(),
                src_files[&b"plain/text.txt"[..]].clone()
            ]
            .concat()
        );
        for link in ["pointing out", "plain/escapes"] {
            let r = granary(&[os("pack"), os("cat"), out.as_os_str(), os(link)]);
            assert!(!r.status.success() && r.stdout.is_empty());
            assert_has(&r.stderr, "outside the pack");
        }
        let v = ok(&[
            os("pack"),
            os("verify"),
            out.as_os_str(),
            os("--source"),
            t.src().as_os_str(),
        ]);
        assert!(String::from_utf8_lossy(&v.stderr).contains("OK"));
        let d = ok(&[os("pack"), os("diff"), t.src().as_os_str(), out.as_os_str()]);
        assert!(
            d.stdout.is_empty(),
            "{}",
            String::from_utf8_lossy(&d.stdout)
        );

        // The index keeps what ls -l shows: symlink targets, link counts, modes.
        let ls = String::from_utf8(ok(&[os("pack"), os("ls"), out.as_os_str()]).stdout).unwrap();
        assert!(ls.contains("pointing out -> /etc/passwd"), "{ls}");
        assert!(ls.contains("new\\nline"), "{ls}");
        assert!(ls.contains("bytes\\377\\376"), "{ls}");
        let pack = Pack::open(&out).unwrap();
        let ix = pack.index();
        let hard = ix.entry(ix.lookup(b"plain/hard link").unwrap()).unwrap();
        let first = ix.entry(ix.lookup(b"plain/a.bin").unwrap()).unwrap();
        assert_eq!((first.stat.nlink, hard.stat.nlink), (2, 2));
        assert!(hard.is_hardlink() || first.is_hardlink());
        assert_eq!(
            (hard.offset, hard.partition),
            (first.offset, first.partition),
            "data stored once"
        );
        let dir = ix.entry(ix.lookup(b"empty/dir").unwrap()).unwrap();
        assert!(dir.stat.is_dir() && dir.child_count == 0);
        // The sparse file's 24 MiB hole is not stored.
        let sparse = ix.entry(ix.lookup(b"sparse").unwrap()).unwrap();
        assert_eq!(sparse.stat.size, 24 << 20);
        assert!(
            sparse.stored_len < 2 << 20,
            "{codec}: sparse file stored as {} bytes",
            sparse.stored_len
        );
        assert!(sparse.flags & flags::SPARSE != 0);
        // Same identity as the source, for staleness checks.
        let st = std::fs::symlink_metadata(t.src().join("sparse")).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            (
                sparse.stat.ino,
                sparse.stat.mtime.sec,
                sparse.stat.ctime.sec
            ),
            (st.ino(), st.mtime(), st.ctime())
        );
    }
}

/// The index holds every statx field the catalog serves: each entry converts to exactly the
/// record the catalog's own walk makes (atime aside: a pack records mtime there, since reading
/// the tree to pack it moves atime).
#[test]
fn entries_carry_what_the_catalog_serves() {
    let t = T::new();
    let out = t.p("pack");
    ok(&[os("pack"), t.src().as_os_str(), out.as_os_str(), os("-q")]);
    let pack = Pack::open(&out).unwrap();
    let ix = pack.index();
    for i in 0..ix.len() {
        let e = ix.entry(i).unwrap();
        let rel = ix.path_of(i);
        let path = if rel.is_empty() {
            t.src()
        } else {
            t.src().join(rel_os(&rel))
        };
        if path.as_os_str().len() >= 4000 {
            continue; // beyond PATH_MAX for the catalog's path-based statx
        }
        let mut want = granary_core::sys::statx_nofollow(&path).unwrap();
        want.atime = want.mtime;
        want.mask &= !libc::STATX_ATIME;
        assert_eq!(
            granary_core::packed_source::stat_rec(&e.stat),
            want,
            "{}",
            String::from_utf8_lossy(&rel)
        );
    }
}

#[test]
fn packing_twice_gives_identical_bytes() {
    let t = T::new();
    for codec in ["none", "zstd:1"] {
        let (a, b) = (t.p(&format!("a-{codec}")), t.p(&format!("b-{codec}")));
        for out in [&a, &b] {
            ok(&[
                os("pack"),
                t.src().as_os_str(),
                out.as_os_str(),
                os("--compress"),
                os(codec),
                os("--partitions"),
                os("2"),
                os("-q"),
            ]);
        }
        let names: Vec<_> = std::fs::read_dir(&a)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 3, "index + 2 partitions");
        for n in names {
            assert!(
                std::fs::read(a.join(&n)).unwrap() == std::fs::read(b.join(&n)).unwrap(),
                "{codec}: {n:?} differs"
            );
        }
    }
}

#[test]
fn sigkill_mid_pack_leaves_no_valid_looking_output() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    for i in 0..64 {
        let p = src.join(format!("d{}/f{i}", i % 4));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        // Compressible but not trivially: zstd at a high level takes seconds.
        let mut data = pattern(i, 1 << 20);
        data.iter_mut().for_each(|b| *b &= 0x0f);
        std::fs::write(p, data).unwrap();
    }
    let out = dir.path().join("out.granary");
    let mut child = Command::new(BIN)
        .args([
            os("pack"),
            src.as_os_str(),
            out.as_os_str(),
            os("--compress"),
            os("zstd:19"),
            os("--threads"),
            os("1"),
            os("-q"),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let tmp = dir.path().join(format!(".out.granary.tmp-{}", child.id()));
    // Kill once some of a partition is written (bounded wait).
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let written = std::fs::metadata(tmp.join("part-00000"))
            .map(|m| m.len())
            .unwrap_or(0);
        if written > 128 {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "pack finished before it could be killed"
        );
        assert!(Instant::now() < deadline, "pack wrote nothing in 120 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(!out.exists(), "a killed pack published its output");
    assert!(
        !tmp.join("index").exists(),
        "the temporary pack has an index"
    );
    for target in [&out, &tmp] {
        let r = granary(&[os("pack"), os("verify"), target.as_os_str()]);
        assert!(!r.status.success());
        let r = granary(&[os("pack"), os("ls"), target.as_os_str()]);
        assert!(!r.status.success());
    }
    // The next pack is not disturbed by the leftover, and names it.
    let next = ok(&[
        os("pack"),
        src.as_os_str(),
        out.as_os_str(),
        os("--compress"),
        os("lz4"),
        os("-q"),
    ]);
    assert_has(
        &next.stderr,
        &format!("{} was left by an interrupted pack", tmp.display()),
    );
    ok(&[
        os("pack"),
        os("verify"),
        out.as_os_str(),
        os("--source"),
        src.as_os_str(),
        os("-q"),
    ]);
}

#[test]
fn damage_gives_clear_errors_never_wrong_bytes() {
    let t = T::new();
    let out = t.p("pack");
    ok(&[
        os("pack"),
        t.src().as_os_str(),
        out.as_os_str(),
        os("--partitions"),
        os("2"),
        os("-q"),
    ]);
    let pack = Pack::open(&out).unwrap();
    let ix = pack.index();
    let e = ix.entry(ix.lookup(b"plain/text.txt").unwrap()).unwrap();
    let part = out.join(format!("part-{:05}", e.partition));
    let orig = std::fs::read(&part).unwrap();

    // A flipped byte inside one file: cat fails with nothing on stdout, verify names it.
    let mut m = orig.clone();
    m[(e.offset + e.stored_len / 2) as usize] ^= 1;
    std::fs::write(&part, &m).unwrap();
    let r = granary(&[os("pack"), os("cat"), out.as_os_str(), os("plain/text.txt")]);
    assert!(!r.status.success() && r.stdout.is_empty());
    assert_has(&r.stderr, "checksum mismatch");
    let v = granary(&[os("pack"), os("verify"), out.as_os_str()]);
    assert_eq!(v.status.code(), Some(1));
    assert_has(&v.stdout, "plain/text.txt");
    // Other files still read exactly.
    let a = ok(&[
        os("pack"),
        os("cat"),
        out.as_os_str(),
        os("with space/file name.txt"),
    ])
    .stdout;
    assert_eq!(a, b"spaces");

    // A cut partition.
    std::fs::write(&part, &orig[..orig.len() / 2]).unwrap();
    let v = granary(&[os("pack"), os("verify"), out.as_os_str()]);
    assert_eq!(v.status.code(), Some(1));
    assert_has(&v.stdout, "truncated");
    let r = granary(&[os("pack"), os("cat"), out.as_os_str(), os("plain/text.txt")]);
    assert!(!r.status.success() && r.stdout.is_empty());
    std::fs::write(&part, &orig).unwrap();

    // A flipped byte anywhere in the index: every tool refuses the pack.
    let index = std::fs::read(out.join("index")).unwrap();
    for at in [3, 100, index.len() / 2, index.len() - 1] {
        let mut m = index.clone();
        m[at] ^= 0x20;
        std::fs::write(out.join("index"), &m).unwrap();
        for tool in ["ls", "verify"] {
            let r = granary(&[os("pack"), os(tool), out.as_os_str()]);
            // Damage, not a usage error: exit 1 (verify prints it as its one problem).
            assert_eq!(
                r.status.code(),
                Some(1),
                "{tool} on an index damaged at {at}"
            );
            assert_has(&[r.stdout, r.stderr].concat(), "corrupt pack");
        }
    }
    std::fs::write(out.join("index"), &index).unwrap();
    ok(&[os("pack"), os("verify"), out.as_os_str(), os("-q")]);
}

#[test]
fn files_list_sets_order_and_replicate_marks() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    for d in ["train", "val"] {
        for i in 0..5 {
            let p = src.join(format!("{d}/f{i}"));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, pattern(i, 1000 + i as usize)).unwrap();
        }
    }
    let list = dir.path().join("list");
    // Reverse order, one absolute path, a directory, a comment.
    let abs = src.join("train/f0");
    std::fs::write(
        &list,
        format!(
            "# chosen order\ntrain/f4\ntrain/f2\n{}\nval\n",
            abs.display()
        ),
    )
    .unwrap();
    let out = dir.path().join("pack");
    ok(&[
        os("pack"),
        src.as_os_str(),
        out.as_os_str(),
        os("--files"),
        list.as_os_str(),
        os("--replicate"),
        os("val/**"),
        os("-q"),
    ]);
    let pack = Pack::open(&out).unwrap();
    let ix = pack.index();
    let offset = |p: &[u8]| ix.entry(ix.lookup(p).unwrap()).unwrap().offset;
    let order = [
        &b"train/f4"[..],
        b"train/f2",
        b"train/f0",
        b"val/f0",
        b"val/f1",
        b"val/f4",
    ];
    for w in order.windows(2) {
        assert!(offset(w[0]) < offset(w[1]), "data order");
    }
    assert!(ix.lookup(b"train/f1").is_err(), "unlisted file packed");
    for (p, rep) in [
        (&b"val/f3"[..], true),
        (b"val", false),
        (b"train/f4", false),
    ] {
        let e = ix.entry(ix.lookup(p).unwrap()).unwrap();
        assert_eq!(
            e.flags & flags::REPLICATE != 0,
            rep,
            "{}",
            String::from_utf8_lossy(p)
        );
    }
    // A subset pack's diff does not report the unlisted files as added.
    let d = ok(&[os("pack"), os("diff"), src.as_os_str(), out.as_os_str()]);
    assert!(
        d.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&d.stdout)
    );
    // Bad lists are refused before anything is written.
    for bad in [
        "train/../val/f1\n",
        "train/f1\ntrain/f1\n",
        "/etc/passwd\n",
        "missing\n",
    ] {
        std::fs::write(&list, bad).unwrap();
        let out2 = dir.path().join("bad");
        let r = granary(&[
            os("pack"),
            src.as_os_str(),
            out2.as_os_str(),
            os("--files"),
            list.as_os_str(),
        ]);
        assert_eq!(r.status.code(), Some(2), "{bad:?} accepted");
        assert!(!out2.exists());
    }
}

#[test]
fn diff_reports_added_removed_modified() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    for i in 0..6 {
        let p = src.join(format!("d{}/f{i}", i % 2));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, pattern(i, 500)).unwrap();
    }
    let out = dir.path().join("pack");
    ok(&[os("pack"), src.as_os_str(), out.as_os_str(), os("-q")]);
    std::fs::write(src.join("d0/new"), b"n").unwrap();
    std::fs::remove_file(src.join("d1/f1")).unwrap();
    // Same size, content rewritten; and the mtime restored (ctime still tells).
    let f = src.join("d0/f2");
    let mtime = std::fs::metadata(&f).unwrap().modified().unwrap();
    std::fs::write(&f, pattern(99, 500)).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&f)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    std::fs::remove_dir_all(src.join("d1")).unwrap_or(());
    std::fs::create_dir(src.join("d2")).unwrap();
    let d = granary(&[os("pack"), os("diff"), out.as_os_str(), src.as_os_str()]);
    assert_eq!(d.status.code(), Some(1));
    let text = String::from_utf8(d.stdout).unwrap();
    assert_eq!(text, "M d0/f2 (ctime)\nA d0/new\nD d1\nA d2\n");
}

#[test]
fn cli_layout_help_and_refusals() {
    let dir = tempfile::tempdir().unwrap();
    // A source named like a tool packs through `create`.
    let src = dir.path().join("verify");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("f"), b"x").unwrap();
    let out = dir.path().join("p");
    let cwd_ok = Command::new(BIN)
        .current_dir(dir.path())
        .args(["pack", "create", "verify", "p", "-q"])
        .status()
        .unwrap();
    assert!(cwd_ok.success());
    assert_eq!(
        ok(&[os("pack"), os("cat"), out.as_os_str(), os("f")]).stdout,
        b"x"
    );
    // OUT exists: refused unless --force, and --force replaces it.
    let r = granary(&[os("pack"), src.as_os_str(), out.as_os_str()]);
    assert_eq!(r.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&r.stderr).contains("--force"));
    std::fs::write(src.join("f"), b"y").unwrap();
    ok(&[
        os("pack"),
        src.as_os_str(),
        out.as_os_str(),
        os("--force"),
        os("-q"),
    ]);
    assert_eq!(
        ok(&[os("pack"), os("cat"), out.as_os_str(), os("f")]).stdout,
        b"y"
    );
    // A pack inside its source is refused.
    let r = granary(&[os("pack"), src.as_os_str(), src.join("inner").as_os_str()]);
    assert_eq!(r.status.code(), Some(2));
    // Every tool's help teaches with examples.
    for tool in [
        None,
        Some("verify"),
        Some("ls"),
        Some("cat"),
        Some("diff"),
        Some("create"),
    ] {
        let mut args = vec![os("pack")];
        args.extend(tool.map(os));
        args.push(os("--help"));
        let h = String::from_utf8(ok(&args).stdout).unwrap();
        assert!(h.contains("Examples:"), "{tool:?}: {h}");
    }
    // Balanced partitions.
    let src2 = dir.path().join("src2");
    std::fs::create_dir(&src2).unwrap();
    for i in 0..90u64 {
        std::fs::write(
            src2.join(format!("f{i:02}")),
            pattern(i, 1000 + (i as usize * 37) % 900),
        )
        .unwrap();
    }
    let out2 = dir.path().join("p2");
    ok(&[
        os("pack"),
        src2.as_os_str(),
        out2.as_os_str(),
        os("--partitions"),
        os("3"),
        os("-q"),
    ]);
    let sizes: Vec<u64> = (0..3)
        .map(|n| {
            std::fs::metadata(out2.join(format!("part-{n:05}")))
                .unwrap()
                .len()
        })
        .collect();
    let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
    assert!(hi - lo <= 2 * 1900, "unbalanced partitions {sizes:?}");
}
