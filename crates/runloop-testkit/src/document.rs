//! The repository's documents as tests read them: the fenced block after a
//! `<!-- MARKER -->` comment (a recipe a test runs as the page has it, a
//! transcript it replays), so that a page cannot drift from what works.

use std::path::{Path, PathBuf};

/// The root of the workspace.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace's root")
}

/// The fenced block after `<!-- MARKER -->` in the document at `path`
/// (relative to the workspace), without its fences.
pub fn marked_block(path: &str, marker: &str) -> String {
    let text = std::fs::read_to_string(workspace().join(path))
        .unwrap_or_else(|error| panic!("{path}: {error}"));
    let (_, after) = text
        .split_once(&format!("<!-- {marker} -->\n"))
        .unwrap_or_else(|| panic!("{path} has no <!-- {marker} --> block"));
    let (fence, block) = after.split_once('\n').expect("a fence after the marker");
    assert!(
        fence.starts_with("```"),
        "{path}: no code block after <!-- {marker} -->"
    );
    let (body, _) = block
        .split_once("\n```\n")
        .unwrap_or_else(|| panic!("{path}: the <!-- {marker} --> block does not end"));
    format!("{body}\n")
}

/// One command of a console transcript and the output shown after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shown {
    /// The command, without its `$ ` prompt.
    pub command: String,
    /// The lines after it, each ended with a newline.
    pub output: String,
}

/// The commands of a console block (lines that start with `$ `) and the
/// output each shows.
pub fn transcript(block: &str) -> Vec<Shown> {
    let mut shown: Vec<Shown> = Vec::new();
    for line in block.lines() {
        if let Some(command) = line.strip_prefix("$ ") {
            shown.push(Shown {
                command: command.to_owned(),
                output: String::new(),
            });
        } else {
            let last = shown
                .last_mut()
                .unwrap_or_else(|| panic!("output before any command: {line:?}"));
            last.output.push_str(line);
            last.output.push('\n');
        }
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transcript_pairs_each_command_with_its_output() {
        let block = "$ runloop run hi\nhi\nthe loop finished\n$ true\n";
        assert_eq!(
            transcript(block),
            [
                Shown {
                    command: "runloop run hi".to_owned(),
                    output: "hi\nthe loop finished\n".to_owned(),
                },
                Shown {
                    command: "true".to_owned(),
                    output: String::new(),
                },
            ]
        );
    }

    #[test]
    fn a_marked_block_is_found_without_its_fences() {
        let recipe = marked_block("docs/tls.md", "recipe: tls");
        assert!(recipe.starts_with("# The authority"), "{recipe}");
        assert!(!recipe.contains("```"), "{recipe}");
    }
}
