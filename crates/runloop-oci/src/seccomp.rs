//! The syscall filter: an allowlist every container runs under, written
//! here as a table of our own (not translated from a profile file), each
//! group with the reason it is allowed or refused.
//!
//! The shape is that of Docker's default profile — allow what ordinary
//! programs use, refuse the calls that reach kernel state shared beyond
//! the container — but the list is ours, short enough to read in one go:
//!
//! - **allowed** ([`ALLOWED`]): files, memory, processes and threads,
//!   signals, time, event waiting, sockets, the container's own System V
//!   and POSIX IPC, randomness. `clone` only without namespace flags.
//! - **refused with `EPERM`** ([`REFUSED`]): new namespaces and mounts (the
//!   way from "root in a user namespace" to a full capability set), the
//!   kernel's keyrings, BPF, perf events, io_uring (a large attack surface
//!   that bypasses this filter's view of each operation), tracing other
//!   processes, modules, clocks, swap, reboot.
//! - **everything else: `ENOSYS`**, as if the kernel did not have the call.
//!   A program meeting a call it may not use then takes the path it takes
//!   on an older kernel (glibc falls back from `clone3` to `clone`, from
//!   `faccessat2` to `faccessat`, on exactly that errno), where `EPERM`
//!   would make it fail.
//!
//! runc resolves the names for each architecture listed and skips a name
//! the architecture or its libseccomp does not know, so one table serves
//! x86-64 (with its 32-bit and x32 ABIs) and AArch64 (with 32-bit Arm).

use oci_spec::runtime::{
    Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArgBuilder, LinuxSeccompBuilder,
    LinuxSeccompOperator, LinuxSyscall, LinuxSyscallBuilder,
};

/// `EPERM`.
const EPERM: u32 = 1;
/// `ENOSYS`.
const ENOSYS: u32 = 38;

/// The namespace flags of `clone` (`CLONE_NEWNS`, `CLONE_NEWCGROUP`,
/// `CLONE_NEWUTS`, `CLONE_NEWIPC`, `CLONE_NEWUSER`, `CLONE_NEWPID`,
/// `CLONE_NEWNET`): a `clone` with any of them is refused.
pub const CLONE_NAMESPACES: [u64; 7] = [
    0x0002_0000,
    0x0200_0000,
    0x0400_0000,
    0x0800_0000,
    0x1000_0000,
    0x2000_0000,
    0x4000_0000,
];

/// The calls allowed, by what they are for.
pub const ALLOWED: &[(&str, &[&str])] = &[
    (
        "files and directories: reading, writing, naming, metadata, the process's own descriptors",
        &[
            "read",
            "write",
            "readv",
            "writev",
            "pread64",
            "pwrite64",
            "preadv",
            "pwritev",
            "preadv2",
            "pwritev2",
            "open",
            "openat",
            "openat2",
            "creat",
            "close",
            "close_range",
            "lseek",
            "_llseek",
            "stat",
            "fstat",
            "lstat",
            "newfstatat",
            "stat64",
            "fstat64",
            "lstat64",
            "fstatat64",
            "statx",
            "statfs",
            "fstatfs",
            "statfs64",
            "fstatfs64",
            "access",
            "faccessat",
            "faccessat2",
            "readlink",
            "readlinkat",
            "getdents",
            "getdents64",
            "mkdir",
            "mkdirat",
            "rmdir",
            "unlink",
            "unlinkat",
            "rename",
            "renameat",
            "renameat2",
            "link",
            "linkat",
            "symlink",
            "symlinkat",
            "chmod",
            "fchmod",
            "fchmodat",
            "fchmodat2",
            "chown",
            "fchown",
            "lchown",
            "fchownat",
            "chown32",
            "fchown32",
            "lchown32",
            "truncate",
            "ftruncate",
            "truncate64",
            "ftruncate64",
            "fallocate",
            "fsync",
            "fdatasync",
            "sync",
            "syncfs",
            "sync_file_range",
            "umask",
            "utime",
            "utimes",
            "utimensat",
            "utimensat_time64",
            "futimesat",
            "getcwd",
            "chdir",
            "fchdir",
            "dup",
            "dup2",
            "dup3",
            "fcntl",
            "fcntl64",
            "flock",
            "ioctl",
            "pipe",
            "pipe2",
            "sendfile",
            "sendfile64",
            "splice",
            "tee",
            "vmsplice",
            "copy_file_range",
            "fadvise64",
            "fadvise64_64",
            "arm_fadvise64_64",
            "readahead",
            "getxattr",
            "lgetxattr",
            "fgetxattr",
            "setxattr",
            "lsetxattr",
            "fsetxattr",
            "listxattr",
            "llistxattr",
            "flistxattr",
            "removexattr",
            "lremovexattr",
            "fremovexattr",
            "inotify_init",
            "inotify_init1",
            "inotify_add_watch",
            "inotify_rm_watch",
            "memfd_create",
            "mknod",
            "mknodat",
        ],
    ),
    (
        "memory: mapping, protecting and locking the process's own pages",
        &[
            "brk",
            "mmap",
            "mmap2",
            "munmap",
            "mremap",
            "mprotect",
            "madvise",
            "mincore",
            "mlock",
            "mlock2",
            "munlock",
            "mlockall",
            "munlockall",
            "msync",
            "membarrier",
            "pkey_mprotect",
            "pkey_alloc",
            "pkey_free",
        ],
    ),
    (
        "processes and threads: making, running, waiting for and signalling them; ids; limits",
        &[
            "fork",
            "vfork",
            "execve",
            "execveat",
            "exit",
            "exit_group",
            "wait4",
            "waitid",
            "waitpid",
            "kill",
            "tkill",
            "tgkill",
            "getpid",
            "getppid",
            "gettid",
            "getpgid",
            "setpgid",
            "getpgrp",
            "getsid",
            "setsid",
            "getuid",
            "geteuid",
            "getgid",
            "getegid",
            "getuid32",
            "geteuid32",
            "getgid32",
            "getegid32",
            "getresuid",
            "getresgid",
            "getresuid32",
            "getresgid32",
            "getgroups",
            "getgroups32",
            "setuid",
            "setgid",
            "setuid32",
            "setgid32",
            "setreuid",
            "setregid",
            "setreuid32",
            "setregid32",
            "setresuid",
            "setresgid",
            "setresuid32",
            "setresgid32",
            "setgroups",
            "setgroups32",
            "setfsuid",
            "setfsgid",
            "setfsuid32",
            "setfsgid32",
            "capget",
            "capset",
            "prctl",
            "arch_prctl",
            "set_tid_address",
            "set_robust_list",
            "get_robust_list",
            "rseq",
            "futex",
            "futex_time64",
            "futex_waitv",
            "sched_yield",
            "sched_getaffinity",
            "sched_setaffinity",
            "sched_getparam",
            "sched_setparam",
            "sched_getscheduler",
            "sched_setscheduler",
            "sched_get_priority_max",
            "sched_get_priority_min",
            "sched_rr_get_interval",
            "sched_rr_get_interval_time64",
            "sched_getattr",
            "sched_setattr",
            "getpriority",
            "setpriority",
            "ioprio_get",
            "ioprio_set",
            "getrlimit",
            "ugetrlimit",
            "setrlimit",
            "prlimit64",
            "getrusage",
            "times",
            "uname",
            "sysinfo",
            "getcpu",
            "pidfd_open",
            "pidfd_send_signal",
            "set_thread_area",
            "get_thread_area",
            "seccomp",
            "landlock_create_ruleset",
            "landlock_add_rule",
            "landlock_restrict_self",
            "restart_syscall",
        ],
    ),
    (
        "signals",
        &[
            "rt_sigaction",
            "rt_sigprocmask",
            "rt_sigreturn",
            "rt_sigpending",
            "rt_sigtimedwait",
            "rt_sigtimedwait_time64",
            "rt_sigqueueinfo",
            "rt_tgsigqueueinfo",
            "rt_sigsuspend",
            "sigaltstack",
            "signalfd",
            "signalfd4",
            "pause",
            "alarm",
            "sigaction",
            "sigprocmask",
            "sigreturn",
            "sigpending",
            "sigsuspend",
        ],
    ),
    (
        "time: reading clocks, sleeping, timers",
        &[
            "clock_gettime",
            "clock_gettime64",
            "clock_getres",
            "clock_getres_time64",
            "clock_nanosleep",
            "clock_nanosleep_time64",
            "nanosleep",
            "gettimeofday",
            "time",
            "timer_create",
            "timer_settime",
            "timer_settime64",
            "timer_gettime",
            "timer_gettime64",
            "timer_getoverrun",
            "timer_delete",
            "timerfd_create",
            "timerfd_settime",
            "timerfd_settime64",
            "timerfd_gettime",
            "timerfd_gettime64",
            "getitimer",
            "setitimer",
        ],
    ),
    (
        "waiting for events: poll, select, epoll, eventfd, Linux AIO",
        &[
            "select",
            "_newselect",
            "pselect6",
            "pselect6_time64",
            "poll",
            "ppoll",
            "ppoll_time64",
            "epoll_create",
            "epoll_create1",
            "epoll_ctl",
            "epoll_wait",
            "epoll_pwait",
            "epoll_pwait2",
            "eventfd",
            "eventfd2",
            "io_setup",
            "io_destroy",
            "io_getevents",
            "io_pgetevents",
            "io_pgetevents_time64",
            "io_submit",
            "io_cancel",
        ],
    ),
    (
        "sockets, in the run's own network namespace",
        &[
            "socket",
            "socketpair",
            "bind",
            "listen",
            "accept",
            "accept4",
            "connect",
            "getsockname",
            "getpeername",
            "getsockopt",
            "setsockopt",
            "sendto",
            "recvfrom",
            "send",
            "recv",
            "sendmsg",
            "recvmsg",
            "sendmmsg",
            "recvmmsg",
            "recvmmsg_time64",
            "shutdown",
            "socketcall",
        ],
    ),
    (
        "System V and POSIX IPC, in the run's own IPC namespace",
        &[
            "shmget",
            "shmat",
            "shmdt",
            "shmctl",
            "semget",
            "semop",
            "semtimedop",
            "semtimedop_time64",
            "semctl",
            "msgget",
            "msgsnd",
            "msgrcv",
            "msgctl",
            "ipc",
            "mq_open",
            "mq_unlink",
            "mq_timedsend",
            "mq_timedsend_time64",
            "mq_timedreceive",
            "mq_timedreceive_time64",
            "mq_notify",
            "mq_getsetattr",
        ],
    ),
    ("randomness", &["getrandom"]),
];

/// The calls refused with `EPERM` by name, by why. (Every call in no list
/// is refused too, with `ENOSYS`; these are named so that the refusal is
/// an explicit, tested decision.)
pub const REFUSED: &[(&str, &[&str])] = &[
    (
        "new namespaces, mounts and root changes: inside a user namespace they give a full capability set over new kernel objects",
        &[
            "unshare",
            "setns",
            "mount",
            "umount",
            "umount2",
            "pivot_root",
            "chroot",
            "move_mount",
            "open_tree",
            "fsopen",
            "fsconfig",
            "fsmount",
            "fspick",
            "mount_setattr",
        ],
    ),
    (
        "kernel keyrings, which are not namespaced",
        &["keyctl", "add_key", "request_key"],
    ),
    (
        "large kernel attack surfaces: BPF programs, perf events, io_uring, userfaultfd",
        &[
            "bpf",
            "perf_event_open",
            "io_uring_setup",
            "io_uring_enter",
            "io_uring_register",
            "userfaultfd",
        ],
    ),
    (
        "reaching into other processes",
        &[
            "ptrace",
            "process_vm_readv",
            "process_vm_writev",
            "pidfd_getfd",
            "kcmp",
        ],
    ),
    (
        "the host's own state: modules, kexec, reboot, swap, clocks, accounting, quotas, the kernel log, I/O ports, file handles",
        &[
            "init_module",
            "finit_module",
            "delete_module",
            "kexec_load",
            "kexec_file_load",
            "reboot",
            "swapon",
            "swapoff",
            "settimeofday",
            "clock_settime",
            "clock_settime64",
            "adjtimex",
            "clock_adjtime",
            "clock_adjtime64",
            "acct",
            "quotactl",
            "quotactl_fd",
            "syslog",
            "iopl",
            "ioperm",
            "open_by_handle_at",
            "name_to_handle_at",
            "fanotify_init",
            "lookup_dcookie",
            "vhangup",
            "personality",
        ],
    ),
];

/// The architectures the filter is written for: this build's, with its
/// compatibility ABIs.
fn architectures() -> Vec<Arch> {
    if cfg!(target_arch = "aarch64") {
        vec![Arch::ScmpArchAarch64, Arch::ScmpArchArm]
    } else {
        vec![Arch::ScmpArchX86_64, Arch::ScmpArchX86, Arch::ScmpArchX32]
    }
}

fn rule(names: &[&str], action: LinuxSeccompAction, errno: Option<u32>) -> LinuxSyscall {
    let mut rule = LinuxSyscall::default();
    rule.set_names(names.iter().map(|name| (*name).to_owned()).collect());
    rule.set_action(action);
    rule.set_errno_ret(errno);
    rule
}

/// The filter, for `linux.seccomp` in `config.json`; `sandbox` for runsc,
/// whose 2022 kernel applies every refusal as `EPERM` (it reads no
/// `errnoRet`): there `clone3` is allowed, since an `EPERM` for it would
/// not send libc back to `clone` (threads could not start), and the
/// namespaces it could make are gVisor's own, not the host's.
pub fn profile(sandbox: bool) -> Result<LinuxSeccomp, oci_spec::OciSpecError> {
    let mut syscalls: Vec<LinuxSyscall> = ALLOWED
        .iter()
        .map(|(_, names)| rule(names, LinuxSeccompAction::ScmpActAllow, None))
        .collect();
    // `clone` without namespace flags (threads, fork): the flags are its
    // first argument on both architectures.
    let all_namespaces = CLONE_NAMESPACES.iter().fold(0, |all, flag| all | flag);
    syscalls.push(
        LinuxSyscallBuilder::default()
            .names(vec!["clone".to_owned()])
            .action(LinuxSeccompAction::ScmpActAllow)
            .args(vec![
                LinuxSeccompArgBuilder::default()
                    .index(0usize)
                    .value(all_namespaces)
                    .value_two(0u64)
                    .op(LinuxSeccompOperator::ScmpCmpMaskedEq)
                    .build()?,
            ])
            .build()?,
    );
    for flag in CLONE_NAMESPACES {
        syscalls.push(
            LinuxSyscallBuilder::default()
                .names(vec!["clone".to_owned()])
                .action(LinuxSeccompAction::ScmpActErrno)
                .errno_ret(EPERM)
                .args(vec![
                    LinuxSeccompArgBuilder::default()
                        .index(0usize)
                        .value(flag)
                        .value_two(flag)
                        .op(LinuxSeccompOperator::ScmpCmpMaskedEq)
                        .build()?,
                ])
                .build()?,
        );
    }
    // `clone3` passes its flags in memory, where a filter cannot look:
    // "no such call" sends glibc and others back to `clone`.
    syscalls.push(if sandbox {
        rule(&["clone3"], LinuxSeccompAction::ScmpActAllow, None)
    } else {
        rule(&["clone3"], LinuxSeccompAction::ScmpActErrno, Some(ENOSYS))
    });
    syscalls.extend(
        REFUSED
            .iter()
            .map(|(_, names)| rule(names, LinuxSeccompAction::ScmpActErrno, Some(EPERM))),
    );
    LinuxSeccompBuilder::default()
        .default_action(LinuxSeccompAction::ScmpActErrno)
        .default_errno_ret(ENOSYS)
        .architectures(architectures())
        .syscalls(syscalls)
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn profile_for_sandbox() -> LinuxSeccomp {
        profile(true).expect("profile")
    }

    #[test]
    fn no_call_is_both_allowed_and_refused_and_none_is_listed_twice() {
        let mut seen = HashSet::new();
        for (_, names) in ALLOWED.iter().chain(REFUSED) {
            for name in *names {
                assert!(seen.insert(*name), "{name} is listed twice");
            }
        }
        assert!(!seen.contains("clone") && !seen.contains("clone3"));
    }

    #[test]
    fn the_profile_refuses_by_default_and_clone_only_with_namespace_flags() {
        let profile = serde_json::to_value(profile(false).expect("profile")).expect("json");
        let clone3 = |profile: &serde_json::Value| {
            profile["syscalls"]
                .as_array()
                .expect("rules")
                .iter()
                .find(|rule| rule["names"] == serde_json::json!(["clone3"]))
                .expect("clone3")["action"]
                .clone()
        };
        assert_eq!(clone3(&profile), "SCMP_ACT_ERRNO");
        let sandbox = serde_json::to_value(profile_for_sandbox()).expect("json");
        assert_eq!(clone3(&sandbox), "SCMP_ACT_ALLOW");
        assert_eq!(profile["defaultAction"], "SCMP_ACT_ERRNO");
        assert_eq!(profile["defaultErrnoRet"], ENOSYS);
        let rules = profile["syscalls"].as_array().expect("rules");
        let clone: Vec<&serde_json::Value> = rules
            .iter()
            .filter(|rule| rule["names"] == serde_json::json!(["clone"]))
            .collect();
        assert_eq!(clone.len(), 1 + CLONE_NAMESPACES.len());
        assert_eq!(clone[0]["action"], "SCMP_ACT_ALLOW");
        assert_eq!(clone[0]["args"][0]["value"], 0x7e02_0000u64);
        assert_eq!(clone[0]["args"][0]["valueTwo"], 0);
        assert_eq!(clone[0]["args"][0]["op"], "SCMP_CMP_MASKED_EQ");
        let refused = |name: &str| {
            rules.iter().any(|rule| {
                rule["action"] == "SCMP_ACT_ERRNO"
                    && rule["errnoRet"] == EPERM
                    && rule["names"]
                        .as_array()
                        .is_some_and(|names| names.iter().any(|n| n == name))
            })
        };
        for name in [
            "unshare",
            "mount",
            "keyctl",
            "io_uring_setup",
            "perf_event_open",
        ] {
            assert!(refused(name), "{name}");
        }
    }
}
