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

use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};

/// glibc's `sigset_t`: 1024 bits.
#[repr(C)]
struct SigSet([u64; 16]);

const SIG_BLOCK: i32 = 0;
const SIG_SETMASK: i32 = 2;
const WNOHANG: i32 = 1;
const SIGCHLD: i32 = 17;

unsafe extern "C" {
    fn sigfillset(set: *mut SigSet) -> i32;
    fn sigprocmask(how: i32, set: *const SigSet, old: *mut SigSet) -> i32;
    fn sigwaitinfo(set: *const SigSet, info: *mut u8) -> i32;
    fn kill(pid: i32, signal: i32) -> i32;
    fn waitpid(pid: i32, status: *mut i32, options: i32) -> i32;
}

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some("--".as_ref()) {
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
    command.args(args);
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
