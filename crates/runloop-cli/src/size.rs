//! Sizes on the command line and in the configuration file: a byte count
//! with an optional K, M or G suffix, parsed one way for every option that
//! takes one (`serve`'s limits, `run --memory`, `bench`'s mixes).

/// A byte count with an optional K, M or G suffix.
pub fn bytes(text: &str) -> Result<u64, String> {
    runloop_bench::parse_bytes(text)
        .ok_or_else(|| format!("{text:?} is not a byte count (e.g. 512K, 16M, 1G)"))
}
