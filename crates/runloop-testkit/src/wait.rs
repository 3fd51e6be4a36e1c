//! Waits with a bound that only a hung test reaches: a safety net, never
//! an assertion about speed.

use std::time::Duration;

/// How long a wait may last before the test fails as hung.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// Waits until `check` holds, polling; a safety net, not a timing assertion.
pub async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let wait = async {
        while !check() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(PATIENCE, wait)
        .await
        .unwrap_or_else(|_| panic!("never: {what}"));
}
