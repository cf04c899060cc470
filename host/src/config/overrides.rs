//! A subscription's overrides of its component's descriptor: the stream, group and consumer,
//! the read and claim timings, retries, backoff, partitions and the delayed-retry set. What the
//! operator writes here wins over what the component exports.

use sluice_descriptor::{
    Backoff, DelayedRetry, DescriptorError, Effects, OnDeadLetter, OrderKey, OrderedBy, Overrides,
};

use super::ConfigError;
use super::check::Validator;
use super::raw::{RawDelayedRetry, RawOrderedBy, RawSubscription};

/// The descriptor fields this subscription overrides; `consumer` is its file's top-level
/// `consumer`, which its own wins over.
pub(super) fn overrides(
    v: &Validator<'_>,
    key: &dyn Fn(&str) -> String,
    sub: &RawSubscription,
    consumer: Option<&str>,
) -> Result<Overrides, ConfigError> {
    let failure_backoff = match &sub.failure_backoff {
        None => None,
        Some(b) => Some(Backoff {
            initial: v.duration(&key("failure_backoff.initial"), &b.initial)?,
            max: v.duration(&key("failure_backoff.max"), &b.max)?,
        }),
    };
    let delayed_retry = delayed_retry(v, key, sub.delayed_retry.as_ref())?;
    Ok(Overrides {
        stream: sub.stream.clone(),
        group: sub.group.clone(),
        consumer: sub.consumer.clone().or(consumer.map(str::to_owned)),
        claim_min_idle: v.opt_duration(&key("claim_min_idle"), &sub.claim_min_idle)?,
        block: v.opt_duration(&key("block"), &sub.block)?,
        count: sub.count,
        dead_letter: sub.dead_letter.clone(),
        max_retries: sub.max_retries,
        payload_field: sub.payload_field.clone(),
        max_delay: v.opt_duration(&key("max_delay"), &sub.max_delay)?,
        failure_backoff,
        delayed_retry,
        partitions: sub.partitions,
        ordered_by: ordered_by(v, key, sub.ordered_by.as_ref(), sub.max_in_flight_per_key)?,
        max_in_flight_per_key: sub.max_in_flight_per_key,
        dedupe: super::dedupe::dedupe(v, key, sub.dedupe.as_ref())?,
        // Checked with the journal's bounds (`limits.rs`).
        effects: match sub.effects.as_deref() {
            Some("journal") => Some(Effects::Journal),
            Some(_) => Some(Effects::Live),
            None => None,
        },
    })
}

/// `ordered_by`: `"none"` takes the descriptor's ordering away (`Some(None)`), a table names
/// where the key is (exactly one of `field` and `payload`).
fn ordered_by(
    v: &Validator<'_>,
    key: &dyn Fn(&str) -> String,
    raw: Option<&RawOrderedBy>,
    max_in_flight_per_key: Option<u32>,
) -> Result<Option<Option<OrderedBy>>, ConfigError> {
    let set = match raw {
        None => return Ok(None),
        Some(RawOrderedBy::Keyword(word)) if word == "none" => return Ok(Some(None)),
        Some(RawOrderedBy::Keyword(word)) => {
            return Err(v.invalid(
                &key("ordered_by"),
                word,
                "expected \"none\" or a table { field = \"...\" } or { payload = \"/pointer\" }",
            ));
        }
        Some(RawOrderedBy::Key(set)) => set,
    };
    let text = |name: &str| -> Result<Option<String>, ConfigError> {
        match set.get(name) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(v.invalid(
                &key(&format!("ordered_by.{name}")),
                &other.to_string(),
                "expected a string",
            )),
        }
    };
    if let Some(unknown) = set
        .keys()
        .find(|k| !["field", "payload", "on_dead_letter", "max_key_bytes"].contains(&k.as_str()))
    {
        return Err(v.invalid(
            &key(&format!("ordered_by.{unknown}")),
            unknown,
            "unknown key: ordered_by takes field or payload, on_dead_letter and max_key_bytes",
        ));
    }
    let mut ordered = match (text("field")?, text("payload")?) {
        (Some(field), None) => OrderedBy::field(field),
        (None, Some(pointer)) => OrderedBy::payload(pointer),
        _ => {
            return Err(v.invalid(
                &key("ordered_by"),
                "{ .. }",
                "name exactly one of `field` (a stream field) and `payload` (a JSON pointer into the payload)",
            ));
        }
    };
    ordered.on_dead_letter = match text("on_dead_letter")?.as_deref() {
        None | Some("release") => OnDeadLetter::Release,
        Some("hold") => OnDeadLetter::Hold,
        Some(other) => {
            return Err(v.invalid(
                &key("ordered_by.on_dead_letter"),
                other,
                "expected \"release\" (the next entry of the key goes) or \"hold\" (the key waits until the dead letter is requeued or deleted)",
            ));
        }
    };
    match set.get("max_key_bytes") {
        None => {}
        Some(toml::Value::Integer(n)) if *n > 0 => ordered.max_key_bytes = *n as usize,
        Some(other) => {
            return Err(v.invalid(
                &key("ordered_by.max_key_bytes"),
                &other.to_string(),
                "expected a positive number of bytes",
            ));
        }
    }
    if let Some(n) = max_in_flight_per_key {
        ordered.max_in_flight_per_key = n;
    }
    let shown = match &ordered.key {
        OrderKey::Field(name) | OrderKey::Payload(name) => name.clone(),
    };
    match ordered.check("") {
        Ok(()) => Ok(Some(Some(ordered))),
        Err(DescriptorError::Ordering { problem, .. }) => {
            Err(v.invalid(&key("ordered_by"), &shown, &problem))
        }
        Err(other) => Err(v.invalid(&key("ordered_by"), &shown, &other.to_string())),
    }
}

/// `delayed_retry`: `"none"` takes the descriptor's set away (`Some(None)`), a table names
/// another one.
fn delayed_retry(
    v: &Validator<'_>,
    key: &dyn Fn(&str) -> String,
    raw: Option<&RawDelayedRetry>,
) -> Result<Option<Option<DelayedRetry>>, ConfigError> {
    Ok(match raw {
        None => None,
        Some(RawDelayedRetry::Keyword(word)) if word == "none" => Some(None),
        Some(RawDelayedRetry::Keyword(word)) => {
            return Err(v.invalid(
                &key("delayed_retry"),
                word,
                "expected \"none\" or a table { key = \"...\", ttl = \"...\" }",
            ));
        }
        Some(RawDelayedRetry::Set(set)) => Some(Some(DelayedRetry::DurableZset {
            ttl: v.opt_duration(&key("delayed_retry.ttl"), &set.ttl)?,
            key: set.key.clone(),
        })),
    })
}
