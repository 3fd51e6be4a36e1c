//! The error convention, checked: an error's `Display` is its own layer's
//! sentence, and its cause comes only through `source()`.
//!
//! A chain printer (`runloop_proto::error_chain::Chain`, anyhow, Python's
//! `__cause__`) says every link of a chain; an error that also put its
//! cause in its own words would be said twice. Each crate's tests walk a
//! list of its errors, one of every kind with a cause, through
//! [`assert_cause_said_once`].

use std::error::Error;

/// Fails when `error`'s own words contain the words of its source.
pub fn assert_cause_said_once(error: &(dyn Error + 'static)) {
    let words = error.to_string();
    assert!(!words.is_empty(), "an error says something: {error:?}");
    if let Some(cause) = error.source() {
        let cause = cause.to_string();
        assert!(
            cause.is_empty() || !words.contains(&cause),
            "{words:?} says its cause {cause:?}, which its source() also gives"
        );
    }
}

/// Checks one error with a cause: its own words are `own`, its source's
/// are `cause`, and it does not say its cause again.
pub fn assert_own_words_and_cause(error: &(dyn Error + 'static), own: &str, cause: &str) {
    assert_eq!(error.to_string(), own, "{error:?}");
    let source = error.source().expect("a source");
    assert_eq!(source.to_string(), cause, "{error:?}");
    assert_cause_said_once(error);
}

#[cfg(test)]
mod tests {
    use std::fmt;
    use std::io;

    use super::*;

    #[derive(Debug)]
    struct Failed {
        doubled: bool,
        cause: io::Error,
    }

    impl fmt::Display for Failed {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("cannot read the file")?;
            if self.doubled {
                write!(f, ": {}", self.cause)?;
            }
            Ok(())
        }
    }

    impl Error for Failed {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.cause)
        }
    }

    #[test]
    fn an_error_that_leaves_its_cause_to_source_passes() {
        assert_cause_said_once(&Failed {
            doubled: false,
            cause: io::Error::other("no such file"),
        });
        assert_cause_said_once(&io::Error::other("no such file"));
    }

    #[test]
    #[should_panic(expected = "which its source() also gives")]
    fn an_error_that_says_its_cause_twice_fails() {
        assert_cause_said_once(&Failed {
            doubled: true,
            cause: io::Error::other("no such file"),
        });
    }
}
