//! One line from an error and every cause under it.
//!
//! Typed errors here keep their cause as a `source` rather than pasting it into their own
//! message, so `anyhow`'s `{:#}` at the binary's edge prints each cause once. Where an error
//! ends as one line instead (a log field, `/readyz`, an admin API answer), this renders the
//! same chain.

use std::error::Error;

/// `err`, then each of its causes, joined by `: ` (a cause whose text the line already ends
/// with is not repeated).
pub fn chain(err: &(dyn Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(err) = cause {
        let line = err.to_string();
        if !text.ends_with(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        cause = err.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read the file")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn causes_follow_the_message_once() {
        let err = Outer(std::io::Error::other("disk on fire"));
        assert_eq!(chain(&err), "cannot read the file: disk on fire");
    }
}
