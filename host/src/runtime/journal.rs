//! The journal of an attempt's outbound calls (`effects = "journal"`): a call whose response
//! the subscription records (a 2xx by default) is written to Redis before the guest sees the
//! response; a later attempt of the same entry that makes the same call at the same position
//! (same method, URL and body) gets the recorded response without touching the network. A call
//! at a position the journal holds nothing for goes out live; the first call that differs from
//! the record at its position ends replay for the attempt: from there every call is live (and
//! recorded again, what the earlier attempt recorded past that point and this one did not
//! replay dropped). Joined calls are matched each at its own position, whatever order they
//! start in.
//!
//! Bounds, each on every call: a request body over [`MAX_REQUEST_BODY`] or a response over
//! `journal_max_response_bytes` is not recorded (the call stays live on the next attempt); one
//! entry's journal holds at most `journal_max_calls` calls and `journal_max_entry_bytes` bytes.
//! A hostile guest therefore grows Redis by at most those per entry it handles.
//!
//! Redis away: a journal that cannot be read is no journal (every call live, logged); a record
//! that cannot be written leaves the call live on the next attempt (logged). The call itself
//! is never refused for the journal's sake.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt as _;
use sha2::{Digest as _, Sha256};
use wasmtime_wasi_http::{Error as HttpError, WasiBody};

use crate::config::allow::JournalPolicy;
use crate::store::effects::{DeliveryJournal, Record};

/// The largest request body a journaled call buffers to compare it with the record: a bigger
/// one goes out streamed, unrecorded.
pub const MAX_REQUEST_BODY: usize = 1024 * 1024;

/// What a call's connection still has to do once its response is handed over.
pub(crate) type IoFuture = Box<dyn Future<Output = Result<(), HttpError>> + Send>;

/// A sent call: the response, and its connection's I/O.
pub(crate) type Sent = Result<(http::Response<WasiBody>, IoFuture), HttpError>;

/// One attempt's use of its entry's journal.
pub(crate) struct AttemptJournal {
    delivery: Arc<DeliveryJournal>,
    key: String,
    policy: JournalPolicy,
    /// The entry's first delivery ever: it has no journal yet, so none is read.
    first: bool,
    state: tokio::sync::Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The journal as the attempt found it (loaded at its first call).
    found: Option<HashMap<u32, Record>>,
    /// Replay ended (a call did not match, or the journal could not be read).
    live: bool,
    /// What earlier attempts recorded past where this one went another way.
    stale: Vec<u32>,
    /// Positions this attempt replayed (never stale).
    replayed: std::collections::HashSet<u32>,
    /// Calls and bytes recorded, this attempt and earlier ones.
    calls: u32,
    bytes: u64,
}

impl AttemptJournal {
    /// The journal at `key` for an attempt of `delivery`'s entry; `first` when the entry was
    /// never delivered before (no retry, no redelivery, no requeue), which then reads nothing.
    pub(crate) fn new(
        delivery: Arc<DeliveryJournal>,
        key: String,
        policy: JournalPolicy,
        first: bool,
    ) -> Self {
        Self {
            delivery,
            key,
            policy,
            first,
            state: tokio::sync::Mutex::new(State::default()),
        }
    }

    /// Send call number `call` through the journal: the recorded response when it matches,
    /// else `live` sends it, and the response is recorded when the policy allows.
    pub(crate) async fn send<F, Fut>(
        self: Arc<Self>,
        call: u32,
        request: http::Request<WasiBody>,
        live: F,
    ) -> Sent
    where
        F: FnOnce(http::Request<WasiBody>) -> Fut,
        Fut: Future<Output = Sent>,
    {
        let (parts, body) = request.into_parts();
        let (body, sha) = match read_limited(body, MAX_REQUEST_BODY).await {
            Read::Complete(bytes) => {
                let sha: [u8; 32] = Sha256::digest(&bytes).into();
                (full(bytes), Some(sha))
            }
            Read::Over { prefix, rest } => (chain(prefix, rest), None),
            Read::Failed { prefix, err } => (failing(prefix, err), None),
        };
        let request = http::Request::from_parts(parts, body);
        let method = request.method().to_string();
        let url = request.uri().to_string();
        if let Some(sha) = sha
            && let Some(replayed) = self.replay(call, &method, &url, &sha).await
        {
            return Ok(replayed);
        }
        if self.delivery.offline {
            self.delivery.store.counters.not_in_journal.inc();
            self.delivery.note_missed();
            return Err(HttpError::InternalError(Some(format!(
                "sluice replay: call {call} ({method} {url}) is not in the entry's journal, and a replay makes no call over the network"
            ))));
        }
        let sent = live(request).await?;
        let Some(sha) = sha else {
            self.delivery.store.counters.too_big.inc();
            tracing::debug!(target: "sluice::http", call, %url, "journal: request body over {MAX_REQUEST_BODY} bytes, not recorded");
            return Ok(sent);
        };
        Ok(self.record(call, (method, url, sha), sent).await)
    }

    /// The recorded response of call `call`, if the attempt is still replaying and the call
    /// matches; otherwise replay ends here.
    async fn replay(
        &self,
        call: u32,
        method: &str,
        url: &str,
        sha: &[u8; 32],
    ) -> Option<(http::Response<WasiBody>, IoFuture)> {
        let mut state = self.state.lock().await;
        if state.found.is_none() && self.first {
            state.found = Some(HashMap::new());
        }
        if state.found.is_none() {
            let found = match self
                .delivery
                .store
                .load(&self.key, self.policy.max_calls)
                .await
            {
                Ok(found) => found,
                Err(err) => {
                    self.delivery.store.counters.unreadable.inc();
                    tracing::warn!(target: "sluice::http", %err, "journal: cannot read the entry's journal; every call of this attempt goes out live");
                    state.live = true;
                    HashMap::new()
                }
            };
            if !found.is_empty() {
                self.delivery.mark_used();
            }
            state.calls = found.len() as u32;
            state.bytes = found.values().map(Record::size).sum();
            state.found = Some(found);
        }
        if state.live {
            return None;
        }
        let found = state.found.as_ref()?;
        match found.get(&call) {
            Some(r) if r.method == method && r.url == url && &r.body_sha256 == sha => {
                self.delivery.store.counters.replayed.inc();
                tracing::debug!(target: "sluice::http", call, %url, status = r.status, "journal: replayed");
                let response = response_of(r);
                state.replayed.insert(call);
                Some((response, Box::new(async { Ok(()) })))
            }
            // Nothing recorded here (it failed, or it is new): live, replay goes on.
            None => None,
            Some(r) => {
                self.delivery.store.counters.diverged.inc();
                tracing::warn!(
                    target: "sluice::http",
                    call,
                    recorded = %format!("{} {}", r.method, r.url),
                    now = %format!("{method} {url}"),
                    "journal: this attempt's call differs from the recorded one; replay ends here, every call from now on goes out live"
                );
                let mut stale: Vec<u32> = found
                    .keys()
                    .copied()
                    .filter(|p| *p >= call && !state.replayed.contains(p))
                    .collect();
                stale.sort_unstable();
                let dropped: u64 = stale
                    .iter()
                    .filter_map(|p| found.get(p))
                    .map(Record::size)
                    .sum();
                state.calls = state.calls.saturating_sub(stale.len() as u32);
                state.bytes = state.bytes.saturating_sub(dropped);
                state.stale = stale;
                state.live = true;
                None
            }
        }
    }

    /// Record `sent` (the response to call `call`) when its status is recorded and the
    /// bounds allow; the response goes on to the guest either way.
    async fn record(
        &self,
        call: u32,
        (method, url, sha): (String, String, [u8; 32]),
        (response, io): (http::Response<WasiBody>, IoFuture),
    ) -> (http::Response<WasiBody>, IoFuture) {
        let status = response.status().as_u16();
        if !self.policy.records(status) {
            return (response, io);
        }
        let headers: Vec<(String, Vec<u8>)> = response
            .headers()
            .iter()
            .filter(|(n, _)| !HOP_BY_HOP.contains(&n.as_str()))
            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
            .collect();
        let header_bytes: usize = headers.iter().map(|(n, v)| n.len() + v.len()).sum();
        let limit = (self.policy.max_response_bytes as usize).saturating_sub(header_bytes);
        let (parts, body) = response.into_parts();
        let (read, io) = read_driving(body, limit, io).await;
        let bytes = match read {
            Read::Complete(bytes) => bytes,
            Read::Over { prefix, rest } => {
                self.delivery.store.counters.too_big.inc();
                tracing::debug!(target: "sluice::http", call, %url, "journal: response over journal_max_response_bytes, not recorded");
                return (http::Response::from_parts(parts, chain(prefix, rest)), io);
            }
            Read::Failed { prefix, err } => {
                return (http::Response::from_parts(parts, failing(prefix, err)), io);
            }
        };
        let record = Record {
            method,
            url,
            body_sha256: sha,
            status,
            headers,
            body: bytes.to_vec(),
        };
        self.write(call, &record).await;
        (http::Response::from_parts(parts, full(bytes)), io)
    }

    /// Write `record` as call `call` if the entry's journal has room.
    async fn write(&self, call: u32, record: &Record) {
        let mut state = self.state.lock().await;
        let size = record.size();
        if state.calls >= self.policy.max_calls
            || state.bytes.saturating_add(size) > self.policy.max_entry_bytes
        {
            self.delivery.store.counters.journal_full.inc();
            tracing::debug!(target: "sluice::http", call, "journal: the entry's journal is full (journal_max_calls or journal_max_entry_bytes), not recorded");
            return;
        }
        let stale = std::mem::take(&mut state.stale);
        match self
            .delivery
            .store
            .record(&self.key, call, record, &stale)
            .await
        {
            Ok(()) => {
                state.calls += 1;
                state.bytes += size;
                self.delivery.mark_used();
                self.delivery.store.counters.recorded.inc();
            }
            Err(err) => {
                state.stale = stale;
                self.delivery.store.counters.write_failed.inc();
                tracing::warn!(target: "sluice::http", call, %err, "journal: cannot record the call; it goes out live again on the next attempt");
            }
        }
    }
}

/// Headers that belong to one connection, never to a recorded response.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "proxy-connection",
];

/// A recorded response, as the guest receives it.
fn response_of(record: &Record) -> http::Response<WasiBody> {
    let mut response = http::Response::new(full(Bytes::from(record.body.clone())));
    *response.status_mut() =
        http::StatusCode::from_u16(record.status).unwrap_or(http::StatusCode::OK);
    for (name, value) in &record.headers {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_bytes(value),
        ) {
            response.headers_mut().append(name, value);
        }
    }
    response
}

/// What reading a body up to a limit found.
enum Read {
    /// All of it.
    Complete(Bytes),
    /// More than the limit: what was read, and the rest unread.
    Over { prefix: Bytes, rest: WasiBody },
    /// It failed after `prefix`.
    Failed { prefix: Bytes, err: HttpError },
}

/// Read `body` to its end if it is at most `limit` bytes.
async fn read_limited(mut body: WasiBody, limit: usize) -> Read {
    let mut buf = bytes::BytesMut::new();
    loop {
        match body.frame().await {
            None => return Read::Complete(buf.freeze()),
            Some(Err(err)) => {
                return Read::Failed {
                    prefix: buf.freeze(),
                    err,
                };
            }
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    buf.extend_from_slice(&data);
                    if buf.len() > limit {
                        return Read::Over {
                            prefix: buf.freeze(),
                            rest: body,
                        };
                    }
                }
            }
        }
    }
}

/// [`read_limited`] on a response, driving its connection's I/O meanwhile (the body arrives
/// only while the connection is polled); what is left of the I/O comes back with it.
async fn read_driving(body: WasiBody, limit: usize, io: IoFuture) -> (Read, IoFuture) {
    let mut io: Pin<IoFuture> = Box::into_pin(io);
    let read = read_limited(body, limit);
    tokio::pin!(read);
    let mut io_done = None;
    let read = loop {
        tokio::select! {
            read = &mut read => break read,
            done = &mut io, if io_done.is_none() => io_done = Some(done),
        }
    };
    let rest: IoFuture = match io_done {
        Some(done) => Box::new(async move { done }),
        None => Box::new(io),
    };
    (read, rest)
}

/// A body of `bytes`.
fn full(bytes: Bytes) -> WasiBody {
    http_body_util::Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// `prefix`, then the rest of a body.
fn chain(prefix: Bytes, rest: WasiBody) -> WasiBody {
    use futures::StreamExt as _;
    let first = futures::stream::once(async move { Ok(http_body::Frame::data(prefix)) });
    let rest = http_body_util::BodyStream::new(rest);
    http_body_util::StreamBody::new(first.chain(rest)).boxed_unsync()
}

/// `prefix`, then `err`.
fn failing(prefix: Bytes, err: HttpError) -> WasiBody {
    let frames = vec![Ok(http_body::Frame::data(prefix)), Err(err)];
    http_body_util::StreamBody::new(futures::stream::iter(frames)).boxed_unsync()
}
