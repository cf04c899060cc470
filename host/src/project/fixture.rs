//! Handler tests without Redis: a fixture is a made-up delivery (payload, other fields, retry
//! and delivery counts, config values) and, optionally, the outcome it must get. `sluice test`
//! runs each on the real component, in the real sandbox with its subscription's grants and
//! limits, and compares: a unit test of a handler in any language.
//!
//! A fixture file (JSON) holds one case or an array of them:
//!
//! ```json
//! {"name": "a first attempt is acked", "payload": {"id": "1"}, "expect": "ack"}
//! ```
//!
//! `payload` is put in the subscription's payload field: a JSON object or array as its JSON
//! text, a string as it is (so an undecodable payload can be tried too). `fields` adds others
//! (text values), `retry_count` and `delivery_count` say which attempt this is (as the host
//! counts them), `config` sets or overrides the values the handler reads, `expect` is one of
//! `ack`, `retry`, `dead-letter` or `fail` (a trap or a limit).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::control::rollout::replay::Would;
use crate::entry::delivery::{Delivery, Entry, Source};

/// The largest fixture file read, in bytes: made-up deliveries, not a data set.
pub const MAX_FIXTURE_BYTES: u64 = 4 * 1024 * 1024;
/// The most cases one file holds.
pub const MAX_CASES: usize = 1000;

/// Why a fixture cannot be used. Each names the file.
#[derive(Debug, thiserror::Error)]
pub enum FixtureError {
    /// The file cannot be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is larger than [`MAX_FIXTURE_BYTES`] or holds more than [`MAX_CASES`].
    #[error("{}: {what}; a fixture file holds made-up deliveries, at most {MAX_CASES} cases in {MAX_FIXTURE_BYTES} bytes", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// How large it is.
        what: String,
    },
    /// The file is not a fixture.
    #[error("{}: not a fixture (a JSON object with `payload`, or an array of them): {source}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What serde said.
        source: serde_json::Error,
    },
}

/// One made-up delivery and what it must come to.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    /// What the case shows (else its file and place).
    pub name: Option<String>,
    /// The payload field's value.
    pub payload: serde_json::Value,
    /// Further fields, in this order after the payload.
    #[serde(default)]
    pub fields: BTreeMap<String, String>,
    /// The entry id (default `1-0`).
    pub id: Option<String>,
    /// How many times it was parked and came back.
    #[serde(default)]
    pub retry_count: u32,
    /// How many times Redis delivered it (from 1).
    #[serde(default = "one")]
    pub delivery_count: u64,
    /// Config values that the handler reads, set or replacing the subscription's.
    #[serde(default)]
    pub config: BTreeMap<String, String>,
    /// The outcome it must get.
    pub expect: Option<Expect>,
}

fn one() -> u64 {
    1
}

/// An outcome a case expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Expect {
    /// Acknowledged.
    Ack,
    /// A retry asked for (after any delay, a downstream down included).
    Retry,
    /// Dead-lettered by the handler (an undecodable payload included).
    DeadLetter,
    /// No answer: a trap, an exception, a limit.
    Fail,
}

impl Expect {
    /// Whether `would` is this outcome.
    pub fn matches(self, would: &Would) -> bool {
        matches!(
            (self, would),
            (Expect::Ack, Would::Ack)
                | (Expect::Retry, Would::Retry { .. })
                | (Expect::DeadLetter, Would::DeadLetter(_))
                | (Expect::Fail, Would::Fail(_))
        )
    }
}

/// The cases of the fixture file at `path`, each with its label (its name, else the file and
/// its place in it).
pub fn load(path: &Path) -> Result<Vec<(String, Case)>, FixtureError> {
    let io = |source| FixtureError::Io {
        path: path.to_owned(),
        source,
    };
    let size = std::fs::metadata(path).map_err(io)?.len();
    if size > MAX_FIXTURE_BYTES {
        return Err(FixtureError::TooLarge {
            path: path.to_owned(),
            what: format!("{size} bytes"),
        });
    }
    let text = std::fs::read(path).map_err(io)?;
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(Box<Case>),
        Many(Vec<Case>),
    }
    let parsed = serde_json::from_slice::<OneOrMany>(&text).map_err(|source| {
        // Untagged: serde says only "no variant matched"; the one case's own error says why.
        let source = serde_json::from_slice::<Case>(&text)
            .err()
            .unwrap_or(source);
        FixtureError::Invalid {
            path: path.to_owned(),
            source,
        }
    })?;
    let cases = match parsed {
        OneOrMany::One(case) => vec![*case],
        OneOrMany::Many(cases) => cases,
    };
    if cases.len() > MAX_CASES {
        return Err(FixtureError::TooLarge {
            path: path.to_owned(),
            what: format!("{} cases", cases.len()),
        });
    }
    let several = cases.len() > 1;
    Ok(cases
        .into_iter()
        .enumerate()
        .map(|(i, case)| {
            let label = match (&case.name, several) {
                (Some(name), _) => name.clone(),
                (None, true) => format!("{}[{i}]", path.display()),
                (None, false) => path.display().to_string(),
            };
            (label, case)
        })
        .collect())
}

impl Case {
    /// The delivery as the host would hand it to the handler: read from `stream` by `group`,
    /// the payload in `payload_field`.
    pub fn delivery(&self, stream: &str, group: &str, payload_field: &str) -> Delivery {
        let payload = match &self.payload {
            serde_json::Value::String(text) => text.clone().into_bytes(),
            other => other.to_string().into_bytes(),
        };
        let mut fields = vec![(payload_field.as_bytes().to_vec(), payload)];
        fields.extend(
            self.fields
                .iter()
                .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec())),
        );
        let entry = Entry {
            id: self.id.clone().unwrap_or_else(|| "1-0".to_owned()),
            fields,
        };
        let mut delivery = Delivery::new(
            stream,
            group,
            (Source::Stream, stream),
            entry,
            self.delivery_count,
            None,
        );
        delivery.retry_count = self.retry_count;
        delivery
    }

    /// `values` (the subscription's config values) with this case's set or replaced.
    pub fn values(&self, values: &[(String, String)]) -> Vec<(String, String)> {
        let mut merged: Vec<(String, String)> = values
            .iter()
            .filter(|(k, _)| !self.config.contains_key(k))
            .cloned()
            .collect();
        merged.extend(self.config.iter().map(|(k, v)| (k.clone(), v.clone())));
        merged
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("case.json");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn a_fixture_is_one_case_or_many_and_a_typo_is_named() {
        let (_d, one) = write(r#"{"payload": {"id": "1"}, "expect": "ack"}"#);
        let cases = load(&one).unwrap();
        assert_eq!(cases.len(), 1);
        assert_eq!(cases[0].1.expect, Some(Expect::Ack));
        let (_d, many) = write(r#"[{"payload": "x"}, {"name": "second", "payload": 1}]"#);
        let cases = load(&many).unwrap();
        assert_eq!(cases[1].0, "second");
        assert!(cases[0].0.ends_with("case.json[0]"), "{}", cases[0].0);
        let (_d, typo) = write(r#"{"payload": {}, "expcet": "ack"}"#);
        let err = load(&typo).unwrap_err().to_string();
        assert!(err.contains("expcet"), "{err}");
    }

    #[test]
    fn the_delivery_carries_the_payload_as_written() {
        let case: Case = serde_json::from_str(
            r#"{"payload": "{not json", "fields": {"k": "v"}, "retry_count": 2, "delivery_count": 3}"#,
        )
        .unwrap();
        let d = case.delivery("s", "g", "payload");
        assert_eq!(d.entry.field("payload"), Some(&b"{not json"[..]));
        assert_eq!(d.entry.field("k"), Some(&b"v"[..]));
        assert_eq!((d.retry_count, d.delivery_count), (2, 3));
        assert_eq!(d.previous_attempts(), 4);
    }
}
