//! One delivery, start to end: run the handler inside the delivery's span, decide with
//! [`crate::entry::outcome::decide`], and settle the decision.
//!
//! Dispatch is generic over [`crate::handler::Handler`]: the WASM runtime is one
//! implementation; tests and benchmarks can plug in a native one to isolate what WebAssembly
//! costs.
//!
//! Longer than the house's ~600 lines on purpose: one attempt's steps (refuse, call, decide,
//! carry out) and the spans that trace it read the same delivery and version; each function is
//! a screen or less.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::entry::delivery::Delivery;
use crate::entry::outcome::{self, Action, Failure, Outcome, Policy};
use crate::handler::{AttemptKind, HandlerSlot, Role, Trial, Version};
use crate::observe::metrics::{DeliveryMetrics, HandlerResult, Metrics, SubLabels};
use crate::pipeline::settle::{Ack, SettleError, Settler};
use crate::support::digest::Digest;

/// How a dispatch ended, for the subscription to act on.
#[derive(Debug)]
pub enum Settled {
    /// To be acknowledged: the caller queues it with the other acks of its read
    /// ([`Dispatcher::ack_all`]), so one wake-up of the acker carries them all.
    Ack(Ack),
    /// Parked or dead-lettered: nothing more to do here.
    Done,
    /// The entry stays pending and must come back after the delay.
    RetryPending(std::time::Duration),
}

/// Runs deliveries of one subscription.
pub struct Dispatcher {
    slot: Arc<HandlerSlot>,
    policy: Policy,
    settler: Arc<Settler>,
    metrics: DeliveryMetrics,
    /// A moving average of how long the handler takes, in nanoseconds: how a read's
    /// deliveries are spread over threads (see [`Self::typical_handler_time`]).
    typical_ns: AtomicU64,
    /// The group's circuit breaker, which counts each attempt, if it has one.
    breaker: Option<Arc<crate::pipeline::admit::breaker::Breaker>>,
    /// An ack is logged at info too (`sluice dev`: see [`crate::service::plan::Plan`]).
    log_each: bool,
    /// The journals of the deliveries' outbound calls, with `effects = "journal"`.
    journal: Option<Arc<crate::store::effects::JournalStore>>,
    /// The key of the deliveries' idempotency keys, when their calls carry keys.
    call_key: Option<[u8; 32]>,
}

impl Dispatcher {
    /// A dispatcher running whatever handler `slot` holds, under `policy`.
    pub fn new(
        slot: Arc<HandlerSlot>,
        policy: Policy,
        settler: Arc<Settler>,
        metrics: &Metrics,
        labels: &SubLabels,
    ) -> Self {
        Self {
            slot,
            policy,
            settler,
            metrics: metrics.for_deliveries(labels),
            typical_ns: AtomicU64::new(0),
            breaker: None,
            log_each: false,
            journal: None,
            call_key: None,
        }
    }

    /// What every delivery's outbound calls get: their `journal` (`effects = "journal"`) and
    /// the key to make their idempotency keys with (when they carry keys).
    pub fn with_effects(
        mut self,
        journal: Option<Arc<crate::store::effects::JournalStore>>,
        call_key: Option<[u8; 32]>,
    ) -> Self {
        (self.journal, self.call_key) = (journal, call_key);
        self
    }

    /// Log every delivery, an ack too (a retry and a dead letter always are).
    pub fn logging_each(mut self, log_each: bool) -> Self {
        self.log_each = log_each;
        self
    }

    /// Count every attempt for `breaker`.
    pub fn with_breaker(
        mut self,
        breaker: Option<Arc<crate::pipeline::admit::breaker::Breaker>>,
    ) -> Self {
        self.breaker = breaker;
        self
    }

    /// Handle and settle one delivery.
    pub async fn dispatch(&self, mut delivery: Delivery) -> Settled {
        // The version is taken once: a swap during this delivery does not change its handler.
        // During a canary the entry's origin id picks it, the same for all its attempts.
        // A host joining a canary holds the deliveries the candidate would take until it runs.
        let (version, trial) = self.slot.pick_when_ready(&delivery.origin_id).await;
        // Only an event reports it: no clock read per delivery while nobody listens.
        if self.settler.events_listened() {
            delivery.started = Some(crate::support::clock::now());
        }
        delivery.call_key = self.call_key;
        if let Some(store) = &self.journal {
            delivery.journal = Some(Arc::new(crate::store::effects::DeliveryJournal::new(
                store.clone(),
            )));
        }
        let parent = crate::observe::telemetry::enabled().then(|| {
            crate::observe::telemetry::parent_of(
                &delivery.stream,
                &delivery.group,
                &delivery.origin_id,
                delivery.user_fields(),
            )
        });
        // Another group's copy or a stray is not this group's entry: no span of its trace.
        let sampled = parent
            .as_ref()
            .is_some_and(|p| p.span_context().is_sampled())
            && delivery.other_group.is_none()
            && !delivery.stray;
        // Made only when it goes somewhere: a sampled trace, or log lines at info (whose
        // context it is). Otherwise even a span every layer turns down cost the registry a
        // slot, a lookup per poll and a close, per delivery (issue 50).
        let wanted = sampled || tracing::span_enabled!(tracing::Level::INFO);
        let span = crate::observe::telemetry::attempt_span(sampled, || {
            if !wanted {
                return tracing::Span::none();
            }
            tracing::info_span!(
                "delivery",
                stream = %delivery.stream,
                group = %delivery.group,
                id = %delivery.entry.id,
                retry_count = crate::observe::telemetry::number(delivery.retry_count),
                delivery_count = crate::observe::telemetry::number(delivery.delivery_count),
                digest = version.digest.short(),
                origin_id = tracing::field::Empty,
                attempt = tracing::field::Empty,
                partition = tracing::field::Empty,
                trace_id = tracing::field::Empty,
                outcome = tracing::field::Empty,
                retry_delay_ms = tracing::field::Empty,
                reason = tracing::field::Empty,
                time_limit_ms = tracing::field::Empty,
                memory_bytes = tracing::field::Empty,
                "otel.kind" = tracing::field::Empty,
            )
        });
        if let Some(parent) = parent {
            if sampled {
                trace_attempt(&delivery, &span, &parent);
            }
            delivery.trace = Some(crate::observe::telemetry::AttemptTrace {
                parent: parent.span_context().clone(),
                span: sampled.then(|| span.clone()),
            });
        }
        self.run(delivery, &version, trial.as_ref())
            .instrument(span)
            .await
    }

    /// How long a call of this subscription's handler typically takes (a moving average of
    /// the recent ones; `None` before the first has ended).
    pub fn typical_handler_time(&self) -> Option<Duration> {
        let ns = self.typical_ns.load(Ordering::Relaxed);
        (ns > 0).then(|| Duration::from_nanos(ns))
    }

    fn observe(&self, elapsed: Duration) {
        // An average over about the last 16 calls; concurrent updates may lose one sample,
        // which an estimate can afford.
        let sample = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX).max(1);
        let old = self.typical_ns.load(Ordering::Relaxed);
        let new = if old == 0 {
            sample
        } else {
            old - old / 16 + sample / 16
        };
        self.typical_ns.store(new, Ordering::Relaxed);
    }

    /// How long an entry whose attempt failed without a decision waits before it is tried
    /// again, after `delivery_count` deliveries.
    pub fn failure_delay(&self, delivery_count: u64) -> Duration {
        self.policy
            .failure_backoff
            .delay(u32::try_from(delivery_count).unwrap_or(u32::MAX))
    }

    /// Queue acks for the acker, which sends them with others and reports each once Redis has
    /// it.
    pub fn ack_all(&self, acks: Vec<Ack>) {
        self.settler.ack_all(acks);
    }

    /// A retry put back by the sweep carries its due time (Redis server clock); its lateness
    /// is the time it starts being handled minus that, both by the server's clock: this host's
    /// clock corrected by the offset its delayed set last saw, or, without one, the time the
    /// sweep re-added it (the entry id's milliseconds, also the server's clock). A skewed host
    /// clock changes neither when a retry is due nor this metric.
    fn record_lateness(&self, delivery: &Delivery) {
        let Some(due) = delivery.due_ms else {
            return;
        };
        let now = self.settler.server_now_ms().unwrap_or_else(|| {
            crate::support::when::entry_ms(&delivery.entry.id)
                .and_then(|ms| i64::try_from(ms).ok())
                .unwrap_or(due)
        });
        let late = ((now - due) as f64 / 1000.0).max(0.0);
        self.metrics.lateness.observe(late);
        self.metrics.lateness_counts.observe(late);
    }

    /// One attempt: the entry refused before the handler when it must be, else the handler
    /// called, its result decided, and the decision carried out.
    async fn run(
        &self,
        mut delivery: Delivery,
        version: &Version,
        trial: Option<&(Arc<Trial>, Role)>,
    ) -> Settled {
        let digest = &version.digest;
        if let Some(settled) = self.refused(&delivery, digest).await {
            return settled;
        }
        self.record_lateness(&delivery);
        let (result, elapsed) = self.call(&delivery, version).await;
        let result = if self.policy.poison_check {
            crate::pipeline::poison::check(&mut delivery, version, self.journal.as_ref(), result)
                .await
        } else {
            result
        };
        let action = outcome::decide(&result, delivery.previous_attempts(), &self.policy);
        if let Some((trial, role)) = trial {
            trial.record(*role, attempt_kind(&result, &action), elapsed);
        }
        let elapsed_us = elapsed.as_micros() as u64;
        let trace = log_failure(&result, &action, elapsed_us);
        if let Some(span) = delivery.trace.as_ref().and_then(|t| t.span.as_ref()) {
            Self::record(span, &action);
        }
        let settled = self
            .carry_out(
                &delivery,
                digest,
                action,
                (result.is_ok(), trace),
                elapsed_us,
            )
            .await;
        settled.unwrap_or_else(|err| {
            // The scripts write before they acknowledge, so the entry is still pending: bring it
            // back after the failure backoff, like a failed attempt, until Redis takes it.
            self.metrics.settle_errors.inc();
            let delay = self.failure_delay(delivery.delivery_count);
            tracing::error!(
                %err,
                retry_in_ms = delay.as_millis() as u64,
                "cannot settle the entry; it stays pending and comes back after the backoff"
            );
            Settled::RetryPending(delay)
        })
    }

    /// An entry the handler must not get: not read whole, another group's retry copy, a lane
    /// entry the host did not write, or one over `max_entry_bytes`. How it was settled.
    async fn refused(&self, delivery: &Delivery, digest: &Digest) -> Option<Settled> {
        if delivery.cut.over {
            // Not read whole: what bookkeeping it carries cannot be checked, and the host holds
            // no copy of it; Redis copies it to the dead letters.
            let reason = format!(
                "the entry is at least {} bytes, over max_entry_bytes ({}): {} of its fields were not read; dead-lettered without being handled, copied whole in Redis",
                delivery.entry_bytes(),
                self.policy.max_entry_bytes,
                delivery.cut.fields
            );
            tracing::warn!(id = %delivery.entry.id, "{reason}");
            let written = self
                .settler
                .dead_letter_in_place(delivery, digest, &reason)
                .await;
            return Some(self.settled_dead(delivery, written));
        }
        if let Some(group) = &delivery.other_group {
            // Another group's retry at the stream's tail: that group handles it, not this one.
            self.metrics.other_groups_retries.inc();
            tracing::debug!(other_group = %group, "retry copy of another group; acknowledged unhandled");
            let kind = crate::observe::events::EventKind::OtherGroupsRetry {
                group: group.clone(),
            };
            return Some(Settled::Ack(self.settler.ack_as(delivery, digest, kind)));
        }
        if delivery.stray {
            // Only the host writes the lane: this entry is not one of its copies.
            let reason = "an entry in the retry lane that Sluice did not write (no valid seal): dead-lettered without being handled";
            return Some(self.dead_letter_unhandled(delivery, digest, reason).await);
        }
        let bytes = delivery.entry_bytes();
        if bytes > self.policy.max_entry_bytes {
            // Held whole only long enough to move it: the handler never gets it.
            let reason = format!(
                "the entry is {bytes} bytes ({} fields, each counted with {} bytes more), more than max_entry_bytes ({}): dead-lettered without being handled",
                delivery.entry.fields.len(),
                crate::entry::delivery::FIELD_OVERHEAD,
                self.policy.max_entry_bytes
            );
            return Some(self.dead_letter_unhandled(delivery, digest, &reason).await);
        }
        None
    }

    /// The handler called on `delivery`, timed and counted (and told to the breaker).
    async fn call(
        &self,
        delivery: &Delivery,
        version: &Version,
    ) -> (Result<Outcome, Failure>, Duration) {
        let m = &self.metrics;
        m.in_flight.inc();
        let started = Instant::now();
        let result = version.handler.handle(delivery).await;
        let elapsed = started.elapsed();
        self.observe(elapsed);
        m.in_flight.dec();
        m.duration.observe(elapsed.as_secs_f64());
        m.count(handler_result(&result));
        if let Some(breaker) = &self.breaker {
            match &result {
                Err(failure) => breaker.record(true, &failure.to_string()),
                Ok(Outcome::DownstreamDown(_, why)) => breaker.record(true, why),
                Ok(_) => breaker.record(false, ""),
            }
        }
        (result, elapsed)
    }

    /// The decision carried out in Redis: `handled` is `(whether the handler answered, the
    /// failure's traceback)`.
    async fn carry_out(
        &self,
        delivery: &Delivery,
        digest: &Digest,
        action: Action,
        (answered, trace): (bool, Option<&str>),
        elapsed_us: u64,
    ) -> Result<Settled, crate::pipeline::settle::SettleError> {
        let m = &self.metrics;
        match action {
            Action::Ack => {
                if self.log_each {
                    tracing::info!(elapsed = ?Duration::from_micros(elapsed_us), "acked");
                } else {
                    tracing::debug!(elapsed_us, "ack");
                }
                Ok(Settled::Ack(self.settler.ack_of(delivery, digest)))
            }
            Action::DeadLetter { reason, cut } => {
                if cut {
                    m.reasons_cut.inc();
                }
                if answered {
                    tracing::warn!(%reason, elapsed_us, cut, "dead-lettering");
                } else {
                    // The failure's line said it already.
                    tracing::debug!(%reason, elapsed_us, cut, "dead-lettering");
                }
                self.settler
                    .dead_letter(delivery, digest, &reason, trace)
                    .await
                    .map(|_| Settled::Done)
            }
            Action::Retry {
                delay,
                cause,
                clamped_from,
            } => {
                if let Some(asked) = clamped_from {
                    m.clamped.inc();
                    tracing::warn!(
                        asked_ms = asked.as_millis() as u64,
                        delay_ms = delay.as_millis() as u64,
                        "retry delay is longer than this subscription allows (max_delay); clamped"
                    );
                }
                self.retry(delivery, digest, (delay, cause), elapsed_us)
                    .await
            }
        }
    }

    /// Dead-letter an entry the handler must not get, for `reason`; it stays pending (and
    /// comes back after the failure backoff) while Redis refuses.
    async fn dead_letter_unhandled(
        &self,
        delivery: &Delivery,
        digest: &Digest,
        reason: &str,
    ) -> Settled {
        tracing::warn!(id = %delivery.entry.id, "{reason}");
        if let Some(span) = delivery.trace.as_ref().and_then(|t| t.span.as_ref()) {
            Self::record(
                span,
                &Action::DeadLetter {
                    reason: reason.to_owned(),
                    cut: false,
                },
            );
        }
        let written = self
            .settler
            .dead_letter(delivery, digest, reason, None)
            .await;
        self.settled_dead(delivery, written)
    }

    /// What a dead letter written unhandled came to: done, or, when Redis refused, the entry
    /// stays pending for a later attempt.
    fn settled_dead(
        &self,
        delivery: &Delivery,
        written: Result<bool, crate::pipeline::settle::SettleError>,
    ) -> Settled {
        match written {
            Ok(_) => Settled::Done,
            Err(err) => {
                self.metrics.settle_errors.inc();
                tracing::error!(%err, "cannot dead-letter the entry; it stays pending");
                Settled::RetryPending(self.failure_delay(delivery.delivery_count))
            }
        }
    }

    /// Record what the attempt decided on its (sampled) span.
    fn record(span: &tracing::Span, action: &Action) {
        match action {
            Action::Ack => {
                span.record("outcome", "ack");
            }
            Action::Retry { delay, .. } => {
                span.record("outcome", "retry");
                span.record(
                    "retry_delay_ms",
                    crate::observe::telemetry::number(delay.as_millis()),
                );
            }
            Action::DeadLetter { reason, .. } => {
                span.record("outcome", "dead-letter");
                span.record(
                    "reason",
                    crate::observe::telemetry::bounded(reason).as_str(),
                );
            }
        }
    }

    /// Park the entry for `delay` (with a delayed-retry set) or leave it pending.
    async fn retry(
        &self,
        delivery: &Delivery,
        digest: &Digest,
        (delay, cause): (Duration, String),
        elapsed_us: u64,
    ) -> Result<Settled, SettleError> {
        let delay_ms = delay.as_millis() as u64;
        let elapsed = Duration::from_micros(elapsed_us);
        if self.settler.has_delayed_set() {
            tracing::info!(delay_ms, ?elapsed, "parking for a delayed retry");
            let parked_at = crate::support::clock::now();
            self.settler.park(delivery, digest, delay, cause).await?;
            if crate::observe::telemetry::enabled() {
                trace_park(delivery, parked_at, delay);
            }
            return Ok(Settled::Done);
        }
        tracing::info!(delay_ms, ?elapsed, "retry stays pending");
        self.settler.retry_pending(delivery, digest, delay, cause);
        Ok(Settled::RetryPending(delay))
    }
}

/// The longest wait in the stream an entry's root span shows; an id naming an older time (one
/// the producer chose) starts the root at the first attempt.
const MAX_QUEUED_FOR: Duration = Duration::from_secs(30 * 24 * 3600);

/// The partition a stream key is, when it is one (`name:{name:n}`, see
/// `sluice_descriptor::partition_key`).
fn partition_of(stream: &str) -> Option<u32> {
    let (name, rest) = stream.split_once(":{")?;
    let inner = rest.strip_suffix('}')?;
    let (same, n) = inner.rsplit_once(':')?;
    (same == name).then(|| n.parse().ok()).flatten()
}

/// Put the attempt's span into the entry's trace (see [`crate::observe::telemetry::context`]), and
/// write the spans that only the attempt can: the entry's root on its first delivery, and the
/// sweep that brought a retry back.
fn trace_attempt(
    delivery: &Delivery,
    span: &tracing::Span,
    parent: &crate::observe::telemetry::context::Parent,
) {
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;

    span.record("otel.kind", "consumer");
    span.record("origin_id", delivery.origin_id.as_str());
    span.record(
        "attempt",
        crate::observe::telemetry::number(delivery.previous_attempts() + 1),
    );
    span.record("trace_id", parent.trace_id().as_str());
    if let Some(n) = partition_of(&delivery.stream) {
        span.record("partition", i64::from(n));
    }
    let _ = span.set_parent(parent.context());
    trace_entry_root(delivery, parent);
    trace_sweep(delivery, parent);
}

/// The attributes every span an attempt writes carries.
fn trace_basics(delivery: &Delivery) -> Vec<opentelemetry::KeyValue> {
    use opentelemetry::KeyValue;
    vec![
        KeyValue::new("stream", delivery.stream.clone()),
        KeyValue::new("group", delivery.group.clone()),
        KeyValue::new("origin_id", delivery.origin_id.clone()),
    ]
}

/// The entry's own trace starts with its wait in the stream, written by the first attempt's
/// host (a requeue or a copy is never a first attempt).
fn trace_entry_root(delivery: &Delivery, parent: &crate::observe::telemetry::context::Parent) {
    use crate::observe::telemetry::{self, Whole, context::Parent};
    let Parent::Own(root) = parent else {
        return;
    };
    if delivery.retry_count != 0
        || delivery.delivery_count > 1
        || delivery.origin_id != delivery.entry.id
    {
        return;
    }
    let Some(added) = telemetry::id_time(&delivery.entry.id) else {
        return;
    };
    let now = crate::support::clock::now();
    // An id the producer chose may name any time: then the root starts with the attempt.
    let added = if added > now || now.duration_since(added).unwrap_or_default() > MAX_QUEUED_FOR {
        now
    } else {
        added
    };
    Whole {
        name: "entry",
        start: added,
        end: now,
        attributes: trace_basics(delivery),
    }
    .emit(root, Some(root.span_id()));
}

/// A retry the sweep brought back: its wait from due to moved (the copy's id is the time the
/// sweep added it). A requeue into the lane carries a due time too, but no sweep moved it.
fn trace_sweep(delivery: &Delivery, parent: &crate::observe::telemetry::context::Parent) {
    use crate::observe::telemetry::{self, Whole};
    use opentelemetry::KeyValue;
    let requeued = delivery
        .user_fields()
        .iter()
        .any(|(n, _)| n.as_slice() == crate::store::keys::REQUEUED_FROM.as_bytes());
    let (Some(due), Some(moved), false) = (
        delivery.due_ms,
        telemetry::id_time(&delivery.entry.id),
        requeued,
    ) else {
        return;
    };
    let due_at = telemetry::ms_time(due);
    let lateness = moved.duration_since(due_at).unwrap_or_default();
    let mut attributes = trace_basics(delivery);
    attributes.extend([
        KeyValue::new("due_ms", due),
        KeyValue::new("lateness_ms", lateness.as_millis() as i64),
        KeyValue::new("copy_id", delivery.entry.id.clone()),
        KeyValue::new("retry_count", i64::from(delivery.retry_count)),
    ]);
    Whole {
        name: "sweep",
        start: due_at.min(moved),
        end: moved,
        attributes,
    }
    .emit(parent.span_context(), None);
}

/// The parked wait of an entry this attempt parked: from now to its due time (as this host's
/// clock sees it), a child of the attempt's span.
fn trace_park(delivery: &Delivery, parked_at: std::time::SystemTime, delay: Duration) {
    use opentelemetry::KeyValue;
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;

    let cx = tracing::Span::current().context();
    let attempt = cx.span().span_context().clone();
    if !attempt.is_valid() {
        return;
    }
    let due = parked_at + delay;
    crate::observe::telemetry::Whole {
        name: "parked",
        start: parked_at,
        end: due,
        attributes: vec![
            KeyValue::new("stream", delivery.stream.clone()),
            KeyValue::new("group", delivery.group.clone()),
            KeyValue::new("origin_id", delivery.origin_id.clone()),
            KeyValue::new("delay_ms", delay.as_millis() as i64),
            KeyValue::new(
                "due_ms",
                due.duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_millis() as i64,
            ),
            KeyValue::new("retry_count", i64::from(delivery.retry_count) + 1),
        ],
    }
    .emit(&attempt, None);
}

/// What a handler's result counts as in `sluice_deliveries_total`.
fn handler_result(result: &Result<Outcome, Failure>) -> HandlerResult {
    match result {
        Ok(Outcome::Ack) => HandlerResult::Ack,
        Ok(Outcome::RetryAfter(_) | Outcome::DownstreamDown(..)) => HandlerResult::Retry,
        Ok(Outcome::DeadLetter(_)) => HandlerResult::DeadLetter,
        Err(Failure::Trap(_) | Failure::Raised { .. } | Failure::Instantiate(_)) => {
            HandlerResult::Trap
        }
        Err(
            Failure::Timeout(_)
            | Failure::MemoryLimit { .. }
            | Failure::FuelExhausted(_)
            | Failure::HostLimit(_),
        ) => HandlerResult::Limit,
    }
}

/// What an attempt counts as in a trial.
fn attempt_kind(result: &Result<Outcome, Failure>, action: &Action) -> AttemptKind {
    match (result, action) {
        (Err(_), _) => AttemptKind::Failure,
        (_, Action::Ack) => AttemptKind::Ack,
        (_, Action::Retry { .. }) => AttemptKind::Retry,
        (_, Action::DeadLetter { .. }) => AttemptKind::DeadLetter,
    }
}

/// A failed attempt is logged once: what failed first, its traceback as lines after it. The
/// traceback, for the dead letter.
fn log_failure<'a>(
    result: &'a Result<Outcome, Failure>,
    action: &Action,
    elapsed_us: u64,
) -> Option<&'a str> {
    let failure = result.as_ref().err()?;
    let trace = failure.trace();
    let (text, _) = outcome::bounded_text(&failure.to_string(), outcome::MAX_REASON_BYTES);
    let then = match action {
        Action::DeadLetter { .. } => "dead-lettering",
        _ => "retrying",
    };
    match trace {
        Some(trace) => tracing::warn!(
            elapsed_us,
            "attempt failed; {then}: {text}\n{}",
            outcome::indented(trace)
        ),
        None => tracing::warn!(failure = %text, elapsed_us, "attempt failed; {then}"),
    }
    trace
}

#[cfg(test)]
mod tests {
    #[test]
    fn partitions_are_recognised_by_their_key() {
        assert_eq!(super::partition_of("orders:{orders:3}"), Some(3));
        assert_eq!(super::partition_of("orders"), None);
        assert_eq!(super::partition_of("a:{b:3}"), None);
        assert_eq!(super::partition_of("a:{a:x}"), None);
    }
}
