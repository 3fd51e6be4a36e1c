//! The version string of `runloop --version`: the package's version, and
//! the commit and its date when the source is a git checkout.
//!
//! Built from a source tarball, or where git is missing, it is the
//! package's version alone: the build never fails for want of git, and a
//! tarball unpacked inside some other repository does not take that
//! repository's commit (the checkout must be this workspace's). The script
//! runs again when the checkout's HEAD or the branch it names moves.

use std::path::Path;
use std::process::Command;

fn main() {
    let version = env!("CARGO_PKG_VERSION");
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let ours = git(&["rev-parse", "--show-toplevel"])
        .is_some_and(|top| Path::new(&top).canonicalize().ok() == workspace.canonicalize().ok());
    let commit = ours
        .then(|| git(&["log", "-1", "--format=%h %cs"]))
        .flatten();
    let version = match commit {
        Some(commit) => format!("{version} ({commit})"),
        None => version.to_owned(),
    };
    println!("cargo:rustc-env=RUNLOOP_VERSION={version}");
    if !ours {
        return;
    }
    // A file that does not exist would make cargo run this script on every
    // build, so only the files git has are watched.
    for file in ["HEAD", "packed-refs"] {
        watch(git(&["rev-parse", "--git-path", file]));
    }
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch(git(&["rev-parse", "--git-path", &branch]));
    }
}

/// What `git ARGS…` prints, trimmed, when it runs and succeeds.
fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    let text = text.trim();
    (output.status.success() && !text.is_empty()).then(|| text.to_owned())
}

fn watch(path: Option<String>) {
    if let Some(path) = path.filter(|path| Path::new(path).exists()) {
        println!("cargo:rerun-if-changed={path}");
    }
}
