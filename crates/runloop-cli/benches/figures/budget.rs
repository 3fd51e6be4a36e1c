//! The run budget (issue 13, row 8), at full size.

use runloop_testkit::loads::{cgroups, exec_runs};

/// One connection, 256 exec runs of 256 MiB, default limits.
pub fn exec_runs_at_the_default_budget() {
    if !cgroups() {
        return;
    }
    let (served, refused, processes) = exec_runs(&[], 256);
    let budget: std::collections::BTreeSet<_> = refused
        .iter()
        .map(|why| why.split(':').next().unwrap_or_default().to_owned())
        .collect();
    println!(
        "row 8: 256 exec runs of 256 MiB asked on one connection: {served} served, {} refused \
         ({budget:?}), {processes} processes under the server, {} MiB claimed",
        refused.len(),
        served as u64 * 256
    );
    assert_eq!(served + refused.len(), 256);
    assert!(!refused.is_empty(), "nothing past the budget was refused");
}
