//! runloop-init: the first process (PID 1) of every container, in front
//! of the image's agent program.
//!
//! A process that is PID 1 of its namespace gets no signal it has not
//! asked for: a SIGTERM to an agent that installs no handler (most Python
//! programs) is dropped, and every stop waits out the grace before
//! SIGKILL. This init asks for every signal, passes each on to the agent
//! (where the default action applies as it does anywhere else), reaps
//! every orphan that is handed to it, and exits as the agent did: with
//! its exit status, or 128 + the signal that killed it. Its exit ends the
//! namespace, and the kernel kills whatever the agent left behind.
//!
//! Usage: `runloop-init -- PROGRAM [ARG]...`. The runtime binds it into
//! the container read-only; it is built by `build.rs` as a static binary
//! (no library from the image is needed), with the standard library and
//! a few declarations of the C library's signal calls.
//!
//! With `RUNLOOP_SECCOMP_BPF` in its environment (the container's syscall
//! filter as runc compiles it, made once by the host: hex, one program per
//! filter, comma-separated, oldest first), it installs that filter on
//! itself before anything else, and the agent inherits it; the variable
//! is not passed on. `runloop-init --hold` only says `held` and waits to
//! be killed: the host reads a container's filter from it.

use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};

/// glibc's `sigset_t`: 1024 bits.
#[repr(C)]
struct SigSet([u64; 16]);

const SIG_BLOCK: i32 = 0;
const SIG_SETMASK: i32 = 2;
const WNOHANG: i32 = 1;
const SIGCHLD: i32 = 17;

/// `PR_SET_SECCOMP`, `SECCOMP_MODE_FILTER`.
const PR_SET_SECCOMP: i32 = 22;
const SECCOMP_MODE_FILTER: u64 = 2;

/// The environment variable that carries the filter.
const FILTER: &str = "RUNLOOP_SECCOMP_BPF";

/// `struct sock_fprog`.
#[repr(C)]
struct Program {
    length: u16,
    filter: *const u8,
}

unsafe extern "C" {
    fn prctl(option: i32, arg2: u64, arg3: *const Program, arg4: u64, arg5: u64) -> i32;
    fn sigfillset(set: *mut SigSet) -> i32;
    fn sigprocmask(how: i32, set: *const SigSet, old: *mut SigSet) -> i32;
    fn sigwaitinfo(set: *const SigSet, info: *mut u8) -> i32;
    fn kill(pid: i32, signal: i32) -> i32;
    fn waitpid(pid: i32, status: *mut i32, options: i32) -> i32;
}

/// The bytes of a hex text; `None` if it is not one.
fn unhex(text: &str) -> Option<Vec<u8>> {
    let digit = |b: u8| (b as char).to_digit(16);
    let bytes = text.as_bytes();
    if bytes.len() % 2 != 0 {
        return None;
    }
    bytes
        .chunks(2)
        .map(|pair| Some((digit(pair[0])? * 16 + digit(pair[1])?) as u8))
        .collect()
}

/// Installs the filters of `RUNLOOP_SECCOMP_BPF` on this process (the
/// container set no-new-privileges before it ran this), oldest first.
fn install(filters: &str) -> Result<(), String> {
    for hex in filters.split(',') {
        let bytes = unhex(hex).ok_or("the filter is not hex")?;
        if bytes.is_empty() || bytes.len() % 8 != 0 {
            return Err("the filter is not whole instructions".into());
        }
        let length = u16::try_from(bytes.len() / 8).map_err(|_| "the filter is too long")?;
        let program = Program {
            length,
            filter: bytes.as_ptr(),
        };
        // SAFETY: `program` points into `bytes`, alive for the call.
        if unsafe { prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program, 0, 0) } != 0 {
            return Err(std::io::Error::last_os_error().to_string());
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    // First of all: nothing of the image runs before the filter is on.
    if let Some(filters) = std::env::var_os(FILTER) {
        let installed = filters
            .to_str()
            .ok_or_else(|| "the filter is not text".to_owned())
            .and_then(install);
        if let Err(error) = installed {
            eprintln!("runloop-init: cannot install the container's syscall filter: {error}");
            return ExitCode::from(125);
        }
    }
    let mut args = std::env::args_os().skip(1);
    let first = args.next();
    if first.as_deref() == Some("--hold".as_ref()) {
        println!("held");
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
    if first.as_deref() != Some("--".as_ref()) {
        eprintln!("runloop-init: usage: runloop-init -- PROGRAM [ARG]...");
        return ExitCode::from(2);
    }
    let Some(program) = args.next() else {
        eprintln!("runloop-init: no program to run");
        return ExitCode::from(2);
    };
    let mut all = SigSet([0; 16]);
    // SAFETY: `all` is a valid sigset_t-sized buffer; blocking every
    // signal here (before the child exists) means none is lost: each
    // waits for `sigwaitinfo`.
    unsafe {
        sigfillset(&mut all);
        sigprocmask(SIG_BLOCK, &all, std::ptr::null_mut());
    }
    let mut command = Command::new(&program);
    command.args(args).env_remove(FILTER);
    // SAFETY: between fork and exec, one async-signal-safe call on a
    // local buffer. The agent starts with no signal blocked (a blocked
    // mask is inherited, and would hold back the very SIGTERM passed on).
    unsafe {
        command.pre_exec(|| {
            let none = SigSet([0; 16]);
            sigprocmask(SIG_SETMASK, &none, std::ptr::null_mut());
            Ok(())
        });
    }
    let child = match command.spawn() {
        Ok(child) => child,
        Err(error) => {
            eprintln!("runloop-init: cannot run {}: {error}", program.to_string_lossy());
            return ExitCode::from(if error.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            });
        }
    };
    let agent = i32::try_from(child.id()).unwrap_or(i32::MAX);
    loop {
        // SAFETY: `all` is initialised; a null info is allowed.
        let signal = unsafe { sigwaitinfo(&all, std::ptr::null_mut()) };
        if signal < 0 {
            continue;
        }
        if signal != SIGCHLD {
            // SAFETY: plain system call on a pid this process made.
            unsafe { kill(agent, signal) };
            continue;
        }
        loop {
            let mut status = 0;
            // SAFETY: `status` is a valid out pointer.
            let pid = unsafe { waitpid(-1, &mut status, WNOHANG) };
            if pid <= 0 {
                break;
            }
            if pid == agent {
                let code = if status & 0x7f == 0 {
                    (status >> 8) & 0xff
                } else {
                    128 + (status & 0x7f)
                };
                return ExitCode::from(u8::try_from(code).unwrap_or(255));
            }
        }
    }
}
