//! How a canary ended: its [`Outcome`] and the [`Verdict`] that says it, with why, when and by
//! whom (bounded), sealed with the rollout key over the record it is for, so that a verdict is
//! taken only when a host of the group wrote it for that record.

use super::record::Sealed;
use super::{MAX_TEXT, rfc3339};
use crate::control::rollout::key::{RolloutKey, Use};
use crate::pipeline::admit::clean;

/// How a canary ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The candidate serves every delivery now.
    Promoted,
    /// The incumbent serves every delivery again.
    RolledBack,
}

impl Outcome {
    /// Its name in Redis, the API and the log.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Promoted => "promoted",
            Outcome::RolledBack => "rolled-back",
        }
    }
}

/// A canary's verdict, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The canary it is for.
    pub id: String,
    /// Promoted or rolled back.
    pub outcome: Outcome,
    /// Why, bounded.
    pub why: String,
    /// When (ms since the Unix epoch, server clock).
    pub at_ms: u64,
    /// Which host or operator decided, bounded.
    pub by: String,
}

impl Verdict {
    /// A new verdict for the canary `id`, its texts bounded.
    pub fn new(id: &str, outcome: Outcome, why: &str, at_ms: u64, by: &str) -> Self {
        Self {
            id: id.to_owned(),
            outcome,
            why: clean(why, MAX_TEXT),
            at_ms,
            by: clean(by, MAX_TEXT),
        }
    }

    /// The verdict as stored for the record of `stream` and `group`: its body and the seal
    /// over stream, group, the record's id and the body.
    pub fn sealed(&self, key: &RolloutKey, stream: &str, group: &str) -> String {
        let body = serde_json::json!({
            "id": self.id,
            "verdict": self.outcome.name(),
            "why": self.why,
            "at_ms": self.at_ms,
            "by": self.by,
        })
        .to_string();
        let seal = key.seal(
            Use::Verdict,
            &[
                stream.as_bytes(),
                group.as_bytes(),
                self.id.as_bytes(),
                body.as_bytes(),
            ],
        );
        Sealed::store(body, seal)
    }

    /// The verdict stored as `raw` for the record `id` of `stream` and `group`, if its seal
    /// verifies with `key`; otherwise why not (anything else is another writer's).
    pub fn open(
        raw: &[u8],
        key: Option<&RolloutKey>,
        (stream, group): (&str, &str),
        id: &str,
    ) -> Result<Self, String> {
        let body = Sealed::open(
            raw,
            key,
            (Use::Verdict, "verdict"),
            &[stream.as_bytes(), group.as_bytes(), id.as_bytes()],
        )?;
        let value: serde_json::Value = serde_json::from_str(&body)
            .map_err(|err| format!("the canary verdict's body does not read: {err}"))?;
        let text = |name: &str| {
            value
                .get(name)
                .and_then(serde_json::Value::as_str)
                .map(|t| clean(t, MAX_TEXT))
        };
        let outcome = match value.get("verdict").and_then(serde_json::Value::as_str) {
            Some("promoted") => Outcome::Promoted,
            Some("rolled-back") => Outcome::RolledBack,
            _ => return Err("the canary verdict names no outcome".to_owned()),
        };
        if text("id").as_deref() != Some(id) {
            return Err("the canary verdict is for another record".to_owned());
        }
        Ok(Self {
            id: id.to_owned(),
            outcome,
            why: text("why").unwrap_or_default(),
            at_ms: value
                .get("at_ms")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0),
            by: text("by").unwrap_or_default(),
        })
    }

    /// Its JSON for the API and the page.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.id,
            "verdict": self.outcome.name(),
            "why": self.why,
            "at": rfc3339(self.at_ms),
            "by": self.by,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::rollout::key::Origin;

    fn key(material: &str) -> RolloutKey {
        RolloutKey::derive(material, Origin::AdminToken)
    }

    #[test]
    fn verdicts_are_bounded_sealed_and_bound_to_their_record() {
        let k = key("s3cret");
        let long = "x".repeat(10_000);
        let v = Verdict::new("abc", Outcome::Promoted, &long, 5, "host\u{1b}[2J");
        let sealed = v.sealed(&k, "orders", "billing");
        let read = Verdict::open(sealed.as_bytes(), Some(&k), ("orders", "billing"), "abc")
            .expect("a verdict");
        assert_eq!(read.why.chars().count(), MAX_TEXT);
        assert_eq!(read.by, "host[2J");
        assert_eq!(read.outcome, Outcome::Promoted);
        assert_eq!(read.at_ms, 5);
        // Another record, subscription or key; the unsealed form; an edited outcome: refused.
        assert!(Verdict::open(sealed.as_bytes(), Some(&k), ("orders", "billing"), "abd").is_err());
        assert!(Verdict::open(sealed.as_bytes(), Some(&k), ("orders", "audit"), "abc").is_err());
        assert!(
            Verdict::open(
                sealed.as_bytes(),
                Some(&key("x")),
                ("orders", "billing"),
                "abc"
            )
            .is_err()
        );
        let plain = br#"{"id":"abc","verdict":"promoted","why":"","at_ms":1,"by":"x"}"#;
        assert!(Verdict::open(plain, Some(&k), ("orders", "billing"), "abc").is_err());
        let edited = sealed.replace("promoted", "rolled-back");
        assert!(Verdict::open(edited.as_bytes(), Some(&k), ("orders", "billing"), "abc").is_err());
    }
}
