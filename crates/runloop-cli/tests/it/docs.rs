//! The documents that ship with the code, held to it: every protocol
//! section cited anywhere exists in `docs/protocol.md`, the agent guide's
//! listings are the example files, relative links resolve, the table of
//! error kinds is `ErrorKind`, the CLI reference (docs/cli.md) names the
//! subcommands and flags `runloop --help` has, the agent guide's exit
//! codes and the Rust guide's dependencies are what the code does.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace's root")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The repository's text files a citation can be in: sources, manifests,
/// documents and the CI scripts; build output and VCS data left out.
fn text_files(dir: &Path, found: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if name != "target" && (name == ".ci" || !name.starts_with('.')) {
                text_files(&path, found);
            }
        } else if path.parent().and_then(Path::file_name) == Some(".ci".as_ref())
            || ["rs", "md", "toml", "py", "mjs"]
                .iter()
                .any(|ext| path.extension().is_some_and(|e| e == *ext))
        {
            found.push(path);
        }
    }
}

/// Every `§N` in `text`: its line number and N.
fn citations(text: &str) -> Vec<(usize, u32)> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        for (_, rest) in line
            .match_indices('§')
            .map(|(i, _)| line.split_at(i + '§'.len_utf8()))
        {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            if let Ok(section) = digits.parse() {
                found.push((n + 1, section));
            }
        }
    }
    found
}

/// The sections of `docs/protocol.md`: those with both an `<a id="sN">`
/// anchor and a `## N. ` heading.
fn protocol_sections() -> BTreeSet<u32> {
    let protocol = read("docs/protocol.md");
    (1..=99)
        .filter(|n| {
            protocol.contains(&format!("<a id=\"s{n}\"></a>"))
                && protocol
                    .lines()
                    .any(|l| l.starts_with(&format!("## {n}. ")))
        })
        .collect()
}

#[test]
fn every_cited_protocol_section_exists() {
    let sections = protocol_sections();
    assert_eq!(
        sections,
        (1..=12).collect(),
        "docs/protocol.md keeps the sections 1 to 12, each with its anchor"
    );
    let mut files = Vec::new();
    text_files(&root(), &mut files);
    let mut cited = 0;
    let mut missing = Vec::new();
    for file in &files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for (line, section) in citations(&text) {
            cited += 1;
            if !sections.contains(&section) {
                missing.push(format!("{}:{line}: §{section}", file.display()));
            }
        }
        // Links to a section name its anchor.
        for anchor in text.split("protocol.md#s").skip(1) {
            let digits: String = anchor.chars().take_while(char::is_ascii_digit).collect();
            if digits
                .parse()
                .is_ok_and(|section| !sections.contains(&section))
            {
                missing.push(format!("{}: protocol.md#s{digits}", file.display()));
            }
        }
    }
    assert!(
        cited > 100,
        "only {cited} citations found: is the walk right?"
    );
    assert!(
        missing.is_empty(),
        "sections cited but not in docs/protocol.md:\n{}",
        missing.join("\n")
    );
    // One document is cited: the protocol as the repository ships it.
    let retired = [format!("{} §", "SPEC"), format!("{}.md", "SPEC")];
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for old in &retired {
            assert!(
                !text.contains(old.as_str()),
                "{} cites {old:?}: cite docs/protocol.md (\"protocol §N\")",
                file.display()
            );
        }
    }
}

#[test]
fn citations_are_found_in_every_form() {
    assert_eq!(
        citations("protocol §3, §10–§12 and protocol §7 (§N is not one)"),
        [(1, 3), (1, 10), (1, 12), (1, 7)]
    );
}

/// The guide's listings: (path, the fenced block after its marker).
fn listings(guide: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for rest in guide.split("<!-- listing: ").skip(1) {
        let (path, after) = rest.split_once(" -->\n").expect("a listing marker ends");
        let (fence, block) = after.split_once('\n').expect("a fence after the marker");
        assert!(
            fence.starts_with("```"),
            "{path}: no code block after the marker"
        );
        let (body, _) = block
            .split_once("\n```\n")
            .unwrap_or_else(|| panic!("{path}: the block does not end"));
        found.push((path.to_owned(), format!("{body}\n")));
    }
    found
}

#[test]
fn the_guide_lists_each_example_as_the_file_has_it() {
    let listed = listings(&read("docs/agents.md"));
    let paths: Vec<&str> = listed.iter().map(|(path, _)| path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "docs/examples/agent.py",
            "docs/examples/agent.mjs",
            "crates/runloop/examples/echo_agent.rs",
        ]
    );
    for (path, listing) in &listed {
        assert!(
            listing == &read(path),
            "docs/agents.md's listing of {path} is not the file"
        );
    }
    let examples: BTreeSet<String> = std::fs::read_dir(root().join("docs/examples"))
        .expect("docs/examples")
        .map(|entry| {
            format!(
                "docs/examples/{}",
                entry.expect("entry").file_name().to_string_lossy()
            )
        })
        .collect();
    let operating = listings(&read("docs/operating.md"));
    for example in &examples {
        assert!(
            paths.contains(&example.as_str()) || operating.iter().any(|(path, _)| path == example),
            "{example} is not in the guide or the operator's page"
        );
    }
}

#[test]
fn the_operators_page_lists_the_example_configuration_as_the_file_has_it() {
    let listed = listings(&read("docs/operating.md"));
    let paths: Vec<&str> = listed.iter().map(|(path, _)| path.as_str()).collect();
    assert_eq!(
        paths,
        ["docs/examples/serve.toml", "docs/examples/alice.tokens"]
    );
    for (path, listing) in &listed {
        assert!(
            listing == &read(path),
            "docs/operating.md's listing of {path} is not the file"
        );
    }
}

/// The README and every page of docs/.
fn documents() -> Vec<String> {
    let mut found = vec!["README.md".to_owned()];
    let mut pages: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .filter_map(|entry| {
            let name = entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned();
            name.ends_with(".md").then(|| format!("docs/{name}"))
        })
        .collect();
    pages.sort();
    found.extend(pages);
    found
}

#[test]
fn relative_links_of_the_documents_resolve() {
    let mut checked = 0;
    let documents = documents();
    for page in [
        "docs/agents.md",
        "docs/cli.md",
        "docs/containers.md",
        "docs/limits.md",
        "docs/metrics.md",
        "docs/operating.md",
        "docs/protocol.md",
        "docs/python.md",
        "docs/rust.md",
        "docs/tls.md",
        "docs/troubleshooting.md",
    ] {
        assert!(documents.iter().any(|d| d == page), "{page} is missing");
    }
    for doc in &documents {
        let text = read(doc);
        let dir = root().join(doc).parent().expect("a directory").to_owned();
        for (_, rest) in text.match_indices("](").map(|(i, _)| text.split_at(i + 2)) {
            let target = rest.split([')', '#']).next().unwrap_or("");
            if target.is_empty() || target.contains("://") {
                continue;
            }
            checked += 1;
            assert!(
                dir.join(target).exists(),
                "{doc}: the link to {target} resolves to nothing"
            );
        }
    }
    assert!(checked >= 30, "only {checked} links checked");
}

/// Every README heading (`## Install` → `#install`), for the links that
/// point into it.
#[test]
fn links_into_the_readme_name_its_headings() {
    let readme = read("README.md");
    let anchors: BTreeSet<String> = readme
        .lines()
        .filter_map(|line| line.strip_prefix("## "))
        .map(|title| {
            title
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect();
    for doc in documents() {
        let text = read(&doc);
        for (_, rest) in text
            .match_indices("README.md#")
            .map(|(i, _)| text.split_at(i + 10))
        {
            let anchor: String = rest.chars().take_while(|c| *c != ')').collect();
            assert!(
                anchors.contains(&anchor),
                "{doc}: README.md#{anchor} is no heading"
            );
        }
    }
}

/// The help of `runloop ARGS… -h`: the short form, one line per option
/// (the long form, `--help`, puts blank lines between them).
fn help(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_runloop"))
        .args(args)
        .arg("-h")
        .output()
        .expect("runloop runs");
    assert!(output.status.success(), "{args:?} --help: {output:?}");
    String::from_utf8(output.stdout).expect("UTF-8 help")
}

/// The lines of a help section (`Commands:`) up to its blank line.
fn help_section<'a>(help: &'a str, title: &str) -> Vec<&'a str> {
    help.lines()
        .skip_while(|line| *line != title)
        .skip(1)
        .take_while(|line| !line.is_empty())
        .collect()
}

/// Every `--flag` of `text`.
fn flags(text: &str) -> BTreeSet<String> {
    text.match_indices("--")
        .map(|(i, _)| {
            let name: String = text[i + 2..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
                .collect();
            format!("--{name}")
        })
        .filter(|flag| flag.len() > 3 && !["--help", "--version"].contains(&flag.as_str()))
        .collect()
}

/// The commands `runloop --help` lists, with nested subcommands as
/// `agent demo`, and the long flags of each.
fn commands_in_help(path: &[&str], found: &mut Vec<(String, BTreeSet<String>)>) {
    let help = help(path);
    let commands: Vec<&str> = help_section(&help, "Commands:")
        .iter()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .collect();
    if commands.is_empty() {
        // Every headed group of options, from `Options:` to the end.
        let options = help
            .lines()
            .skip_while(|line| *line != "Options:")
            .filter(|line| line.trim_start().starts_with('-'))
            .map(|line| {
                line.split_whitespace()
                    .take(2)
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect::<Vec<_>>()
            .join(" ");
        found.push((path.join(" "), flags(&options)));
    }
    for command in commands {
        let mut sub = path.to_vec();
        sub.push(command);
        commands_in_help(&sub, found);
    }
}

/// The CLI reference's sections (docs/cli.md) that document commands: the commands each
/// heading names (`runloop proxy …` and `runloop agent demo …`) and every
/// flag the subsection mentions.
fn commands_in_readme() -> Vec<(Vec<String>, BTreeSet<String>)> {
    let cli = read("docs/cli.md");
    let mut found = Vec::new();
    for part in cli.split("\n## ").skip(1) {
        let heading = part.lines().next().unwrap_or("");
        let named: Vec<String> = heading
            .split('`')
            .skip(1)
            .step_by(2)
            .filter_map(|code| code.strip_prefix("runloop "))
            .map(|command| {
                command
                    .split_whitespace()
                    .take_while(|word| word.chars().all(|c| c.is_ascii_lowercase()))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        // A `cargo …` span's flags are cargo's.
        let own: String = part
            .split('`')
            .enumerate()
            .filter(|(i, span)| i % 2 == 0 || !span.starts_with("cargo "))
            .map(|(_, span)| span)
            .collect::<Vec<_>>()
            .join(" ");
        if !named.is_empty() {
            found.push((named, flags(&own)));
        }
    }
    found
}

#[test]
fn the_readme_documents_every_subcommand_and_flag_of_the_help() {
    let mut in_help = Vec::new();
    commands_in_help(&[], &mut in_help);
    let in_readme = commands_in_readme();

    let help_names: BTreeSet<&str> = in_help.iter().map(|(name, _)| name.as_str()).collect();
    let readme_names: BTreeSet<&str> = in_readme
        .iter()
        .flat_map(|(names, _)| names.iter().map(String::as_str))
        .collect();
    assert_eq!(
        readme_names, help_names,
        "the README's CLI headings and `runloop --help` name the same subcommands"
    );
    assert!(help_names.contains("agent demo"), "{help_names:?}");

    for (names, readme_flags) in &in_readme {
        let help_flags: BTreeSet<String> = in_help
            .iter()
            .filter(|(name, _)| names.contains(name))
            .flat_map(|(_, flags)| flags.iter().cloned())
            .collect();
        assert_eq!(
            readme_flags,
            &help_flags,
            "README section `runloop {}`: the flags it mentions (left) and the help's (right)",
            names.join("` and `runloop ")
        );
    }
}

#[test]
fn the_table_of_error_kinds_is_the_error_kind_enum() {
    let protocol = read("docs/protocol.md");
    let (_, after) = protocol
        .split_once("**The error values runloop writes.**")
        .expect("the table of error kinds in protocol §12");
    let kinds: Vec<&str> = after
        .lines()
        .skip_while(|line| !line.starts_with("| `kind`"))
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .filter_map(|row| row.split('`').nth(1))
        .collect();
    let enumerated: Vec<&str> = runloop_proto::ErrorKind::ALL
        .iter()
        .map(|kind| kind.as_str())
        .collect();
    assert_eq!(
        kinds, enumerated,
        "docs/protocol.md §12 lists every ErrorKind, in order"
    );
}

/// The agent guide's table of how a loop ends: for each row the demo agent
/// can play, `runloop run` against the embedded server exits with the code
/// the table gives.
#[test]
fn the_guide_s_exit_codes_are_the_ones_run_exits_with() {
    let guide = read("docs/agents.md");
    let (_, table) = guide
        .split_once("## How a loop ends\n")
        .expect("the guide's table of endings");
    let code_of = |row_start: &str| -> i32 {
        let row = table
            .lines()
            .find(|line| line.starts_with(row_start))
            .unwrap_or_else(|| panic!("no row {row_start:?} in docs/agents.md"));
        row.trim_end_matches('|')
            .rsplit('|')
            .next()
            .and_then(|code| code.trim().parse().ok())
            .unwrap_or_else(|| panic!("no exit code in {row:?}"))
    };
    let plays: [(&str, &[&str]); 5] = [
        ("| `200`, chunks, then the body ends |", &["hi"]),
        (
            "| `200`, chunks, a fatal notification, then the body ends |",
            &["hi demo:fatal"],
        ),
        ("| a non-`2xx` status on `/run` |", &["hi demo:refuse"]),
        (
            "| `200`, chunks, then it crashes or is killed (the body breaks) |",
            &["hi demo:break"],
        ),
        (
            "| a non-`2xx` status on `/register` |",
            &["--agent-json", "\"demo:refuse\"", "hi"],
        ),
    ];
    for (row, args) in plays {
        let output = Command::new(env!("CARGO_BIN_EXE_runloop"))
            .arg("run")
            .args(args)
            .output()
            .expect("runloop runs");
        assert_eq!(
            output.status.code(),
            Some(code_of(row)),
            "{row}: runloop run {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// The `[dependencies]` of the Rust caller's guide: each crate its program
/// names, at the major version the workspace builds it with, with the
/// features the program needs; `runloop-client` (a caller's one crate of
/// this project, not the facade) by a path that ends at the crate. (The
/// program itself is a doctest of the `runloop` crate, whose embedded
/// server its hidden lines start.)
#[test]
fn the_rust_guide_s_dependencies_are_what_its_program_uses() {
    let guide = read("docs/rust.md");
    let (_, after) = guide
        .split_once("<!-- dependencies: caller -->\n```toml\n")
        .expect("the guide's dependencies block");
    let (block, rest) = after.split_once("\n```\n").expect("the block ends");
    let deps: Vec<(&str, &str)> = block
        .lines()
        .filter(|line| !line.starts_with('#') && !line.starts_with('['))
        .filter_map(|line| line.split_once(" = "))
        .collect();
    let names: BTreeSet<&str> = deps.iter().map(|(name, _)| *name).collect();
    let (_, program) = rest.split_once("```rust\n").expect("the guide's program");
    let (program, _) = program.split_once("\n```\n").expect("the program ends");
    let program: String = program
        .lines()
        .filter(|line| !line.trim_start().starts_with('#') || line.contains("#[tokio::main]"))
        .collect::<Vec<_>>()
        .join("\n");
    let used: BTreeSet<&str> = ["runloop_client", "tokio", "futures_util"]
        .into_iter()
        .filter(|krate| program.contains(&format!("{krate}::")))
        .collect();
    assert_eq!(used.len(), 3, "the program uses the three: {program}");
    for krate in &used {
        assert!(
            names.contains(krate.replace('_', "-").as_str()),
            "docs/rust.md's [dependencies] lacks {krate}"
        );
    }
    assert_eq!(
        names.len(),
        used.len(),
        "no dependency the program does not use: {names:?}"
    );
    let spec = |name: &str| deps.iter().find(|(n, _)| *n == name).map(|(_, spec)| *spec);
    let client = spec("runloop-client").unwrap_or_default();
    assert!(
        client.contains("path = \"") && client.contains("/crates/runloop-client\""),
        "{client}"
    );
    assert!(
        !program.contains("runloop::"),
        "the program names the client's crate, not the facade's: {program}"
    );
    let tokio = spec("tokio").unwrap_or_default();
    for feature in ["\"macros\"", "\"rt-multi-thread\""] {
        assert!(
            tokio.contains(feature),
            "#[tokio::main] needs {feature}: {tokio}"
        );
    }
    let workspace = read("Cargo.toml");
    for (name, major) in [("tokio", "\"1\""), ("futures-util", "\"0.3\"")] {
        assert!(
            spec(name).is_some_and(|spec| spec.contains(major)),
            "{name} at {major} in docs/rust.md"
        );
        assert!(
            workspace
                .lines()
                .any(|line| line.starts_with(&format!("{name} = ")) && line.contains(major)),
            "the workspace builds {name} at {major}"
        );
    }
}

/// The README's requirements are scripts/install-system-deps's sets: each
/// bullet names, in backticks before its first colon-free sentence ends,
/// exactly the packages `--list SET` prints.
#[test]
fn the_readme_s_requirements_are_the_install_script_s_sets() {
    let readme = read("README.md");
    let (_, requirements) = readme
        .split_once("\n## Requirements\n")
        .expect("the README's requirements");
    let requirements = requirements.split("\n## ").next().unwrap_or_default();
    for (bullet, set) in [
        ("- **To build**", "build"),
        ("- **To run containers**", "containers"),
        ("- **To run every test**", "tests"),
    ] {
        let (_, text) = requirements
            .split_once(bullet)
            .unwrap_or_else(|| panic!("no {bullet:?} in the README's requirements"));
        let text = text.split("\n- ").next().unwrap_or_default();
        let text = text.split("\n\n").next().unwrap_or_default();
        // The packages: the backticked words before the first full stop.
        let listed = text.split(". ").next().unwrap_or_default();
        let named: BTreeSet<&str> = listed
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|word| !word.contains(' ') && !word.contains('='))
            .collect();
        let output = Command::new(root().join("scripts/install-system-deps"))
            .args(["--list", set])
            .output()
            .expect("the script runs");
        assert!(output.status.success(), "{output:?}");
        let script = String::from_utf8(output.stdout).expect("UTF-8");
        let packages: BTreeSet<&str> = script.lines().collect();
        assert_eq!(
            named, packages,
            "README {bullet:?} (left) and the script's {set} set"
        );
    }
    let ci = read(".ci/run");
    assert!(
        ci.contains("scripts/install-system-deps build containers tests"),
        ".ci/run installs through the script"
    );
}

#[test]
fn the_tables_of_limits_are_made_from_the_one_table() {
    let table = runloop_cli::limit_table::markdown();
    for doc in ["docs/limits.md", "docs/operating.md"] {
        let text = read(doc);
        let (_, rest) = text
            .split_once("<!-- limits: begin -->\n")
            .unwrap_or_else(|| panic!("{doc} has no table of limits"));
        let (shown, _) = rest
            .split_once("<!-- limits: end -->")
            .unwrap_or_else(|| panic!("{doc}: the table of limits does not end"));
        assert!(
            shown == table,
            "{doc}'s table of limits is not crates/runloop-cli/src/limit_table.rs; it is:\n{table}"
        );
    }
}
