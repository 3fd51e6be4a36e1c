//! The figures of `runloop serve` under load: what closing notes quote,
//! each a load that takes minutes or the whole machine, and so not a test.
//!
//! ```sh
//! cargo bench -p runloop-cli --bench figures              # every figure
//! cargo bench -p runloop-cli --bench figures -- admission # those whose name has it
//! ```
//!
//! Each prints its figures and checks its bar (it panics on a miss). The
//! loads are the testkit's (`runloop_testkit::loads`), which the `it`
//! tests run at a size every run can afford; `cargo test` builds this
//! bench and lists the figures without running them.

mod admission;
mod budget;
mod exec;
mod memory;
mod walls;

fn main() {
    runloop_testkit::run_figures(&[
        (
            "admission::a_thousand_floods_before_authorization",
            admission::a_thousand_floods_before_authorization,
        ),
        (
            "admission::slowloris_from_one_address",
            admission::slowloris_from_one_address,
        ),
        (
            "admission::one_token_24_connections_of_256_runs",
            admission::one_token_24_connections_of_256_runs,
        ),
        (
            "budget::exec_runs_at_the_default_budget",
            budget::exec_runs_at_the_default_budget,
        ),
        (
            "exec::cpu_weights_while_alice_spins",
            exec::cpu_weights_while_alice_spins,
        ),
        (
            "memory::a_large_prompt_of_short_words_keeps_the_server_small",
            memory::a_large_prompt_of_short_words_keeps_the_server_small,
        ),
        (
            "memory::memory_goes_back_after_waves_of_large_messages",
            memory::memory_goes_back_after_waves_of_large_messages,
        ),
        (
            "walls::half_sent_256_connections_of_16_mib",
            walls::half_sent_256_connections_of_16_mib,
        ),
        (
            "walls::pre_authorization_flood_from_five_addresses",
            walls::pre_authorization_flood_from_five_addresses,
        ),
        (
            "walls::slowloris_128_from_one_address",
            walls::slowloris_128_from_one_address,
        ),
        (
            "walls::slow_tls_handshakes_from_five_addresses",
            walls::slow_tls_handshakes_from_five_addresses,
        ),
        (
            "walls::credential_guesses_from_one_address",
            walls::credential_guesses_from_one_address,
        ),
    ]);
}
