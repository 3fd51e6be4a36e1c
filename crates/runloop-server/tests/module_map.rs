//! The module map at the top of `lib.rs` is true: it names every module of
//! the crate, and every module uses (`super::…`, `crate::…`) only modules
//! below it in the map, so the crate's modules have no circle and no arrow
//! running up. Test modules are left out: a test may reach anywhere.

use std::collections::BTreeSet;
use std::path::Path;

/// The modules of the map, in its order, from `lib.rs`'s documentation.
fn the_map(lib: &str) -> Vec<String> {
    let doc: Vec<&str> = lib
        .lines()
        .take_while(|line| line.starts_with("//!"))
        .map(|line| line.trim_start_matches("//!").trim_start())
        .collect();
    let start = doc
        .iter()
        .position(|line| line.starts_with("lib.rs "))
        .expect("the map, starting with lib.rs");
    doc[start..]
        .iter()
        .take_while(|line| !line.starts_with("```"))
        .filter_map(|line| line.split_whitespace().next())
        .filter_map(|word| word.strip_suffix(".rs"))
        .filter(|name| *name != "lib")
        .map(str::to_owned)
        .collect()
}

/// The modules `source` names through `super::` or `crate::`, outside its
/// test module and its comments.
fn arrows(source: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let code = source
        .split("#[cfg(test)]\nmod tests")
        .next()
        .unwrap_or_default();
    let code: String = code
        .lines()
        .map(|line| line.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n");
    let mut named = BTreeSet::new();
    for prefix in ["super::", "crate::"] {
        for (at, _) in code.match_indices(prefix) {
            let rest = &code[at + prefix.len()..];
            let words: Vec<&str> = if let Some(group) = rest.strip_prefix('{') {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                group.split([',', ' ', '\n', ':', '{']).collect()
            } else {
                let end = rest
                    .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                vec![&rest[..end]]
            };
            named.extend(
                words
                    .into_iter()
                    .filter(|word| modules.contains(*word))
                    .map(str::to_owned),
            );
        }
    }
    named
}

#[test]
fn the_module_map_names_every_module_and_every_arrow_points_down() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let read = |name: &str| std::fs::read_to_string(src.join(name)).expect("a source file");
    let map = the_map(&read("lib.rs"));
    let files: BTreeSet<String> = std::fs::read_dir(&src)
        .expect("src")
        .map(|entry| {
            entry
                .expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter_map(|name| name.strip_suffix(".rs").map(str::to_owned))
        .filter(|name| name != "lib")
        .collect();
    let mapped: BTreeSet<String> = map.iter().cloned().collect();
    assert_eq!(
        mapped.len(),
        map.len(),
        "a module named twice in the map: {map:?}"
    );
    assert_eq!(
        mapped, files,
        "the map in lib.rs's documentation names every module, and only those"
    );
    let mut up = Vec::new();
    for (place, module) in map.iter().enumerate() {
        for used in arrows(&read(&format!("{module}.rs")), &files) {
            let below = map.iter().position(|m| *m == used).expect("mapped");
            if below <= place && used != *module {
                up.push(format!("{module} -> {used}"));
            }
        }
    }
    assert!(
        up.is_empty(),
        "arrows running up the map in lib.rs (move the module, or the code): {up:?}"
    );
}

#[test]
fn arrows_are_read_from_paths_and_groups_not_comments_or_tests() {
    let modules: BTreeSet<String> = ["alpha", "beta", "gamma", "delta"]
        .map(str::to_owned)
        .into();
    let source = "use super::alpha::Thing;\n\
                  use super::{beta, gamma::{self, Other}};\n\
                  // super::delta is only named here\n\
                  #[cfg(test)]\nmod tests {\n    use crate::delta;\n}\n";
    let found: Vec<String> = arrows(source, &modules).into_iter().collect();
    assert_eq!(found, ["alpha", "beta", "gamma"]);
}
