//! Causes that cross a port: an adapter's error kept as a typed source (so its chain, down to
//! an errno or a path, stays walkable), and the one formatter that writes a chain as a line
//! for logs, claim conditions and Events.

use std::error::Error;
use std::fmt;
use std::sync::Arc;

/// An adapter's error behind a port. `Arc` so the errors that carry it can be cloned (one
/// failed read answers every claim that waited on it).
pub type Cause = Arc<dyn Error + Send + Sync + 'static>;

/// Wraps any error as a [`Cause`].
pub fn cause(err: impl Error + Send + Sync + 'static) -> Cause {
    Arc::new(err)
}

/// Displays an error followed by each cause its message does not already contain, joined
/// with `": "` (the errno of a kernel refusal sits at the bottom of the chain; thiserror
/// messages often embed their source already, which must not be printed twice).
pub struct Chain<'a>(pub &'a (dyn Error + 'a));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = self.0.to_string();
        let mut source = self.0.source();
        while let Some(cause) = source {
            let line = cause.to_string();
            if !text.contains(&line) {
                text.push_str(": ");
                text.push_str(&line);
            }
            source = cause.source();
        }
        f.write_str(&text)
    }
}

/// [`Chain`] as a `String`.
#[must_use]
pub fn chain(err: &(dyn Error + '_)) -> String {
    Chain(err).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer: {0}")]
    struct Embeds(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("step failed")]
    struct Hides(#[source] std::io::Error);

    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let err = Embeds(std::io::Error::from_raw_os_error(17));
        assert_eq!(chain(&err), err.to_string());
    }

    #[test]
    fn a_cause_missing_from_the_message_is_appended() {
        let err = Hides(std::io::Error::from_raw_os_error(17));
        let text = chain(&err);
        assert!(text.starts_with("step failed: "), "{text}");
        assert!(text.contains("os error 17"), "{text}");
    }

    #[test]
    fn a_cause_keeps_its_source_chain() {
        let wrapped = cause(Hides(std::io::Error::from_raw_os_error(2)));
        let source = wrapped.source().map(ToString::to_string).unwrap_or_default();
        assert!(source.contains("os error 2"), "{source}");
    }
}
