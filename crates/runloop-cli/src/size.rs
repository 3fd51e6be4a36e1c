//! Sizes on the command line and in the configuration file: a byte count
//! with an optional K, M or G suffix, parsed one way for every option that
//! takes one (`serve`'s limits, `run --memory`, `bench`'s mixes).

/// A byte count with an optional K, M or G suffix.
pub fn bytes(text: &str) -> Result<u64, String> {
    runloop_bench::parse_bytes(text)
        .ok_or_else(|| format!("{text:?} is not a byte count (e.g. 512K, 16M, 1G)"))
}

/// A clap value parser of [`bytes`] of at most `max` (written as a size
/// is): a limit's sane bound, refused where it is given.
pub fn at_most(
    max: &'static str,
) -> impl Fn(&str) -> Result<u64, String> + Clone + Send + Sync + 'static {
    move |text: &str| {
        let value = bytes(text)?;
        match bytes(max) {
            Ok(most) if value > most => {
                Err(format!("{text:?} is more than the most it may be, {max}"))
            }
            _ => Ok(value),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_size_past_its_maximum_is_refused() {
        let size = at_most("1G");
        assert_eq!(size("1G"), Ok(1 << 30));
        assert_eq!(
            size("1025M"),
            Err("\"1025M\" is more than the most it may be, 1G".to_owned())
        );
        assert!(size("lots").is_err());
    }
}
