//! A subscription's overrides of its component's descriptor: the stream, group and consumer,
//! the read and claim timings, retries, backoff, partitions and the delayed-retry set. What the
//! operator writes here wins over what the component exports.

use sluice_descriptor::{Backoff, DelayedRetry, Overrides};

use super::ConfigError;
use super::check::Validator;
use super::raw::{RawDelayedRetry, RawSubscription};

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
    })
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
