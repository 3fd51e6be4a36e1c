//! The init: a small static program (`init/main.rs`, built by `build.rs`
//! and embedded here) that runs as PID 1 of every container and starts
//! the image's process under it.
//!
//! Why: PID 1 of a namespace gets only the signals it installed handlers
//! for, so an agent that is PID 1 and leaves SIGTERM alone (a Python
//! program, most programs) never sees the stop and waits out the grace
//! before SIGKILL — every stop took the whole grace. Under the init the
//! agent is PID 2, SIGTERM does what it does anywhere, and orphans are
//! reaped (as `docker run --init` does). The init is ours rather than the
//! runloop binary under a hidden subcommand because it must run in any
//! image, and that binary needs the host's C library; a static binary of
//! our own needs nothing from the image.
//!
//! The host writes it once into its store ([`install`]); each container
//! gets it bound read-only at [`PATH`].

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};

/// The init binary.
pub const BINARY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/runloop-init"));

/// Where each container finds it (on the runtime's own `/dev`, so the
/// image's tree is not touched).
pub const PATH: &str = "/dev/runloop-init";

/// The process arguments that run `args` under the init.
pub fn wrap(args: &[String]) -> Vec<String> {
    [PATH.to_owned(), "--".to_owned()]
        .into_iter()
        .chain(args.iter().cloned())
        .collect()
}

/// Writes the init into `dir` (as `init`, mode 0755, replaced whole), and
/// returns its path.
pub fn install(dir: &Path) -> io::Result<PathBuf> {
    let path = dir.join("init");
    let temporary = dir.join(format!(".init-{}", crate::random_name()));
    std::fs::write(&temporary, BINARY)?;
    std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&temporary, &path)?;
    Ok(path)
}

/// Checks that the image has the program its process names, as runc
/// does before it starts one (with the init, runc only sees the init):
/// a path is looked up in the image's root, a bare name in its `PATH`.
pub fn find_program(rootfs: &Path, args: &[String], env: &[String]) -> Result<(), String> {
    let Some(program) = args.first() else {
        return Err("the image names no program to run (no Entrypoint or Cmd)".to_owned());
    };
    if program.contains('/') && !program.starts_with('/') {
        // Relative to the working directory: runc's to check.
        return Ok(());
    }
    let candidates: Vec<String> = if program.contains('/') {
        vec![program.clone()]
    } else {
        env.iter()
            .rev()
            .find_map(|pair| pair.strip_prefix("PATH="))
            .unwrap_or("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .split(':')
            .filter(|dir| !dir.is_empty())
            .map(|dir| format!("{dir}/{program}"))
            .collect()
    };
    let root = rustix::fs::open(
        rootfs,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| format!("cannot open the image's root: {}", io::Error::from(errno)))?;
    let mut last = rustix::io::Errno::NOENT;
    for candidate in &candidates {
        match rustix::fs::openat2(
            &root,
            candidate.as_str(),
            OFlags::PATH | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
        ) {
            Ok(_) => return Ok(()),
            Err(errno) => last = errno,
        }
    }
    let why = io::Error::from(last).to_string().to_lowercase();
    Err(format!(
        "the image's program {program:?} is not in the image: {}",
        why.split(" (os error").next().unwrap_or(&why)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_found_by_path_and_by_name_inside_the_root() {
        let root = tempfile::tempdir().expect("temp");
        std::fs::create_dir_all(root.path().join("usr/bin")).expect("dirs");
        std::fs::write(root.path().join("usr/bin/agent"), b"").expect("agent");
        std::os::unix::fs::symlink("/usr/bin/agent", root.path().join("linked")).expect("link");
        let args = |program: &str| vec![program.to_owned()];
        let env = vec!["PATH=/bin:/usr/bin".to_owned()];
        let find = |program: &str| find_program(root.path(), &args(program), &env);
        assert_eq!(find("/usr/bin/agent"), Ok(()));
        assert_eq!(find("agent"), Ok(()));
        assert_eq!(find("/linked"), Ok(()));
        assert_eq!(
            find("/nope"),
            Err(
                "the image's program \"/nope\" is not in the image: no such file or directory"
                    .to_owned()
            )
        );
        assert!(find("ls").is_err());
        assert!(find_program(root.path(), &[], &env).is_err());
        assert_eq!(
            wrap(&args("/agent")),
            vec![PATH.to_owned(), "--".to_owned(), "/agent".to_owned()]
        );
        assert!(BINARY.starts_with(b"\x7fELF"));
    }
}
