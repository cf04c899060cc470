//! One line from an error and every cause under it.
//!
//! Typed errors here keep their cause as a `source` rather than pasting it into their own
//! message, so `anyhow`'s `{:#}` at the binary's edge prints each cause once. Where an error
//! ends as one line instead (a log field, `/readyz`, an admin API answer), this renders the
//! same chain.

use std::error::Error;

/// `err`, then each of its causes, joined by `: ` (a cause whose text the line already ends
/// with is not repeated: some libraries' errors print their source in their own message).
pub fn chain<'a>(err: &'a (dyn Error + 'static)) -> String {
    join(std::iter::successors(
        Some(err),
        |e: &&'a (dyn Error + 'static)| (*e).source(),
    ))
}

/// An error and its causes, outermost first (as `anyhow::Error::chain` yields them), as one
/// line; see [`chain`].
pub fn join<'a>(errors: impl IntoIterator<Item = &'a (dyn Error + 'static)>) -> String {
    let mut text = String::new();
    for err in errors {
        let line = err.to_string();
        if text.ends_with(&line) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&line);
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
