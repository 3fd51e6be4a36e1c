//! The core has no runtime: nothing this crate needs to build (its normal
//! dependencies, however deep) is an async runtime, a futures library, a
//! logging framework, a clock library or an MCP SDK.
//!
//! The graph is read from the workspace's `Cargo.lock`, which every clean
//! clone has and `--locked` keeps true, so the test needs no network, no
//! registry index and no `cargo` of its own. The lock file holds more than
//! this crate's tree ever builds (the features every workspace member asks
//! for, every platform's dependencies, this crate's dev-dependencies, which
//! are left out here by name), so what is found is a superset of
//! `cargo tree -p runloop-proto -e normal`: a name missing from it is
//! missing from the real tree.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

/// Names the core's tree must not hold; a `-` after a name covers its
/// family (`futures-util`, `tracing-core`, `tokio-util`, ...).
const FORBIDDEN: [&str; 5] = ["tokio", "futures", "tracing", "chrono", "rmcp"];

/// One `[[package]]` of the lock file.
struct Package {
    name: String,
    version: String,
    dependencies: Vec<String>,
}

/// The lock file's packages; enough of TOML for the format Cargo writes.
fn packages(lock: &str) -> Vec<Package> {
    let mut all: Vec<Package> = Vec::new();
    let mut in_dependencies = false;
    for line in lock.lines().map(str::trim) {
        let quoted = |prefix: &str| {
            line.strip_prefix(prefix)
                .map(|rest| rest.trim_matches('"').to_owned())
        };
        if line == "[[package]]" {
            all.push(Package {
                name: String::new(),
                version: String::new(),
                dependencies: Vec::new(),
            });
            in_dependencies = false;
        } else if let Some(package) = all.last_mut() {
            if in_dependencies {
                if line == "]" {
                    in_dependencies = false;
                } else {
                    let entry = line.trim_end_matches(',').trim_matches('"');
                    package.dependencies.push(entry.to_owned());
                }
            } else if line == "dependencies = [" {
                in_dependencies = true;
            } else if let Some(name) = quoted("name = ") {
                package.name = name;
            } else if let Some(version) = quoted("version = ") {
                package.version = version;
            }
        }
    }
    all
}

/// The names of this crate's dev-dependencies, from its manifest.
fn dev_dependencies(manifest: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut in_section = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_section = line == "[dev-dependencies]";
        } else if in_section
            && !line.starts_with('#')
            && let Some((key, _)) = line.split_once('=')
        {
            names.insert(key.trim().trim_end_matches(".workspace").to_owned());
        }
    }
    names
}

/// Every package `root` reaches through the lock file's edges, leaving
/// out the edges named in `skip` at the root: `name version` strings.
fn reachable(all: &[Package], root: &str, skip: &BTreeSet<String>) -> BTreeSet<String> {
    let by_name: HashMap<&str, Vec<&Package>> =
        all.iter().fold(HashMap::new(), |mut map, package| {
            map.entry(package.name.as_str()).or_default().push(package);
            map
        });
    // An entry is `name`, or `name version` when two versions are locked,
    // or `name version (source)`.
    let resolve = |entry: &str| -> &Package {
        let mut words = entry.split_whitespace();
        let name = words.next().expect("a dependency entry names a package");
        let candidates = by_name
            .get(name)
            .unwrap_or_else(|| panic!("{entry}: not a locked package"));
        match words.next() {
            Some(version) => candidates
                .iter()
                .find(|p| p.version == version)
                .unwrap_or_else(|| panic!("{entry}: no such version")),
            None => {
                assert_eq!(candidates.len(), 1, "{entry}: which version?");
                candidates[0]
            }
        }
    };
    let roots = by_name.get(root).expect("the crate is in the lock file");
    assert_eq!(roots.len(), 1);
    let mut found = BTreeSet::new();
    let mut todo: Vec<&Package> = roots[0]
        .dependencies
        .iter()
        .filter(|entry| {
            let name = entry.split_whitespace().next().unwrap_or_default();
            !skip.contains(name)
        })
        .map(|entry| resolve(entry))
        .collect();
    while let Some(package) = todo.pop() {
        if found.insert(format!("{} {}", package.name, package.version)) {
            todo.extend(package.dependencies.iter().map(|entry| resolve(entry)));
        }
    }
    found
}

fn forbidden(name: &str) -> bool {
    FORBIDDEN
        .iter()
        .any(|bad| name == *bad || name.starts_with(&format!("{bad}-")))
}

#[test]
fn the_core_tree_holds_no_runtime() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |path: &Path| {
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let lock = read(&here.join("../../Cargo.lock"));
    let dev = dev_dependencies(&read(&here.join("Cargo.toml")));
    assert!(dev.contains("proptest"), "dev-dependencies read: {dev:?}");

    let tree = reachable(&packages(&lock), "runloop-proto", &dev);
    let names: BTreeSet<&str> = tree
        .iter()
        .filter_map(|package| package.split_whitespace().next())
        .collect();
    // The reading found the crate's real dependencies, and no dev-only one.
    for needed in ["serde", "serde_json", "thiserror", "base64", "simdutf8"] {
        assert!(names.contains(needed), "{needed} missing from {names:?}");
    }
    assert!(!names.contains("proptest"), "{names:?}");
    assert!(!names.contains("criterion"), "{names:?}");

    let bad: Vec<&str> = names.iter().copied().filter(|n| forbidden(n)).collect();
    assert!(
        bad.is_empty(),
        "runloop-proto's normal dependencies reach {bad:?}: the core must build without a runtime"
    );
}

#[test]
fn the_names_cover_their_families() {
    for name in [
        "tokio",
        "tokio-util",
        "futures-util",
        "tracing-core",
        "chrono",
        "rmcp",
    ] {
        assert!(forbidden(name), "{name}");
    }
    for name in ["serde", "futuresque", "tokenizer", "rmcp_like"] {
        assert!(!forbidden(name), "{name}");
    }
}
