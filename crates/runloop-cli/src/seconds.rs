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

/// Reads a duration of a server's configuration, the one syntax of every
/// duration `serve` takes: a number followed by `ms`, `s`, `m` or `h`, or
/// a bare number of seconds (`30s`, `2m`, `0.5`); zero or more (a clap
/// value parser: a limit's minimum is checked where the limit is, so that
/// its refusal names the minimum).
pub fn duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = if let Some(n) = text.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = text.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (text, 1.0)
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (e.g. 30s, 2m, 500ms, or seconds)"))?;
    if value.is_nan() || value < 0.0 {
        return Err(format!("{text:?}: a duration is not negative"));
    }
    Duration::try_from_secs_f64(value * unit).map_err(|error| format!("{text:?}: {error}"))
}

/// A [`duration`] of more than zero (a clap value parser), for a timeout
/// that has no minimum of its own.
pub fn positive_duration(text: &str) -> Result<Duration, String> {
    match duration(text)? {
        Duration::ZERO => Err("the timeout must be more than zero".to_owned()),
        positive => Ok(positive),
    }
}

/// A clap value parser of a [`duration`] (or a [`positive_duration`]
/// when `positive`) of at most `max` (written as a duration is): a
/// limit's sane bound, so that `"999999h"` is refused where it is given
/// instead of held as a deadline that never comes.
pub fn at_most(
    max: &'static str,
    positive: bool,
) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    move |text: &str| {
        let value = if positive {
            positive_duration(text)?
        } else {
            duration(text)?
        };
        match duration(max) {
            Ok(most) if value > most => {
                Err(format!("{text:?} is more than the most it may be, {max}"))
            }
            _ => Ok(value),
        }
    }
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

    #[test]
    fn durations_have_one_syntax() {
        assert_eq!(duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(duration("0"), Ok(Duration::ZERO));
        for bad in ["-1s", "ten", "NaN", "inf", "", "5d", "s"] {
            assert!(duration(bad).is_err(), "{bad}");
        }
        assert!(positive_duration("0s").is_err());
        assert_eq!(positive_duration("2m"), Ok(Duration::from_secs(120)));
    }

    #[test]
    fn a_duration_past_its_maximum_is_refused() {
        let grace = at_most("10m", false);
        assert_eq!(grace("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(grace("0"), Ok(Duration::ZERO));
        assert_eq!(
            grace("999999h"),
            Err("\"999999h\" is more than the most it may be, 10m".to_owned())
        );
        assert!(at_most("1h", true)("0s").is_err());
    }
}
