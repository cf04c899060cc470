//! Running deliveries on a component: instance reuse, limits, and what a failure was.
//!
//! With `isolation = "reuse"` (the default) an instance serves many deliveries, so the guest's
//! state is built once per instance; an instance is dropped after any trap or limit hit and
//! replaced after `recycle_after` deliveries, or once the handles it holds fill three quarters
//! of its resource table (a guest that frees them late would fail its next attempt). With `isolation = "per-delivery"` every delivery
//! gets a fresh store and instance.
//!
//! Every instance holds one of the runtime's instance slots (see [`super::Runtime`]), taken
//! before it is created: waiting for a slot is waiting, never a failed attempt. The slots are
//! the host's, shared by every subscription ([`Slots`]), so an idle instance keeps its slot
//! only while nobody waits for one: a waiter takes the oldest idle instance of any handler
//! off its set (dropping it frees its slot), an instance given back while someone waits is
//! dropped, and one idle for [`IDLE_INSTANCE_TTL`] is dropped anyway, so an idle
//! subscription holds no instance. Slots are granted in order of request, so a busy
//! subscription cannot keep another from its turn. A handler that a swap replaced is retired:
//! its idle instances are dropped at once and its busy ones when they finish, so the outgoing
//! version never keeps slots the new one needs.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use futures::future::BoxFuture;
use wasmtime::Store;

use super::EPOCH_TICK;
use super::bindings::{self, sluice::handler::types as wit};
use super::component::LoadedComponent;
use super::guest::{GuestState, StoreLimits, new_store};
use super::http::HttpGrant;
use crate::config::{Isolation, Limits};
use crate::entry::delivery::Delivery;
use crate::entry::outcome::{Failure, Outcome};
use crate::handler::{Handler, HandlerCounters};
use crate::support::digest::Digest;

/// How long an idle instance is kept warm when no one needs its slot.
pub const IDLE_INSTANCE_TTL: Duration = Duration::from_secs(30);

/// The host's instance slots, shared by every subscription, and the idle instances that hold
/// some of them.
pub(crate) struct Slots {
    permits: Arc<Semaphore>,
    /// Instances waiting for a slot now.
    waiting: AtomicUsize,
    /// Every handler's idle set (dead ones are pruned as they are met).
    idle: Mutex<Vec<Weak<IdleSet>>>,
}

/// Counts a waiter for as long as it waits.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Slots {
    /// `slots` slots, as many as the pool has.
    pub(crate) fn new(slots: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(slots)),
            waiting: AtomicUsize::new(0),
            idle: Mutex::new(Vec::new()),
        }
    }

    /// A free slot, or the slot of the oldest idle instance, or, when every slot is busy, the
    /// next one that frees (in order of request).
    pub(crate) async fn acquire(&self) -> Option<OwnedSemaphorePermit> {
        if let Ok(permit) = self.permits.clone().try_acquire_owned() {
            return Some(permit);
        }
        // Counted as waiting before looking for idle instances: an instance given back from
        // now on sees the waiter and is dropped, one given back before is found here.
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(&self.waiting);
        loop {
            if let Ok(permit) = self.permits.clone().try_acquire_owned() {
                return Some(permit);
            }
            if !self.evict_oldest() {
                break;
            }
        }
        self.permits.clone().acquire_owned().await.ok()
    }

    /// Whether an instance waits for a slot.
    fn wanted(&self) -> bool {
        self.waiting.load(Ordering::SeqCst) > 0
    }

    fn register(&self, set: &Arc<IdleSet>) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        idle.retain(|w| w.strong_count() > 0);
        idle.push(Arc::downgrade(set));
    }

    fn sets(&self) -> Vec<Arc<IdleSet>> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        idle.retain(|w| w.strong_count() > 0);
        idle.iter().filter_map(Weak::upgrade).collect()
    }

    /// Drop the instance idle the longest, of any handler; false if none is idle.
    fn evict_oldest(&self) -> bool {
        let oldest = self
            .sets()
            .into_iter()
            .filter_map(|set| set.oldest().map(|since| (since, set)))
            .min_by_key(|(since, _)| *since);
        match oldest {
            Some((_, set)) => {
                // Another waiter may have taken it meanwhile: then look again.
                drop(set.take_oldest());
                true
            }
            None => false,
        }
    }

    /// Drop every instance idle for longer than `ttl`.
    pub(crate) fn expire_idle(&self, ttl: Duration) {
        let Some(before) = Instant::now().checked_sub(ttl) else {
            return;
        };
        for set in self.sets() {
            drop(set.take_idle_since(before));
        }
    }
}

/// A handler's idle instances, newest last, each with when it became idle.
#[derive(Default)]
pub(crate) struct IdleSet {
    instances: Mutex<Vec<(Instance, Instant)>>,
}

impl IdleSet {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(Instance, Instant)>> {
        self.instances
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, instance: Instance) {
        self.lock().push((instance, Instant::now()));
    }

    /// The warmest: the one idle the shortest.
    fn pop(&self) -> Option<Instance> {
        self.lock().pop().map(|(instance, _)| instance)
    }

    fn oldest(&self) -> Option<Instant> {
        self.lock().first().map(|(_, since)| *since)
    }

    fn take_oldest(&self) -> Option<Instance> {
        let mut instances = self.lock();
        (!instances.is_empty()).then(|| instances.remove(0).0)
    }

    /// The instances idle since before `before`, taken out (dropped by the caller, outside the
    /// lock).
    fn take_idle_since(&self, before: Instant) -> Vec<Instance> {
        let mut instances = self.lock();
        let keep = instances.partition_point(|(_, since)| *since < before);
        instances.drain(..keep).map(|(i, _)| i).collect()
    }

    fn clear(&self) -> Vec<Instance> {
        self.lock().drain(..).map(|(i, _)| i).collect()
    }
}

struct Instance {
    store: Store<GuestState>,
    handler: bindings::Handler,
    uses: u64,
    /// The runtime's instance slot this instance occupies, given back when it is dropped.
    _slot: Option<OwnedSemaphorePermit>,
    /// Its place in its handler's own share of instances (see [`WasmHandler::budget`]).
    _budget: Option<OwnedSemaphorePermit>,
}

/// A component serving one subscription's deliveries.
pub struct WasmHandler {
    component: LoadedComponent,
    limits: Limits,
    values: Arc<[(String, String)]>,
    http: Arc<HttpGrant>,
    store_limits: Arc<StoreLimits>,
    idle: Arc<IdleSet>,
    /// The instances this handler may hold at once, busy or idle: its share of the runtime's
    /// slots (`max_in_flight + 1`). A subscription's partitions share one handler and may have
    /// more deliveries in flight than that; those wait for an instance to come back instead of
    /// waiting for a slot that idle instances hold (which once stalled partitions for good).
    budget: Arc<tokio::sync::Semaphore>,
    /// An instance was given back to `idle`.
    returned: tokio::sync::Notify,
    retired: AtomicBool,
}

impl WasmHandler {
    /// A handler for `component` with these limits; `values` are the config values the guest
    /// can read, and `counters` the subscription's series of what it refuses.
    pub fn new(
        component: LoadedComponent,
        limits: Limits,
        values: Vec<(String, String)>,
        counters: HandlerCounters,
    ) -> Self {
        let share = limits.max_in_flight + 1;
        let idle = Arc::new(IdleSet::default());
        if let Some(slots) = component.runtime().slots() {
            slots.register(&idle);
        }
        Self {
            http: Arc::new(HttpGrant {
                policy: limits.outbound_http.clone(),
                denied: counters.http_denied,
                protected: component.runtime().protected().clone(),
            }),
            store_limits: Arc::new(StoreLimits {
                memory: limits.memory_limit,
                host_memory: limits.host_memory_limit,
                log_lines: limits.log_lines,
                log_bytes: limits.log_bytes,
                log_dropped: counters.log_dropped,
            }),
            component,
            limits,
            values: values.into(),
            idle,
            budget: Arc::new(Semaphore::new(share)),
            returned: tokio::sync::Notify::new(),
            retired: AtomicBool::new(false),
        }
    }

    /// The component this handler runs.
    pub fn component(&self) -> &LoadedComponent {
        &self.component
    }

    async fn instantiate(&self, budget: Option<OwnedSemaphorePermit>) -> Result<Instance, Failure> {
        let runtime = self.component.runtime();
        let slot = runtime.instance_slot().await;
        let mut store = new_store(
            runtime,
            self.values.clone(),
            self.store_limits.clone(),
            self.http.clone(),
        );
        store.data_mut().deadline = Some(Instant::now() + self.limits.handler_timeout);
        let handler = self
            .component
            .pre()
            .instantiate_async(&mut store)
            .await
            .map_err(|e| Failure::Instantiate(format!("{e:#}")))?;
        Ok(Instance {
            store,
            handler,
            uses: 0,
            _slot: slot,
            _budget: budget,
        })
    }

    fn take_idle(&self) -> Option<Instance> {
        match self.limits.isolation {
            Isolation::PerDelivery => None,
            Isolation::Reuse => self.idle.pop(),
        }
    }

    fn give_back(&self, mut instance: Instance) {
        if self.limits.isolation != Isolation::Reuse
            || instance.uses >= self.limits.recycle_after
            || self.retired.load(Ordering::Acquire)
            || instance.store.data_mut().table_nearly_full()
        {
            return;
        }
        self.idle.push(instance);
        // Pushed before looking: a waiter that counted itself after this look finds the
        // instance in the set instead (see `Slots::acquire`).
        if let Some(slots) = self.component.runtime().slots()
            && slots.wanted()
        {
            drop(self.idle.take_oldest());
        }
        self.returned.notify_one();
    }

    /// An idle instance, or a new one once this handler's share has room, whichever comes
    /// first.
    async fn instance(&self) -> Result<Instance, Failure> {
        loop {
            if let Some(instance) = self.take_idle() {
                return Ok(instance);
            }
            tokio::select! {
                permit = self.budget.clone().acquire_owned() => {
                    return self.instantiate(permit.ok()).await;
                }
                () = self.returned.notified() => {}
            }
        }
    }

    async fn call(&self, delivery: &Delivery) -> Result<Outcome, Failure> {
        let fields = match wit_fields(delivery) {
            Ok(fields) => fields,
            // Nothing a retry could change: the handler can never be given this entry.
            Err(reason) => return Ok(Outcome::DeadLetter(reason)),
        };
        let request = to_wit(delivery, &fields);
        let mut instance = self.instance().await?;
        let span = self.prepare(&mut instance, delivery);

        // Epoch interruption stops a guest that runs past its deadline, but not one waiting in
        // a host call (an HTTP response, a WASI sleep): the timer covers those. Dropping the
        // call mid-way leaves the instance unusable, so it is dropped too.
        let limit_at = tokio::time::Instant::now() + self.limits.handler_timeout + EPOCH_TICK;
        // A handler that never waits on the host ends in its first poll: no timer is set for it
        // (one per delivery was a measurable share of a light handler's cost, issue 50).
        let result = {
            let mut call =
                std::pin::pin!(instance.handler.call_handle(&mut instance.store, request));
            match futures::poll!(call.as_mut()) {
                std::task::Poll::Ready(result) => Some(result),
                std::task::Poll::Pending => tokio::time::timeout_at(limit_at, call).await.ok(),
            }
        };
        let Some(result) = result else {
            return Err(Failure::Timeout(self.limits.handler_timeout));
        };
        self.finish(&mut instance, span.as_ref());
        match result {
            Ok(outcome) => {
                let downstream = instance.store.data_mut().downstream_down.take();
                instance.uses += 1;
                self.give_back(instance);
                Ok(match (from_wit(outcome), downstream) {
                    (Outcome::RetryAfter(delay), Some(why)) => Outcome::DownstreamDown(delay, why),
                    (outcome, _) => outcome,
                })
            }
            // The instance may be in any state after a trap: drop it.
            Err(err) => Err(self.classify(&err, instance.store.data())),
        }
    }

    /// Sets `instance` up for one delivery: its deadline, budgets and trace; on the attempt's
    /// span (when traced) the limits it runs under. The span, when traced.
    fn prepare(&self, instance: &mut Instance, delivery: &Delivery) -> Option<tracing::Span> {
        {
            let state = instance.store.data_mut();
            state.deadline = Some(Instant::now() + self.limits.handler_timeout);
            state.timed_out = false;
            state.panic_message = None;
            state.limiter.denied = None;
            state.reset_log_budget(delivery.trace.clone());
            let identity = state
                .http_hooks
                .keys_calls()
                .then(|| super::effects::CallIdentity::of(delivery));
            let journal = delivery.journal.as_ref().and_then(|journal| {
                let policy = state.http_hooks.grant.policy.journal.clone()?;
                let key = crate::store::effects::key(
                    &delivery.stream,
                    &delivery.group,
                    &delivery.origin_id,
                    delivery.effects_epoch(),
                );
                let first = delivery.delivery_count <= 1
                    && delivery.retry_count == 0
                    && !delivery
                        .user_fields()
                        .iter()
                        .any(|(n, _)| n == crate::store::keys::REQUEUED_FROM.as_bytes());
                if !first {
                    // An earlier attempt may have left a journal: the ack deletes it, whether or
                    // not this attempt reads it.
                    journal.mark_used();
                }
                Some(Arc::new(super::journal::AttemptJournal::new(
                    journal.clone(),
                    key,
                    policy,
                    first && !journal.offline,
                )))
            });
            state.http_hooks.begin(identity, journal);
        }
        instance.store.set_epoch_deadline(1);
        // On the attempt's span (the delivery's), when traced: the limits it ran under.
        let traced = instance
            .store
            .data()
            .http_hooks
            .trace
            .as_ref()
            .is_some_and(|t| t.span.is_some());
        // Looked up only when traced: finding the current span costs a registry lookup.
        let span = traced.then(tracing::Span::current);
        if let Some(span) = &span {
            span.record(
                "time_limit_ms",
                crate::observe::telemetry::number(self.limits.handler_timeout.as_millis()),
            );
        }
        if self.component.runtime().fuel_enabled() {
            let _ = instance
                .store
                .set_fuel(self.limits.fuel.unwrap_or(u64::MAX));
        }
        span
    }

    /// After the call: the attempt's span ends with the attempt (not when the instance is next
    /// used) and says how much memory it took; dropped guest log lines are reported once.
    fn finish(&self, instance: &mut Instance, span: Option<&tracing::Span>) {
        let hooks = &mut instance.store.data_mut().http_hooks;
        hooks.trace = None;
        hooks.begin(None, None);
        if let Some(span) = &span {
            span.record(
                "memory_bytes",
                crate::observe::telemetry::number(instance.store.data().limiter.peak),
            );
        }
        let dropped = instance.store.data().log.dropped;
        if dropped > 0 {
            tracing::warn!(
                target: "sluice::guest",
                dropped,
                "guest log lines dropped by this delivery's log budget"
            );
        }
    }

    fn classify(&self, err: &wasmtime::Error, state: &GuestState) -> Failure {
        let failure = self.classify_limits(err, state);
        // A limit ended the attempt, but the guest said something first (a MemoryError it
        // caught too late): keep what it said in the log.
        if !matches!(failure, Failure::Raised { .. })
            && let Some((error, trace)) = &state.panic_message
        {
            match trace {
                Some(trace) => tracing::warn!(
                    target: "sluice::guest",
                    "before it failed, the guest reported: {error}\n{}",
                    crate::entry::outcome::indented(trace)
                ),
                None => tracing::warn!(
                    target: "sluice::guest",
                    "before it failed, the guest reported: {error}"
                ),
            }
        }
        failure
    }

    fn classify_limits(&self, err: &wasmtime::Error, state: &GuestState) -> Failure {
        if state.timed_out {
            return Failure::Timeout(self.limits.handler_timeout);
        }
        if let Some((limit, requested)) = state.limiter.denied {
            return Failure::MemoryLimit { limit, requested };
        }
        if let Some(limit) = state.host_limit(err) {
            return Failure::HostLimit(limit);
        }
        if let (Some(wasmtime::Trap::OutOfFuel), Some(fuel)) =
            (err.downcast_ref::<wasmtime::Trap>(), self.limits.fuel)
        {
            return Failure::FuelExhausted(fuel);
        }
        // The root cause says what happened (a host call's own error); the outer layer is only
        // "error while executing" with a backtrace.
        let trap = err
            .downcast_ref::<wasmtime::Trap>()
            .map(|t| t.to_string())
            .unwrap_or_else(|| err.root_cause().to_string());
        match &state.panic_message {
            // What the guest said it was: the trap that followed (`unreachable`) adds nothing.
            Some((error, trace)) => Failure::Raised {
                error: error.clone(),
                trace: trace.clone(),
            },
            None => Failure::Trap(trap),
        }
    }
}

impl Handler for WasmHandler {
    fn digest(&self) -> &Digest {
        self.component.digest()
    }

    fn retire(&self) {
        self.retired.store(true, Ordering::Release);
        drop(self.idle.clear());
    }

    fn activate(&self) {
        self.retired.store(false, Ordering::Release);
    }

    fn handle<'a>(&'a self, delivery: &'a Delivery) -> BoxFuture<'a, Result<Outcome, Failure>> {
        Box::pin(self.call(delivery))
    }
}

/// The delivery's fields as the WIT record takes them, borrowed from the entry (wasmtime copies
/// them into the guest's memory once, when it lowers the call), or why they cannot be: the
/// world gives field names as text, so an entry with a field name that is not UTF-8 cannot
/// reach a WASM handler.
fn wit_fields(delivery: &Delivery) -> Result<Vec<(&str, &[u8])>, String> {
    let mut fields = Vec::with_capacity(delivery.user_fields().len());
    for (name, value) in delivery.user_fields() {
        let Ok(name) = std::str::from_utf8(name) else {
            return Err(format!(
                "field name 0x{} is not valid UTF-8; WASM handlers receive field names as text, so this entry cannot be handed to one",
                hex::encode(&name[..name.len().min(64)])
            ));
        };
        fields.push((name, value.as_slice()));
    }
    Ok(fields)
}

/// The delivery as the WIT record, borrowing from it and from its `fields`.
fn to_wit<'a>(delivery: &'a Delivery, fields: &'a [(&'a str, &'a [u8])]) -> wit::Delivery<'a> {
    wit::Delivery {
        stream: &delivery.stream,
        group: &delivery.group,
        id: &delivery.entry.id,
        fields,
        retry_count: delivery.retry_count,
        delivery_count: delivery.delivery_count,
        origin_id: &delivery.origin_id,
    }
}

fn from_wit(outcome: wit::Outcome) -> Outcome {
    match outcome {
        wit::Outcome::Ack => Outcome::Ack,
        wit::Outcome::RetryAfter(ms) => Outcome::RetryAfter(std::time::Duration::from_millis(ms)),
        wit::Outcome::DeadLetter(reason) => Outcome::DeadLetter(reason),
    }
}
