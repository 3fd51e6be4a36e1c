//! The program lookup an exec entry's runs will do, done once when the
//! server starts, so that a catalog naming a program that is not there
//! says so before its first caller is refused.
//!
//! A run execs `PROGRAM` from the server's directory with the server's
//! `PATH` (looked up there unless it holds a `/`), so what is missing now
//! is missing for every run. The first argument that is not an option and
//! names a script (a `/`, or an extension such as `.py`) is checked too:
//! `exec:python3 agnet.py` starts Python, which then exits at once. A
//! module (`python3 -m http.server`) or inline code (`-c …`) names no file
//! and is not checked.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The extensions of the scripts an interpreter is usually given.
const SCRIPTS: &[&str] = &[
    "py", "js", "mjs", "cjs", "ts", "rb", "pl", "sh", "bash", "php", "lua", "jar",
];

/// Why `program` with `args` cannot start, as things stand; `None` when
/// it can, as far as can be told without starting it.
pub(super) fn missing(program: &str, args: &[String]) -> Option<String> {
    match resolve(program, std::env::var_os("PATH").as_deref()) {
        Found::Nowhere if program.contains('/') => {
            return Some(format!("the agent program {program:?} does not exist"));
        }
        Found::Nowhere => {
            return Some(format!(
                "the agent program {program:?} is not on the server's PATH (write a path, \
                 such as ./{program}, or name its interpreter)"
            ));
        }
        Found::NotExecutable(path) => {
            return Some(format!(
                "the agent program {} is not executable (chmod +x it, or name its interpreter)",
                path.display()
            ));
        }
        Found::Executable => {}
    }
    let script = args.iter().find(|arg| !arg.starts_with('-'))?;
    let skipped = args
        .iter()
        .take_while(|arg| *arg != script)
        .any(|arg| matches!(arg.as_str(), "-m" | "-c" | "-e"));
    let names_a_file = script.contains('/')
        || Path::new(script)
            .extension()
            .and_then(OsStr::to_str)
            .is_some_and(|extension| SCRIPTS.contains(&extension));
    (names_a_file && !skipped && !Path::new(script).exists()).then(|| {
        format!(
            "{program}'s argument {script:?} names no file (relative to the server's directory)"
        )
    })
}

/// Where a program name leads.
#[derive(Debug, PartialEq, Eq)]
enum Found {
    /// An executable file.
    Executable,
    /// A file without an execute bit.
    NotExecutable(PathBuf),
    /// Nothing.
    Nowhere,
}

/// Looks `program` up as exec does: as a path when it holds a `/`, else in
/// each directory of `path`.
fn resolve(program: &str, path: Option<&OsStr>) -> Found {
    if program.contains('/') {
        return check(Path::new(program));
    }
    let mut found = Found::Nowhere;
    for dir in std::env::split_paths(path.unwrap_or_default()) {
        match check(&dir.join(program)) {
            Found::Executable => return Found::Executable,
            Found::NotExecutable(file) if found == Found::Nowhere => {
                found = Found::NotExecutable(file);
            }
            _ => {}
        }
    }
    found
}

fn check(file: &Path) -> Found {
    match std::fs::metadata(file) {
        Ok(meta) if meta.is_file() && meta.permissions().mode() & 0o111 != 0 => Found::Executable,
        Ok(meta) if meta.is_file() => Found::NotExecutable(file.to_owned()),
        _ => Found::Nowhere,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<String> {
        words.iter().map(|word| (*word).to_owned()).collect()
    }

    #[test]
    fn a_program_is_found_on_the_path_or_at_its_path() {
        assert_eq!(
            resolve("sh", Some(OsStr::new("/usr/bin:/bin"))),
            Found::Executable
        );
        assert_eq!(resolve("/bin/sh", None), Found::Executable);
        assert_eq!(
            resolve("sh", Some(OsStr::new("/nonexistent"))),
            Found::Nowhere
        );
        assert_eq!(
            resolve("passwd", Some(OsStr::new("/nonexistent:/etc"))),
            Found::NotExecutable(PathBuf::from("/etc/passwd"))
        );
    }

    #[test]
    fn what_is_missing_is_said() {
        assert_eq!(missing("sh", &args(&["-c", "exit 0"])), None);
        assert_eq!(
            missing("agent-that-is-nowhere.py", &[]).as_deref(),
            Some(
                "the agent program \"agent-that-is-nowhere.py\" is not on the server's PATH \
                 (write a path, such as ./agent-that-is-nowhere.py, or name its interpreter)"
            )
        );
        assert_eq!(
            missing("/nonexistent/agent", &[]).as_deref(),
            Some("the agent program \"/nonexistent/agent\" does not exist")
        );
        assert_eq!(
            missing("sh", &args(&["-c", "agnet.sh"])),
            None,
            "after -c comes code"
        );
        assert_eq!(
            missing("sh", &args(&["-x", "agnet.sh"])).as_deref(),
            Some("sh's argument \"agnet.sh\" names no file (relative to the server's directory)")
        );
        assert_eq!(
            missing("sh", &args(&["http.server"])),
            None,
            "not a script's name"
        );
    }
}
