//! What several of runloop's test suites share.
//!
//! [`needs`]: a test that needs root or a part of the system (runc, nginx,
//! a registry, a kernel feature) asks for it first. Where the part is
//! missing, the test says so on one line — `skipped: needs runc (apt-get
//! install runc): containers::a_run_in_a_container` — and returns, so a
//! contributor without the part gets a passing suite and a list of what
//! it did not prove, never a failure that reads like a bug and never
//! silence. CI installs every part and sets `RUNLOOP_REQUIRE_SYSTEM=1`,
//! under which a missing part fails the test instead: a CI run cannot
//! pass by skipping.
//!
//! The line is written to the process's stderr directly, past the test
//! harness's capture (which keeps a passing test's output to itself), so
//! `cargo test` shows it whether or not the test passed.
//!
//! [`message`]: the bare messages of a proxy path (protocol §10), as the
//! tests' scripted proxies send them.
//!
//! [`document`]: the blocks of the repository's pages that tests run or
//! replay (recipes, transcripts).
//!
//! [`uplink`]: a fake internet behind a veth, for the egress tests.
//!
//! The helpers that need more than the standard library are features, one
//! a module, so that a suite builds only what it asks for:
//!
//! - `logs`: an in-memory writer that a tracing subscriber, the
//!   CLI's notes or a child's output write to and the test reads back.
//! - `chain`: the parts of the chain a test puts around the one it
//!   tests, all in its process. Around a proxy: `path`, the server's end
//!   of a proxy path, and `agent_program`, an agent program whose every
//!   byte the test writes. Around a server: `fake_proxy`, a proxy that
//!   follows a script, `server`, a server in front of one and runs on it,
//!   and `caller`, a caller that sends any frame. `wait`: the bound on
//!   every wait of theirs.
//! - `command`: the `runloop` command under test, as a child process
//!   (`runloop serve` on a loopback port, `runloop run`), waited for
//!   within a bound.
//! - `loads`: the loads of `runloop serve` that a test runs small and a
//!   figure runs at full size (floods, a slowloris, one token's runs,
//!   exec runs, a large prompt).
//! - `certs`: a certificate authority and the certificates it signed,
//!   made for the test.
//! - `oci`: OCI image layouts written as another tool writes them.
//! - `websocket`: WebSocket frames as bytes, as tungstenite writes them.
//!
//! [`fixture`]: the agent programs the exec runtime runs in tests.
//!
//! [`process`]: what became of a process a test started, and a child
//! killed when the test lets it go.
//!
//! [`errors`]: the error convention (an error's words leave its cause to
//! `source()`), checked over each crate's list of its errors.

#[cfg(feature = "chain")]
pub mod agent_program;
#[cfg(feature = "chain")]
pub mod caller;
#[cfg(feature = "certs")]
pub mod certs;
#[cfg(feature = "command")]
pub mod command;
pub mod document;
pub mod errors;
#[cfg(feature = "chain")]
pub mod fake_proxy;
#[cfg(feature = "loads")]
pub mod loads;
#[cfg(feature = "logs")]
pub mod logs;
pub mod message;
#[cfg(feature = "oci")]
pub mod oci;
#[cfg(feature = "chain")]
pub mod path;
pub mod process;
#[cfg(feature = "chain")]
pub mod server;
pub mod uplink;
#[cfg(feature = "chain")]
pub mod wait;
#[cfg(feature = "websocket")]
pub mod websocket;

use std::io::Write;
use std::path::{Path, PathBuf};

/// The path of the fixture `name`: the small agent programs (python3)
/// under `crates/runloop/tests/fixtures/` that exec runs serve with.
pub fn fixture(name: &str) -> String {
    document::workspace()
        .join("crates/runloop/tests/fixtures")
        .join(name)
        .display()
        .to_string()
}

/// `sha256:` and the SHA-256 of `bytes` in lowercase hex: how a blob's
/// digest and a configured token's hash are written.
#[cfg(any(feature = "command", feature = "oci"))]
pub fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    let hex: String = sha2::Sha256::digest(bytes)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    format!("sha256:{hex}")
}

/// The variable under which a missing part fails the test.
pub const REQUIRE: &str = "RUNLOOP_REQUIRE_SYSTEM";

/// A part of the system a test needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The test runs as root (containers, cgroups, mounts, namespaces).
    Root,
    /// A program, by its name, found on `PATH` or in `/usr/sbin` and
    /// `/sbin` (where Debian puts runc, nginx, ip and mkfs.ext4, which a
    /// user's `PATH` often lacks), and the package that installs it.
    Program {
        /// The program's name.
        name: &'static str,
        /// The Debian package that installs it.
        package: &'static str,
    },
    /// Cgroups a process may make and write, with the memory and pids
    /// controllers (v1 or v2): what the exec runtime confines runs with.
    Cgroups,
    /// A file or directory the kernel or a package provides, and what
    /// provides it.
    File {
        /// Its path.
        path: &'static str,
        /// What provides it, in words (`cgroup v2 mounted`).
        from: &'static str,
    },
}

impl Part {
    /// A program from a Debian package.
    pub const fn program(name: &'static str, package: &'static str) -> Part {
        Part::Program { name, package }
    }

    /// Whether the part is here.
    pub fn present(self) -> bool {
        match self {
            // SAFETY: geteuid has no preconditions and cannot fail.
            Part::Root => (unsafe { libc::geteuid() }) == 0,
            Part::Program { name, .. } => find_program(name).is_some(),
            Part::Cgroups => {
                let v1 = Path::new("/sys/fs/cgroup/memory/cgroup.procs").exists()
                    && Path::new("/sys/fs/cgroup/pids/cgroup.procs").exists();
                let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
                    .is_ok_and(|c| c.contains("memory") && c.contains("pids"));
                (v1 || v2) && Part::Root.present()
            }
            Part::File { path, .. } => Path::new(path).exists(),
        }
    }

    /// What a user does to have it, in words.
    pub fn describe(self) -> String {
        match self {
            Part::Root => "root".to_owned(),
            Part::Program { name, package } => format!("{name} (apt-get install {package})"),
            Part::Cgroups => {
                "writable cgroups with the memory and pids controllers (root)".to_owned()
            }
            Part::File { path, from } => format!("{path} ({from})"),
        }
    }
}

/// Where `name` is: on `PATH`, else in `/usr/sbin` or `/sbin`.
pub fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// Whether every part in `parts` is here. Where one is not, says so on
/// one line (`skipped: needs …`) and returns false — or, under
/// `RUNLOOP_REQUIRE_SYSTEM=1`, panics naming what is missing.
///
/// ```
/// use runloop_testkit::{Part, needs};
/// if !needs(&[Part::program("sh", "dash")]) {
///     return;
/// }
/// ```
pub fn needs(parts: &[Part]) -> bool {
    let Some(missing) = missing(parts) else {
        return true;
    };
    let test = std::thread::current().name().unwrap_or("a test").to_owned();
    if required() {
        panic!("{test} needs {missing}, and {REQUIRE}=1 is set: install it");
    }
    // Past the harness's capture: the line is seen whether the test
    // passes or not. A closed stderr loses it, nothing more.
    let _ = writeln!(std::io::stderr(), "skipped: needs {missing}: {test}");
    false
}

/// What of `parts` is missing, described and joined (`runc (apt-get
/// install runc), root`); `None` when all of it is here.
pub fn missing(parts: &[Part]) -> Option<String> {
    let missing: Vec<String> = parts
        .iter()
        .filter(|part| !part.present())
        .map(|part| part.describe())
        .collect();
    (!missing.is_empty()).then(|| missing.join(", "))
}

/// Whether a missing part fails the test (`RUNLOOP_REQUIRE_SYSTEM=1`).
pub fn required() -> bool {
    std::env::var(REQUIRE).is_ok_and(|value| value == "1")
}

/// The parts every container test needs: root, runc, the tools that make
/// a run's disk and network, and gcc with a static libc (and strip) for
/// the test images.
pub const CONTAINERS: &[Part] = &[
    Part::Root,
    Part::program("runc", "runc"),
    Part::program("mkfs.ext4", "e2fsprogs"),
    Part::program("ip", "iproute2"),
    Part::program("losetup", "mount"),
    Part::program("gcc", "gcc"),
    Part::program("strip", "binutils"),
    Part::File {
        path: "/usr/lib/x86_64-linux-gnu/libc.a",
        from: "apt-get install libc6-dev",
    },
];

/// A figure: a named load that measures something and prints its
/// figures, checking its bars (it panics when one is missed).
pub type Figure = (&'static str, fn());

/// The `main` of a figures bench (a `[[bench]]` with `harness = false`):
/// the loads that print the figures closing notes quote, kept out of the
/// test suite because they take minutes or the whole machine.
///
/// Under `cargo bench --bench NAME [-- FILTER…]` (which passes `--bench`)
/// it runs every figure whose name contains a filter, or all of them, one
/// after the other. Under `cargo test` (which builds benches and runs them
/// without `--bench`) it only lists them: the smoke run proves they build.
pub fn run_figures(figures: &[Figure]) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let filters: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|arg| !arg.starts_with('-'))
        .collect();
    if !args.iter().any(|arg| arg == "--bench") {
        println!(
            "{} figures (run with cargo bench --bench NAME -- [FILTER]):",
            figures.len()
        );
        for (name, _) in figures {
            println!("  {name}");
        }
        return;
    }
    for (name, figure) in figures {
        if filters.is_empty() || filters.iter().any(|filter| name.contains(filter)) {
            println!("== {name}");
            figure();
        }
    }
}

/// What a container test that pulls from a real registry needs besides
/// [`CONTAINERS`]: Debian's `docker-registry`.
pub const REGISTRY: Part = Part::program("docker-registry", "docker-registry");

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(any(feature = "command", feature = "oci"))]
    #[test]
    fn a_digest_is_sha256_in_lowercase_hex() {
        assert_eq!(
            sha256(b"alice"),
            "sha256:2bd806c97f0e00af1a1fc3328fa763a9269723c8db8fac4f93af71db186d6e90"
        );
    }

    #[test]
    fn a_program_on_the_path_is_found_and_a_made_up_one_is_not() {
        assert!(find_program("sh").is_some());
        assert!(find_program("runloop-no-such-program").is_none());
    }

    #[test]
    fn a_missing_part_is_described_with_its_package() {
        let part = Part::program("runloop-no-such-program", "runloop-nothing");
        assert!(!part.present());
        assert_eq!(
            part.describe(),
            "runloop-no-such-program (apt-get install runloop-nothing)"
        );
    }

    #[test]
    fn what_is_missing_is_named_and_what_is_here_is_not() {
        assert_eq!(missing(&[Part::program("sh", "dash")]), None);
        assert!(needs(&[Part::program("sh", "dash")]));
        let parts = [
            Part::program("sh", "dash"),
            Part::program("runloop-no-such-program", "runloop-nothing"),
            Part::File {
                path: "/runloop-no-such-file",
                from: "nothing",
            },
        ];
        assert_eq!(
            missing(&parts).as_deref(),
            Some(
                "runloop-no-such-program (apt-get install runloop-nothing), \
                 /runloop-no-such-file (nothing)"
            )
        );
    }
}
