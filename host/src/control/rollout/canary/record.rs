//! A canary's record: what it tries (candidate and incumbent digests, share, window,
//! thresholds, who), sealed with the hosts' rollout key over its subscription so that only a
//! host holding the key can make the others run a candidate. [`Sealed`] is the stored form the
//! verdict shares.

use super::rule::Thresholds;
use super::{JOIN_GRACE, NO_KEY, rfc3339};
use crate::control::rollout::key::{RolloutKey, Use};

/// A canary, as its sealed record says.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Record {
    /// Random, 32 hex digits: names this canary (and keys which entries it tries).
    pub id: String,
    /// The subscription's stream.
    pub stream: String,
    /// Its group.
    pub group: String,
    /// The candidate's digest.
    pub candidate: String,
    /// The digest that served on the host that started it.
    pub incumbent: String,
    /// Of 10,000 deliveries, how many the candidate takes.
    pub share_bp: u32,
    /// When it started (ms since the Unix epoch, the server's clock).
    pub started_ms: u64,
    /// When its window ends.
    pub ends_ms: u64,
    /// Who started it.
    pub by: String,
    /// How it is judged.
    pub thresholds: Thresholds,
}

/// A body as stored: its JSON and the seal over it (and over what it is bound to).
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct Sealed {
    pub(super) body: String,
    pub(super) seal: String,
}

impl Sealed {
    /// The stored form of `body` with `seal`.
    pub(super) fn store(body: String, seal: String) -> String {
        // A struct of two strings always serializes.
        serde_json::to_string(&Sealed { body, seal }).unwrap_or_default()
    }

    /// The body stored as `raw`, if it is sealed with `key` for `use_` over `parts` and the
    /// body; otherwise why not (`what` names it: "record", "verdict").
    pub(super) fn open(
        raw: &[u8],
        key: Option<&RolloutKey>,
        (use_, what): (Use, &str),
        parts: &[&[u8]],
    ) -> Result<String, String> {
        let sealed: Sealed = serde_json::from_slice(raw)
            .map_err(|_| format!("the canary {what} is not Sluice's (not sealed)"))?;
        let key = key.ok_or_else(|| NO_KEY.to_owned())?;
        let mut all = parts.to_vec();
        all.push(sealed.body.as_bytes());
        if !key.verify(use_, &all, &sealed.seal) {
            return Err(format!(
                "the canary {what}'s seal does not verify with this host's rollout key (written by something that does not hold it, or by a host with another rollout key)"
            ));
        }
        Ok(sealed.body)
    }
}

impl Record {
    /// The record as stored: its body and the seal over stream, group and body.
    pub(super) fn sealed(&self, key: &RolloutKey) -> String {
        // A struct of strings and numbers always serializes.
        let body = serde_json::to_string(self).unwrap_or_default();
        let seal = key.seal(
            Use::Record,
            &[
                self.stream.as_bytes(),
                self.group.as_bytes(),
                body.as_bytes(),
            ],
        );
        Sealed::store(body, seal)
    }

    /// The record stored as `raw` for the subscription to `stream` with `group`, if its seal
    /// verifies with `key` and it is for that subscription; otherwise why not.
    pub fn open(
        raw: &[u8],
        key: Option<&RolloutKey>,
        stream: &str,
        group: &str,
    ) -> Result<Self, String> {
        let body = Sealed::open(
            raw,
            key,
            (Use::Record, "record"),
            &[stream.as_bytes(), group.as_bytes()],
        )?;
        let record: Self = serde_json::from_str(&body)
            .map_err(|err| format!("the canary record's body does not read: {err}"))?;
        if record.stream != stream || record.group != group {
            return Err("the canary record names another subscription".to_owned());
        }
        Ok(record)
    }

    /// From when entries may run the candidate (see [`crate::handler::takes`]): [`JOIN_GRACE`]
    /// after the start, by when every host has seen the record.
    pub fn from_ms(&self) -> u64 {
        self.started_ms
            .saturating_add(u64::try_from(JOIN_GRACE.as_millis()).unwrap_or(0))
    }

    /// The share as a percentage.
    pub fn percent(&self) -> f64 {
        f64::from(self.share_bp) / 100.0
    }

    /// Its JSON for the API and the page.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.id,
            "candidate": self.candidate,
            "incumbent": self.incumbent,
            "share_percent": self.percent(),
            "share_basis_points": self.share_bp,
            "eligible_from": rfc3339(self.from_ms()),
            "eligible_from_ms": self.from_ms(),
            "started": rfc3339(self.started_ms),
            "ends": rfc3339(self.ends_ms),
            "by": self.by,
            "thresholds": self.thresholds,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::rollout::key::Origin;

    fn record() -> Record {
        Record {
            id: "0123456789abcdef0123456789abcdef".to_owned(),
            stream: "orders".to_owned(),
            group: "billing".to_owned(),
            candidate: "c".repeat(64),
            incumbent: "i".repeat(64),
            share_bp: 1000,
            started_ms: 1,
            ends_ms: 2,
            by: "ops".to_owned(),
            thresholds: Thresholds::from(&crate::config::Canary::default()),
        }
    }

    fn key(material: &str) -> RolloutKey {
        RolloutKey::derive(material, Origin::AdminToken)
    }

    #[test]
    fn only_a_record_sealed_for_its_subscription_opens() {
        let k = key("s3cret");
        let sealed = record().sealed(&k);
        assert_eq!(
            Record::open(sealed.as_bytes(), Some(&k), "orders", "billing"),
            Ok(record())
        );
        // Another key, another subscription, no key, an edited body: refused.
        assert!(Record::open(sealed.as_bytes(), Some(&key("other")), "orders", "billing").is_err());
        assert!(Record::open(sealed.as_bytes(), Some(&k), "orders", "audit").is_err());
        assert!(Record::open(sealed.as_bytes(), None, "orders", "billing").is_err());
        let edited = sealed.replace("\\\"share_bp\\\":1000", "\\\"share_bp\\\":10000");
        assert_ne!(edited, sealed);
        assert!(Record::open(edited.as_bytes(), Some(&k), "orders", "billing").is_err());
        assert!(Record::open(b"garbage", Some(&k), "orders", "billing").is_err());
    }
}
