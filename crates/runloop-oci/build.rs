//! Builds `init/main.rs`, the containers' PID 1, as a static binary that
//! the crate embeds (`src/init.rs`): it runs inside images that have no C
//! library of their own, so it may not need one.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=init/main.rs");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let target = std::env::var("TARGET").expect("cargo sets TARGET");
    let status = Command::new(rustc)
        .args([
            "--edition",
            "2024",
            "--crate-name",
            "runloop_init",
            "--target",
        ])
        .arg(&target)
        .args([
            "-C",
            "opt-level=s",
            "-C",
            "panic=abort",
            "-C",
            "target-feature=+crt-static",
            "-C",
            "strip=symbols",
            "-o",
        ])
        .arg(out.join("runloop-init"))
        .arg("init/main.rs")
        .status()
        .expect("rustc runs");
    assert!(
        status.success(),
        "the container init (init/main.rs) did not build"
    );
}
