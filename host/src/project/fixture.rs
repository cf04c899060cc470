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
    /// A case sets a config key the host reserves (`sluice.`): no subscription can.
    #[error("{}: config key `{key}` is the host's (keys starting with `sluice.` are reserved): a subscription cannot set it, so a case cannot either", path.display())]
    Reserved {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
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
    let too_large = |size: u64| FixtureError::TooLarge {
        path: path.to_owned(),
        what: format!("{size} bytes"),
    };
    let size = std::fs::metadata(path).map_err(io)?.len();
    if size > MAX_FIXTURE_BYTES {
        return Err(too_large(size));
    }
    // Read through the bound too: a pipe or a device (`/dev/stdin`, `<(...)`) says size 0.
    let mut text = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(
            std::fs::File::open(path).map_err(io)?,
            MAX_FIXTURE_BYTES + 1,
        ),
        &mut text,
    )
    .map_err(io)?;
    if text.len() as u64 > MAX_FIXTURE_BYTES {
        return Err(too_large(text.len() as u64));
    }
    let invalid = |source| FixtureError::Invalid {
        path: path.to_owned(),
        source,
    };
    // An array is many cases, anything else one: each parsed as what it is, so serde's error
    // names the key and the place (an untagged enum only says that no variant matched).
    let many = text
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|&b| b == b'[');
    let cases = if many {
        serde_json::from_slice::<Vec<Case>>(&text).map_err(invalid)?
    } else {
        vec![serde_json::from_slice::<Case>(&text).map_err(invalid)?]
    };
    if let Some(key) = cases
        .iter()
        .flat_map(|c| c.config.keys())
        .find(|k| k.starts_with(sluice_descriptor::RESERVED_CONFIG_PREFIX))
    {
        return Err(FixtureError::Reserved {
            path: path.to_owned(),
            key: key.clone(),
        });
    }
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
            (printable(&label), case)
        })
        .collect())
}

/// `text` with its control characters escaped: a case's name cannot start a line of its own
/// (a forged `ok` line) or send escape sequences to the terminal.
fn printable(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let escaped = c.is_control().then(|| c.escape_default());
            escaped
                .into_iter()
                .flatten()
                .chain((!c.is_control()).then_some(c))
        })
        .collect()
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
    fn a_mistake_in_a_list_of_cases_is_named_too() {
        let (_d, typo) =
            write("[\n  {\"payload\": 1},\n  {\"payload\": 2, \"expcet\": \"ack\"}\n]");
        let err = load(&typo).unwrap_err().to_string();
        assert!(err.contains("expcet") && err.contains("line 3"), "{err}");
        let (_d, word) = write(r#"[{"payload": 1, "expect": "dead_letter"}]"#);
        let err = load(&word).unwrap_err().to_string();
        assert!(
            err.contains("dead_letter") && err.contains("dead-letter"),
            "{err}"
        );
    }

    #[test]
    fn a_case_cannot_set_what_the_host_reserves() {
        let (_d, path) = write(r#"{"payload": 1, "config": {"sluice.payload-field": "other"}}"#);
        let err = load(&path).unwrap_err().to_string();
        assert!(
            err.contains("sluice.payload-field") && err.contains("reserved"),
            "{err}"
        );
    }

    #[test]
    #[cfg(unix)]
    fn a_file_without_a_size_is_bounded_as_it_is_read() {
        // A device (or a pipe, `<(...)`) says size 0: the read itself stops at the bound.
        let err = load(Path::new("/dev/zero")).unwrap_err();
        assert!(matches!(err, FixtureError::TooLarge { .. }), "{err}");
    }

    #[test]
    fn a_name_cannot_forge_a_line() {
        let (_d, path) = write(r#"{"name": "x\n\u001b[32mok    forged: ack", "payload": 1}"#);
        let cases = load(&path).unwrap();
        assert_eq!(cases[0].0, "x\\n\\u{1b}[32mok    forged: ack");
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
