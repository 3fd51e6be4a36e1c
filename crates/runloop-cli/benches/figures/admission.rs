//! The connections `runloop serve` takes on (issue 13, rows 3–7), at full
//! size.

use runloop_testkit::loads::{
    MIB, one_token_floods_runs, pre_authorization_flood, served_during_slowloris,
};

/// 1024 connections × 15 MiB before authorizing.
pub fn a_thousand_floods_before_authorization() {
    for (what, args) in [
        ("defaults", &[][..]),
        (
            "--max-connections-per-address 1024",
            &["--max-connections-per-address", "1024"][..],
        ),
    ] {
        let (baseline, peak) = pre_authorization_flood(args, 1024);
        println!(
            "row 3 ({what}): 1024 connections × 15 MiB before authorizing: baseline {} MiB, \
             peak {} MiB, growth {} MiB",
            baseline / MIB,
            peak / MIB,
            (peak - baseline) / MIB
        );
        assert!(peak < baseline + 64 * MIB);
    }
}

/// 1024 slowloris sockets from one address, 50 tries.
pub fn slowloris_from_one_address() {
    let (ok, tries, connects) = served_during_slowloris(1024, 50);
    println!(
        "row 4: 1024 slowloris sockets from 127.0.0.2: callers from 127.0.0.1 served {ok} of {tries} tries; the attacker made {connects} connects"
    );
    assert!(ok * 10 >= tries * 9);
}

pub fn one_token_24_connections_of_256_runs() {
    let (ok, refused, held, other) = one_token_floods_runs(24, 256);
    println!(
        "row 7: one token, 24 connections × 256 demo runs at once: {ok} served, {refused} \
         refused, {held} server descriptors at the height; another token served: {other}"
    );
    assert!(other);
}
