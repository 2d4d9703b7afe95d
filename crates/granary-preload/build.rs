//! Whether the compiler has naked functions (Rust 1.88): the library's `vfork` hook is one
//! (`sys::pid`). With an older compiler there is no hook, and the pid is never cached.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(granary_naked)");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=RUSTC");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let minor = std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|v| {
            v.split_whitespace()
                .nth(1)?
                .split('.')
                .nth(1)?
                .parse::<u32>()
                .ok()
        });
    if minor.is_some_and(|m| m >= 88) {
        println!("cargo::rustc-cfg=granary_naked");
    }
}
