//! Ordered keys: where an entry's key is, how many entries of one key may be handled at once,
//! and what a dead-lettered head does to the entries behind it.
//!
//! Entries with one key are handled in stream order, across every host of the group and
//! across retries (a parked retry holds its key's turn until it settles); entries of other
//! keys never wait for them. The host keeps the turns and the entries that wait in Redis.

/// The longest key the host orders by when the descriptor does not say: a longer one is
/// handled unordered (and counted), never stuck.
pub const DEFAULT_MAX_KEY_BYTES: usize = 256;
/// The most a descriptor may set `max_key_bytes` to.
pub const MAX_KEY_BYTES: usize = 4096;
/// The most entries of one key a descriptor may let run at once.
pub const MAX_IN_FLIGHT_PER_KEY: u32 = 1024;

/// Where an entry's ordering key is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrderKey {
    /// The value of this stream field, as bytes.
    Field(String),
    /// The value at this JSON pointer (RFC 6901, e.g. `/account/id`) in the payload field: a
    /// string as its text, any other value as its JSON.
    Payload(String),
}

impl OrderKey {
    /// What is wrong with this key's place, for the setting `what` (`ordered_by`, `dedupe`):
    /// a name over the bounds is an error of its own, another problem a sentence.
    pub fn problem(&self, what: &str) -> Result<Option<String>, crate::DescriptorError> {
        match self {
            OrderKey::Field(name) => {
                crate::check_name(
                    if what == "dedupe" {
                        "dedupe field"
                    } else {
                        "ordered_by field"
                    },
                    name,
                )?;
                if name.trim().is_empty() {
                    return Ok(Some("the key's field name is empty".into()));
                }
                if name.starts_with("sluice-") {
                    return Ok(Some(format!(
                        "the key's field `{name}` is named like the host's own bookkeeping (`sluice-*`)"
                    )));
                }
            }
            OrderKey::Payload(pointer) => {
                crate::check_name(
                    if what == "dedupe" {
                        "dedupe payload pointer"
                    } else {
                        "ordered_by payload pointer"
                    },
                    pointer,
                )?;
                if !pointer.starts_with('/') {
                    return Ok(Some(format!(
                        "the payload pointer `{pointer}` must start with `/` (a JSON pointer, e.g. `/account`)"
                    )));
                }
                let bad_escape = pointer
                    .match_indices('~')
                    .any(|(i, _)| !matches!(pointer.as_bytes().get(i + 1), Some(b'0' | b'1')));
                if bad_escape {
                    return Ok(Some(format!(
                        "the payload pointer `{pointer}` has a `~` that is not `~0` (a `~`) or `~1` (a `/`)"
                    )));
                }
            }
        }
        Ok(None)
    }

    /// How `sluice check` and the logs say where the key is.
    pub fn describe(&self) -> String {
        match self {
            OrderKey::Field(name) => format!("field `{name}`"),
            OrderKey::Payload(pointer) => format!("payload `{pointer}`"),
        }
    }
}

/// What happens to the entries behind a key's head when the head is dead-lettered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnDeadLetter {
    /// The next entry of the key goes (the default): a dead letter does not stop its key.
    #[default]
    Release,
    /// The key waits until the dead letter is requeued (and settles) or deleted, or an
    /// operator releases the key.
    Hold,
}

/// Order a subscription's entries by a key (see the module's documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderedBy {
    /// Where the key is.
    pub key: OrderKey,
    /// Entries of one key handled at once, across hosts (1: strict order).
    pub max_in_flight_per_key: u32,
    /// What a dead-lettered head does to its key.
    pub on_dead_letter: OnDeadLetter,
    /// Keys longer than this are handled unordered (and counted).
    pub max_key_bytes: usize,
}

impl OrderedBy {
    /// Order by the value of the stream field `name`, one entry of a key at a time.
    pub fn field(name: impl Into<String>) -> Self {
        Self::by(OrderKey::Field(name.into()))
    }

    /// Order by the value at the JSON pointer `pointer` in the payload, one entry of a key at
    /// a time.
    pub fn payload(pointer: impl Into<String>) -> Self {
        Self::by(OrderKey::Payload(pointer.into()))
    }

    fn by(key: OrderKey) -> Self {
        Self {
            key,
            max_in_flight_per_key: 1,
            on_dead_letter: OnDeadLetter::Release,
            max_key_bytes: DEFAULT_MAX_KEY_BYTES,
        }
    }

    /// Let up to `n` entries of one key run at once (order is then kept only between groups of
    /// `n`).
    pub fn per_key(mut self, n: u32) -> Self {
        self.max_in_flight_per_key = n;
        self
    }

    /// Hold a key whose head is dead-lettered until the dead letter is requeued or deleted.
    pub fn hold_on_dead_letter(mut self) -> Self {
        self.on_dead_letter = OnDeadLetter::Hold;
        self
    }

    /// Order only by keys of at most `bytes` bytes; longer ones are handled unordered.
    pub fn max_key_bytes(mut self, bytes: usize) -> Self {
        self.max_key_bytes = bytes;
        self
    }

    /// What is wrong with these settings, if anything (the stream names the subscription).
    pub fn check(&self, stream: &str) -> Result<(), crate::DescriptorError> {
        let bad = |problem: String| crate::DescriptorError::Ordering {
            stream: stream.to_owned(),
            problem,
        };
        if let Some(problem) = self.key.problem("ordered_by")? {
            return Err(bad(problem));
        }
        if !(1..=MAX_IN_FLIGHT_PER_KEY).contains(&self.max_in_flight_per_key) {
            return Err(bad(format!(
                "max_in_flight_per_key must be between 1 and {MAX_IN_FLIGHT_PER_KEY}, not {}",
                self.max_in_flight_per_key
            )));
        }
        if !(1..=MAX_KEY_BYTES).contains(&self.max_key_bytes) {
            return Err(bad(format!(
                "max_key_bytes must be between 1 and {MAX_KEY_BYTES}, not {}",
                self.max_key_bytes
            )));
        }
        Ok(())
    }

    /// How `sluice check` and the logs say it.
    pub fn describe(&self) -> String {
        let key = match &self.key {
            OrderKey::Field(name) => format!("field `{name}`"),
            OrderKey::Payload(pointer) => format!("payload `{pointer}`"),
        };
        let dead = match self.on_dead_letter {
            OnDeadLetter::Release => "release",
            OnDeadLetter::Hold => "hold",
        };
        format!(
            "{key}, {} per key, on dead letter {dead}, keys up to {} bytes",
            self.max_in_flight_per_key, self.max_key_bytes
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_out_of_bounds_are_refused_by_name() {
        assert!(OrderedBy::field("account").check("s").is_ok());
        let zero = OrderedBy::field("account").per_key(0).check("s");
        assert!(
            zero.unwrap_err()
                .to_string()
                .contains("max_in_flight_per_key")
        );
        let pointer = OrderedBy::payload("account").check("s");
        assert!(
            pointer
                .unwrap_err()
                .to_string()
                .contains("must start with `/`")
        );
        let huge = OrderedBy::field("a").max_key_bytes(1 << 20).check("s");
        assert!(huge.unwrap_err().to_string().contains("max_key_bytes"));
        let empty = OrderedBy::field(" ").check("s");
        assert!(empty.is_err());
        let escape = OrderedBy::payload("/a/~2").check("s");
        assert!(escape.unwrap_err().to_string().contains("`~0`"));
        assert!(OrderedBy::payload("/a~1b/~0").check("s").is_ok());
        let ours = OrderedBy::field("sluice-origin").check("s");
        assert!(ours.unwrap_err().to_string().contains("bookkeeping"));
    }
}
