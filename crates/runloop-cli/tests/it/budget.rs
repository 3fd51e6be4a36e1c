//! `runloop serve` and its run budget (issue 13, rows 8 and 11): a run's
//! `memory` and `disk` over the per-run maximum, a run past `--max-runs`,
//! past `--max-runs-per-identity`, or past the memory budget, each refused
//! with an error response that names the limit and its value, while the
//! runs within them are served; and a loop past `--max-loops-per-identity`,
//! refused as a loop that did not run, with an error naming the limit.
//!
//! Row 8 as a load (one connection asking for 256 runs of an `exec` agent
//! at the default budget; the processes and memory they take) is
//! a figure of `benches/figures/`:
//! `cargo bench -p runloop-cli --bench figures -- budget`.

use runloop::client::Client;
use runloop::proto::run_loop::Outcome;
use runloop_testkit::command::{Serve, request};
use runloop_testkit::loads::{MIB, cgroups, exec_runs, held_loops, loop_refusal, refusal, runtime};

#[test]
fn a_run_over_the_largest_memory_or_disk_is_refused_naming_the_limit() {
    let server = Serve::start("error", &["--max-run-disk", "1G", "--memory-budget", "8G"]);
    runtime().block_on(async {
        let client = Client::connect(&server.url, "").await.expect("connects");
        for memory in [1 << 63, u64::MAX, (4 << 30) + 1] {
            let why = refusal(client.start(request("demo", memory, 0)).await);
            assert_eq!(
                why,
                format!(
                    "memory {memory} is over this server's largest run memory \
                     (max_run_memory 4294967296 bytes)"
                )
            );
        }
        let why = refusal(client.start(request("demo", MIB, (1 << 30) + 1)).await);
        assert_eq!(
            why,
            "disk 1073741825 is over this server's largest run disk (max_run_disk 1073741824 bytes)"
        );
        // At the maximums, the run is served.
        let run = client
            .start(request("demo", 4 << 30, 1 << 30))
            .await
            .expect("a run at the maximums starts");
        run.stop().await;
        client.close().await;
    });
}

#[test]
fn runs_past_max_runs_or_the_memory_budget_are_refused_and_their_places_come_back() {
    let server = Serve::start("error", &["--max-runs", "4", "--memory-budget", "1G"]);
    runtime().block_on(async {
        let client = Client::connect(&server.url, "").await.expect("connects");
        let mut runs = Vec::new();
        for _ in 0..4 {
            runs.push(
                client
                    .start(request("demo", 256 * MIB, 0))
                    .await
                    .expect("within the limits"),
            );
        }
        let why = refusal(client.start(request("demo", MIB, 0)).await);
        assert_eq!(
            why,
            "this server holds as many runs as it may (max_runs 4); try again later"
        );
        runs.pop().expect("a run").stop().await;
        let why = refusal(client.start(request("demo", 512 * MIB, 0)).await);
        assert_eq!(
            why,
            "memory 536870912 does not fit this server's memory budget: runs hold 805306368 of \
             memory_budget 1073741824 bytes; try again later"
        );
        // The stopped run's place and memory are back.
        runs.push(
            client
                .start(request("demo", 256 * MIB, 0))
                .await
                .expect("its place is back"),
        );
        for run in runs {
            run.stop().await;
        }
        client.close().await;
    });
}

/// `runloop serve` with the tokens `alice` and `bob`, and `limits`.
fn alice_and_bob(limits: &[&str]) -> Serve {
    let tokens = ["--token", "alice", "--token", "bob"];
    Serve::start("error", &[&tokens[..], limits].concat())
}

#[test]
fn one_token_cannot_hold_every_run() {
    let server = alice_and_bob(&["--max-runs", "4", "--max-runs-per-identity", "2"]);
    runtime().block_on(async {
        let alice = Client::connect(&server.url, "alice")
            .await
            .expect("connects");
        let bob = Client::connect(&server.url, "bob").await.expect("connects");
        let mut runs = Vec::new();
        for _ in 0..2 {
            runs.push(alice.start(request("demo", MIB, 0)).await.expect("alice's"));
        }
        let why = refusal(alice.start(request("demo", MIB, 0)).await);
        assert_eq!(
            why,
            "tenant token #1 holds as many runs as it may (max-runs 2); try again later"
        );
        // A second connection of the same token is the same identity.
        let alice_again = Client::connect(&server.url, "alice")
            .await
            .expect("connects");
        refusal(alice_again.start(request("demo", MIB, 0)).await);
        let bobs = bob
            .start(request("demo", MIB, 0))
            .await
            .expect("bob is still served");
        bobs.stop().await;
        for run in runs {
            run.stop().await;
        }
    });
}

#[test]
fn one_token_cannot_hold_every_loop() {
    let server = alice_and_bob(&["--max-loops-per-identity", "2"]);
    runtime().block_on(async {
        let alice = Client::connect(&server.url, "alice")
            .await
            .expect("connects");
        let mut runs = Vec::new();
        for _ in 0..3 {
            runs.push(alice.start(request("demo", MIB, 0)).await.expect("alice's"));
        }
        // Two loops of two runs, each a few seconds long; a chunk of each
        // shows that the server relays them.
        let held = held_loops(&runs[..2], "held demo:pace=250").await;
        let refused =
            "tenant token #1 holds as many loops as it may (max-loops 2); try again later";
        // A third, on the third run: no loop ran, and the error says why.
        assert_eq!(loop_refusal(&runs[2], "a third").await, refused);
        // A second connection of the same token is the same identity.
        let alice_again = Client::connect(&server.url, "alice")
            .await
            .expect("connects");
        let again = alice_again
            .start(request("demo", MIB, 0))
            .await
            .expect("a run within the runs' limits");
        let outcome = again.run_loop("again").outcome().await;
        assert_eq!(
            outcome.error().map(|error| error.0["error"].clone()),
            Some(refused.into()),
            "{outcome:?}"
        );
        // Another token is served meanwhile.
        let bob = Client::connect(&server.url, "bob").await.expect("connects");
        let bobs = bob.start(request("demo", MIB, 0)).await.expect("bob's");
        let outcome = bobs.run_loop("bob's loop").outcome().await;
        assert!(matches!(outcome, Outcome::Finished { .. }), "{outcome:?}");
        // Alice's loops were not disturbed; once one has ended, her next
        // loop is served.
        let mut held = held.into_iter();
        let (_, outcome) = held.next().expect("a loop").collect_chunks().await;
        assert!(matches!(outcome, Outcome::Finished { .. }), "{outcome:?}");
        let outcome = runs[2].run_loop("after one ended").outcome().await;
        assert!(matches!(outcome, Outcome::Finished { .. }), "{outcome:?}");
        let (_, outcome) = held.next().expect("a loop").collect_chunks().await;
        assert!(matches!(outcome, Outcome::Finished { .. }), "{outcome:?}");
        for run in runs.iter().chain([&again, &bobs]) {
            run.stop().await;
        }
    });
}

#[test]
fn exec_runs_past_the_memory_budget_are_refused() {
    if !cgroups() {
        return;
    }
    let (served, refused, _) = exec_runs(&["--memory-budget", "1G"], 8);
    assert_eq!(served, 4, "{refused:?}");
    assert_eq!(refused.len(), 4);
    for why in refused {
        assert!(
            why.starts_with("memory 268435456 does not fit this server's memory budget")
                && why.contains("memory_budget 1073741824 bytes"),
            "{why}"
        );
    }
}
