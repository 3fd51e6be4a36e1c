//! The syscall filter made once ([`runloop_oci::filter`]): what the init
//! installs is, byte for byte, the program runc compiles from the profile,
//! as the kernel runs it.

use std::os::unix::fs::PermissionsExt;

use runloop_oci::filter::{self, Maker};
use runloop_oci::{Host, HostConfig};

#[tokio::test]
async fn the_filter_the_init_installs_is_the_one_runc_compiles() {
    if !runloop_testkit::needs(&[
        runloop_testkit::Part::Root,
        runloop_testkit::Part::program("runc", "runc"),
        runloop_testkit::Part::program("mkfs.ext4", "e2fsprogs"),
    ]) {
        return;
    }
    let scratch = tempfile::tempdir().expect("temp");
    // The containers' ids reach the store through it.
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755))
        .expect("permissions");
    let host = Host::open(HostConfig::new(scratch.path().join("store")))
        .await
        .expect("a container host");
    let prepared = host
        .filter()
        .expect("the host read the filter back when it opened")
        .clone();
    assert!(prepared.instructions() > 100, "{}", prepared.instructions());
    let runs = host.store().runs();
    let maker = Maker {
        runc: host.runc(),
        cgroups: host.cgroups(),
        runs: &runs,
        init: host.init().expect("the init"),
    };
    // A container given it the init's way runs exactly it…
    let installed = filter::read_back(maker, Some(&prepared))
        .await
        .expect("the init's");
    same(&installed, &prepared);
    // …and it decides every call as the program runc compiles from the
    // profile at a start does (runc lays its program out differently
    // from one compilation to the next, so the decisions are compared).
    let compiled = filter::read_back(maker, None).await.expect("runc's");
    for (arch, nr, args) in calls() {
        assert_eq!(
            decide(&prepared, arch, nr, &args),
            decide(&compiled, arch, nr, &args),
            "arch {arch:#x}, call {nr:#x}, args {args:?}"
        );
    }
    // The profile's refusals hold: io_uring_setup is refused with EPERM,
    // clone with a namespace flag too, a call not listed is ENOSYS.
    const X86_64: u32 = 0xC000_003E;
    const ERRNO: u32 = 0x0005_0000;
    assert_eq!(decide(&prepared, X86_64, 425, &[0; 6]), ERRNO | 1);
    assert_eq!(
        decide(&prepared, X86_64, 56, &[0x1000_0000, 0, 0, 0, 0, 0]),
        ERRNO | 1
    );
    assert_eq!(
        decide(&prepared, X86_64, 56, &[0x11, 0, 0, 0, 0, 0]),
        0x7fff_0000
    );
    assert_eq!(decide(&prepared, X86_64, 1000, &[0; 6]), ERRNO | 38);
    host.close().await;
    assert_eq!(
        std::fs::read_dir(&runs).expect("runs").count(),
        0,
        "nothing of the filter's containers is left"
    );
}

/// Asserts two read-back filters are the same program, saying where they
/// differ when not (the programs are thousands of instructions long).
fn same(got: &filter::Prepared, want: &filter::Prepared) {
    let lengths = |p: &filter::Prepared| p.filters().iter().map(Vec::len).collect::<Vec<_>>();
    assert_eq!(lengths(got), lengths(want), "the filters' lengths, bytes");
    for (index, (got, want)) in got.filters().iter().zip(want.filters()).enumerate() {
        let first = got.iter().zip(want).position(|(a, b)| a != b);
        assert_eq!(first, None, "filter {index} differs from byte {first:?} on");
    }
}

/// The calls the two programs are compared on: every call number of
/// x86-64, x32 and i386 up to past the last there is, with no arguments,
/// and `clone` with each namespace flag and with a fork's.
fn calls() -> Vec<(u32, u32, [u64; 6])> {
    const X86_64: u32 = 0xC000_003E;
    const I386: u32 = 0x4000_0003;
    const X32: u32 = 0x4000_0000;
    let mut calls = Vec::new();
    for nr in 0..1024u32 {
        calls.push((X86_64, nr, [0; 6]));
        calls.push((X86_64, X32 | nr, [0; 6]));
        calls.push((I386, nr, [0; 6]));
    }
    for flags in runloop_oci::seccomp::CLONE_NAMESPACES
        .into_iter()
        .chain([0x11, 0x3d0f00])
    {
        for (arch, nr) in [(X86_64, 56), (X86_64, X32 | 56), (I386, 120)] {
            calls.push((arch, nr, [flags, 0, 0, 0, 0, 0]));
        }
    }
    calls
}

/// What a seccomp filter returns for a call: the classic BPF programs
/// libseccomp and runc write (loads of `struct seccomp_data`, the memory
/// words, jumps on constants and on X, AND, returns), run on it.
fn decide(prepared: &filter::Prepared, arch: u32, nr: u32, args: &[u64; 6]) -> u32 {
    let mut data = [0u8; 64];
    data[0..4].copy_from_slice(&nr.to_ne_bytes());
    data[4..8].copy_from_slice(&arch.to_ne_bytes());
    for (at, arg) in args.iter().enumerate() {
        data[16 + at * 8..24 + at * 8].copy_from_slice(&arg.to_ne_bytes());
    }
    // The kernel runs every filter and keeps the most restrictive answer
    // (the lowest action); these programs are one filter each.
    prepared
        .filters()
        .iter()
        .map(|program| run(program, &data))
        .min_by_key(|action| action & 0xffff_0000)
        .expect("a filter")
}

fn run(program: &[u8], data: &[u8; 64]) -> u32 {
    let at = |pc: usize| {
        let i = &program[pc * 8..pc * 8 + 8];
        (
            u16::from_ne_bytes([i[0], i[1]]),
            i[2] as usize,
            i[3] as usize,
            u32::from_ne_bytes([i[4], i[5], i[6], i[7]]),
        )
    };
    let (mut a, mut x, mut memory, mut pc) = (0u32, 0u32, [0u32; 16], 0usize);
    loop {
        let (code, jt, jf, k) = at(pc);
        pc += 1;
        let jump = |taken: bool| if taken { jt } else { jf };
        match code {
            0x20 => {
                let k = k as usize;
                a = u32::from_ne_bytes([data[k], data[k + 1], data[k + 2], data[k + 3]]);
            }
            0x00 => a = k,
            0x01 => x = k,
            0x60 => a = memory[k as usize],
            0x61 => x = memory[k as usize],
            0x02 => memory[k as usize] = a,
            0x03 => memory[k as usize] = x,
            0x07 => x = a,
            0x87 => a = x,
            0x54 => a &= k,
            0x5c => a &= x,
            0x44 => a |= k,
            0x05 => pc += k as usize,
            0x15 => pc += jump(a == k),
            0x25 => pc += jump(a > k),
            0x35 => pc += jump(a >= k),
            0x45 => pc += jump(a & k != 0),
            0x1d => pc += jump(a == x),
            0x2d => pc += jump(a > x),
            0x3d => pc += jump(a >= x),
            0x06 => return k,
            0x16 => return a,
            other => panic!("an instruction this reader does not know: {other:#x}"),
        }
    }
}
