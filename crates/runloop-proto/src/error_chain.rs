//! An error and its causes as one line: `top: cause: cause`.
//!
//! Every error of this project says one thing in its `Display`: what failed
//! at its own layer. Why it failed is the next error down, reached through
//! [`Error::source`], which says its own layer's sentence in turn. So an
//! error's `Display` alone is the headline, and a person is told the whole
//! story by walking the chain: [`Chain`] is that walk, written once for the
//! command line, the Python package, logs, and the messages a server puts in
//! an error value or a close reason.
//!
//! Each link is said once. Some errors from other crates still print their
//! cause in their own words and return it as their source too (a
//! tungstenite `IO error: …` over the `io::Error` it wraps); a link whose
//! words are already in the line is left out, so those read once as well.

use std::error::Error;
use std::fmt;

/// An error and its sources, joined with `: `, each link said once:
/// `cannot connect to ws://127.0.0.1:1: Connection refused (os error 111)`.
///
/// ```
/// use runloop_proto::error_chain::Chain;
/// # #[derive(Debug)] struct Top(std::io::Error);
/// # impl std::fmt::Display for Top {
/// #     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
/// #         f.write_str("cannot read the capture")
/// #     }
/// # }
/// # impl std::error::Error for Top {
/// #     fn source(&self) -> Option<&(dyn std::error::Error + 'static)> { Some(&self.0) }
/// # }
/// let error = Top(std::io::Error::other("no such file"));
/// assert_eq!(error.to_string(), "cannot read the capture");
/// assert_eq!(Chain(&error).to_string(), "cannot read the capture: no such file");
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Chain<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut said = self.0.to_string();
        let mut next = self.0.source();
        while let Some(cause) = next {
            let words = cause.to_string();
            if !words.is_empty() && !said.contains(&words) {
                said.push_str(": ");
                said.push_str(&words);
            }
            next = cause.source();
        }
        f.write_str(&said)
    }
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        #[error("cannot start the run")]
        Start(#[source] Middle),
        #[error("the run failed: {0}")]
        Doubled(#[source] io::Error),
    }

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read the image")]
    struct Middle(#[source] io::Error);

    #[test]
    fn every_link_is_said_once_in_order() {
        let error = Outer::Start(Middle(io::Error::other("disk full")));
        assert_eq!(error.to_string(), "cannot start the run");
        assert_eq!(
            Chain(&error).to_string(),
            "cannot start the run: cannot read the image: disk full"
        );
    }

    #[test]
    fn a_cause_already_in_the_words_is_not_said_again() {
        let error = Outer::Doubled(io::Error::other("disk full"));
        assert_eq!(Chain(&error).to_string(), "the run failed: disk full");
    }

    #[test]
    fn an_error_without_a_source_is_its_own_words() {
        let error = io::Error::other("disk full");
        assert_eq!(Chain(&error).to_string(), "disk full");
    }
}
