//! Every lock, atomic, condition variable and thread of this crate comes from `granary_core::sync`
//! (src/sync.rs): otherwise `tests/shuttle.rs` runs the code with a primitive Shuttle cannot see,
//! and a race there goes unexplored. `sync.rs` is the one file that names std's.

use std::path::Path;

/// What a module must not name: std's (or core's) primitives, or a thread it starts or puts to
/// sleep itself.
const FORBIDDEN: &[&str] = &[
    "std::sync",
    "core::sync",
    "std::thread::spawn",
    "std::thread::scope",
    "std::thread::sleep",
    "std::thread::Builder",
    "parking_lot",
];

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn no_module_but_sync_names_a_std_primitive() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(
        files.len() > 20,
        "sources not found under {}",
        src.display()
    );
    let mut found = Vec::new();
    for f in &files {
        if f == &src.join("sync.rs") {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for bad in FORBIDDEN {
                if code.contains(bad) {
                    found.push(format!("{}:{}: {}", f.display(), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "use granary_core::sync instead:\n{}",
        found.join("\n")
    );
}
