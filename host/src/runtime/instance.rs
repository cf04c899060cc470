//! Running deliveries on a component: instance reuse, limits, and what a failure was.
//!
//! With `isolation = "reuse"` (the default) an instance serves many deliveries, so the guest's
//! state is built once per instance; an instance is dropped after any trap or limit hit and
//! replaced after `recycle_after` deliveries. With `isolation = "per-delivery"` every delivery
//! gets a fresh store and instance.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::future::BoxFuture;
use wasmtime::{Store, UpdateDeadline};

use super::EPOCH_TICK;
use super::bindings::{self, sluice::handler::types as wit};
use super::component::LoadedComponent;
use super::guest::GuestState;
use super::http::HttpGrant;
use crate::config::{Isolation, Limits};
use crate::delivery::Delivery;
use crate::dispatch::Handler;
use crate::outcome::{Failure, Outcome};

/// A store set up with the memory limit and the epoch callback that enforces deadlines.
pub(crate) fn new_store(
    runtime: &super::Runtime,
    values: Arc<[(String, String)]>,
    memory_limit: u64,
    http: Arc<HttpGrant>,
) -> Store<GuestState> {
    let mut store = Store::new(
        runtime.engine(),
        GuestState::new(values, memory_limit, http),
    );
    store.limiter(|state| &mut state.limiter);
    store.epoch_deadline_callback(|mut ctx| {
        let state = ctx.data_mut();
        match state.deadline {
            Some(deadline) if Instant::now() >= deadline => {
                state.timed_out = true;
                Ok(UpdateDeadline::Interrupt)
            }
            // Yield at every tick so a busy guest never holds an executor thread for long.
            _ => Ok(UpdateDeadline::Yield(1)),
        }
    });
    store.set_epoch_deadline(1);
    // With fuel metering on, a store starts empty; only deliveries are budgeted.
    if runtime.fuel_enabled() {
        let _ = store.set_fuel(u64::MAX);
    }
    store
}

struct Instance {
    store: Store<GuestState>,
    handler: bindings::Handler,
    uses: u64,
}

/// A component serving one subscription's deliveries.
pub struct WasmHandler {
    component: LoadedComponent,
    limits: Limits,
    values: Arc<[(String, String)]>,
    http: Arc<HttpGrant>,
    idle: Mutex<Vec<Instance>>,
}

impl WasmHandler {
    /// A handler for `component` with these limits; `values` are the config values the guest
    /// can read, and `http_denied` counts its requests refused by `allowed_outbound_hosts` (a
    /// subscription's series of `sluice_http_denied_total`).
    pub fn new(
        component: LoadedComponent,
        limits: Limits,
        values: Vec<(String, String)>,
        http_denied: prometheus_client::metrics::counter::Counter,
    ) -> Self {
        Self {
            component,
            http: Arc::new(HttpGrant {
                policy: limits.outbound_http.clone(),
                denied: http_denied,
            }),
            limits,
            values: values.into(),
            idle: Mutex::new(Vec::new()),
        }
    }

    /// The component this handler runs.
    pub fn component(&self) -> &LoadedComponent {
        &self.component
    }

    async fn instantiate(&self) -> Result<Instance, Failure> {
        let runtime = self.component.runtime();
        let mut store = new_store(
            runtime,
            self.values.clone(),
            self.limits.memory_limit,
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
        })
    }

    fn take_idle(&self) -> Option<Instance> {
        match self.limits.isolation {
            Isolation::PerDelivery => None,
            Isolation::Reuse => self.idle.lock().ok().and_then(|mut idle| idle.pop()),
        }
    }

    fn give_back(&self, instance: Instance) {
        if self.limits.isolation == Isolation::Reuse
            && instance.uses < self.limits.recycle_after
            && let Ok(mut idle) = self.idle.lock()
        {
            idle.push(instance);
        }
    }

    async fn call(&self, delivery: &Delivery) -> Result<Outcome, Failure> {
        let mut instance = match self.take_idle() {
            Some(instance) => instance,
            None => self.instantiate().await?,
        };
        {
            let state = instance.store.data_mut();
            state.deadline = Some(Instant::now() + self.limits.handler_timeout);
            state.timed_out = false;
            state.panic_message = None;
            state.limiter.denied = None;
        }
        instance.store.set_epoch_deadline(1);
        if self.component.runtime().fuel_enabled() {
            let _ = instance
                .store
                .set_fuel(self.limits.fuel.unwrap_or(u64::MAX));
        }
        let request = to_wit(delivery);
        // Epoch interruption stops a guest that runs past its deadline, but not one waiting in
        // a host call (an HTTP response, a WASI sleep): the timer covers those. Dropping the
        // call mid-way leaves the instance unusable, so it is dropped too.
        let call = instance.handler.call_handle(&mut instance.store, &request);
        let Ok(result) = tokio::time::timeout(self.limits.handler_timeout + EPOCH_TICK, call).await
        else {
            return Err(Failure::Timeout(self.limits.handler_timeout));
        };
        match result {
            Ok(outcome) => {
                instance.uses += 1;
                self.give_back(instance);
                Ok(from_wit(outcome))
            }
            // The instance may be in any state after a trap: drop it.
            Err(err) => Err(self.classify(&err, instance.store.data())),
        }
    }

    fn classify(&self, err: &wasmtime::Error, state: &GuestState) -> Failure {
        if state.timed_out {
            return Failure::Timeout(self.limits.handler_timeout);
        }
        if let Some((limit, requested)) = state.limiter.denied {
            return Failure::MemoryLimit { limit, requested };
        }
        if let (Some(wasmtime::Trap::OutOfFuel), Some(fuel)) =
            (err.downcast_ref::<wasmtime::Trap>(), self.limits.fuel)
        {
            return Failure::FuelExhausted(fuel);
        }
        let trap = err
            .downcast_ref::<wasmtime::Trap>()
            .map(|t| t.to_string())
            .unwrap_or_else(|| format!("{err}"));
        match &state.panic_message {
            Some(panic) => Failure::Trap(format!("{panic} ({trap})")),
            None => Failure::Trap(trap),
        }
    }
}

impl Handler for WasmHandler {
    fn digest(&self) -> &str {
        self.component.digest()
    }

    fn handle<'a>(&'a self, delivery: &'a Delivery) -> BoxFuture<'a, Result<Outcome, Failure>> {
        Box::pin(self.call(delivery))
    }
}

fn to_wit(delivery: &Delivery) -> wit::Delivery {
    wit::Delivery {
        stream: delivery.stream.clone(),
        group: delivery.group.clone(),
        id: delivery.entry.id.clone(),
        fields: delivery.entry.user_fields().cloned().collect(),
        retry_count: delivery.retry_count,
        delivery_count: delivery.delivery_count,
    }
}

fn from_wit(outcome: wit::Outcome) -> Outcome {
    match outcome {
        wit::Outcome::Ack => Outcome::Ack,
        wit::Outcome::RetryAfter(ms) => Outcome::RetryAfter(std::time::Duration::from_millis(ms)),
        wit::Outcome::DeadLetter(reason) => Outcome::DeadLetter(reason),
    }
}
