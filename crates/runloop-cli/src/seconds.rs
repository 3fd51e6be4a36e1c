//! Durations on the command line: read as seconds, shown as seconds.
//!
//! Every time limit of the command (`check --timeout`, `run`'s three
//! timeouts, `serve --startup-timeout`) is written and reported the same
//! way, so a message that names a limit shows it as it was given: `10 s`,
//! `0.25 s`.

use std::time::Duration;

/// Reads seconds, whole or decimal, optionally followed by `s`; more than
/// zero (a clap value parser).
pub fn parse(text: &str) -> Result<Duration, String> {
    let number = text.strip_suffix('s').unwrap_or(text).trim();
    let seconds: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if seconds <= 0.0 {
        return Err("the timeout must be more than zero seconds".to_owned());
    }
    Duration::try_from_secs_f64(seconds).map_err(|error| format!("{text:?}: {error}"))
}

/// A duration in words: `10 s`, `0.25 s`.
pub fn show(duration: Duration) -> String {
    format!("{} s", value(duration))
}

/// A duration as an option's value: `10`, `0.25`.
pub fn value(duration: Duration) -> String {
    duration.as_secs_f64().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_positive_seconds() {
        assert_eq!(parse("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse("0.5s"), Ok(Duration::from_millis(500)));
        for bad in ["0", "-1", "ten", "NaN", "inf", ""] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert_eq!(show(Duration::from_millis(250)), "0.25 s");
        assert_eq!(show(Duration::from_secs(10)), "10 s");
        assert_eq!(value(Duration::from_millis(1500)), "1.5");
    }
}
