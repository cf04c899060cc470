//! Traces (issue 29): the host exports its spans over OTLP to a collector — here receivers in
//! the test, built on `opentelemetry-proto`'s types, over HTTP/protobuf and gRPC — one trace
//! per entry across attempts, parked waits, sweeps, a SIGKILL and a requeue, with the guest's
//! outbound requests as child spans; a collector that is not there changes nothing for
//! deliveries.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;

use crate::common::*;

/// How long a span may take to reach the receiver (the batch delay is cut to 100 ms for the
/// hosts here, but a loaded machine is slow).
const SPAN_WAIT: Duration = Duration::from_secs(60);

/// A host exporting with a short batch delay, so spans arrive while the test waits.
const FAST_EXPORT: &[(&str, &str)] = &[("OTEL_BSP_SCHEDULE_DELAY", "100")];

type Kept = Arc<Mutex<Vec<(String, Span)>>>;

/// Keep every span of `request`, with its resource's service name.
fn keep(kept: &Kept, request: ExportTraceServiceRequest) {
    let mut kept = kept.lock().unwrap();
    for resource in request.resource_spans {
        let service = resource
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|a| a.key == "service.name")
            .and_then(|a| a.value.as_ref())
            .and_then(|v| match &v.value {
                Some(Value::StringValue(s)) => Some(s.clone()),
                _ => None,
            })
            .unwrap_or_default();
        for scope in resource.scope_spans {
            for span in scope.spans {
                kept.push((service.clone(), span));
            }
        }
    }
}

/// An OTLP receiver: every span it was sent, with its resource's service name.
struct Receiver {
    addr: SocketAddr,
    spans: Kept,
}

struct Grpc(Kept);

#[tonic::async_trait]
impl TraceService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        keep(&self.0, request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Receiver {
    /// OTLP over HTTP/protobuf.
    async fn start() -> Self {
        let spans: Kept = Arc::default();
        let kept = spans.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                let kept = kept.clone();
                async move {
                    keep(&kept, ExportTraceServiceRequest::decode(body).unwrap());
                    (
                        [(axum::http::header::CONTENT_TYPE, "application/x-protobuf")],
                        Vec::<u8>::new(),
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, spans }
    }

    /// OTLP over gRPC.
    async fn start_grpc() -> Self {
        let spans: Kept = Arc::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let service = TraceServiceServer::new(Grpc(spans.clone()));
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
                .await;
        });
        Self { addr, spans }
    }

    fn spans(&self) -> Vec<(String, Span)> {
        self.spans.lock().unwrap().clone()
    }

    /// Every span of the trace `trace_id`, earliest first.
    fn trace(&self, trace_id: &[u8]) -> Vec<Span> {
        let mut spans: Vec<Span> = self
            .spans()
            .into_iter()
            .map(|(_, s)| s)
            .filter(|s| s.trace_id == trace_id)
            .collect();
        spans.sort_by_key(|s| s.start_time_unix_nano);
        spans
    }

    /// Wait until the spans with attribute `origin_id` = `origin` satisfy `done`; they are
    /// returned earliest first.
    async fn wait_origin(
        &self,
        origin: &str,
        what: &str,
        done: impl Fn(&[Span]) -> bool,
    ) -> Vec<Span> {
        wait_for(SPAN_WAIT, what, || {
            let mut spans: Vec<Span> = self
                .spans()
                .into_iter()
                .map(|(_, s)| s)
                .filter(|s| attribute(s, "origin_id").as_deref() == Some(origin))
                .collect();
            spans.sort_by_key(|s| s.start_time_unix_nano);
            let ok = done(&spans);
            async move { ok.then_some(spans) }
        })
        .await
    }
}

/// The value of a span's attribute `key` when it is a number (an integer attribute, as a
/// backend's numeric queries need); `None` when missing or sent as anything else.
fn number(span: &Span, key: &str) -> Option<i64> {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref())
        .and_then(|v| match &v.value {
            Some(Value::IntValue(n)) => Some(*n),
            _ => None,
        })
}

/// The value of a span's attribute `key`, as text.
fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref())
        .and_then(|v| match &v.value {
            Some(Value::StringValue(s)) => Some(s.clone()),
            Some(Value::IntValue(n)) => Some(n.to_string()),
            _ => None,
        })
}

fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

/// XADD `control` as the payload with extra `fields`.
async fn add_with(
    conn: &mut redis::aio::MultiplexedConnection,
    stream: &str,
    control: &Control,
    fields: &[(&str, &str)],
) -> String {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(stream)
        .arg("*")
        .arg("payload")
        .arg(serde_json::to_string(control).unwrap());
    for (name, value) in fields {
        cmd.arg(*name).arg(*value);
    }
    cmd.query_async(conn).await.unwrap()
}

fn telemetry_at(receiver: &Receiver, protocol: &str) -> String {
    format!(
        r#"{{ endpoint = "http://{}", protocol = "{protocol}", service_name = "billing", resource = {{ "deployment.environment" = "test" }}, trace_url = "https://traces.example/t/{{trace_id}}?x=1&y=2" }}"#,
        receiver.addr
    )
}

/// `sluice` with `args` (then the config and `--redis`), with spans exported fast; its
/// standard output.
async fn cli(args: &[&str], config: &std::path::Path, redis: &Redis) -> String {
    let mut all: Vec<String> = vec![args[0].to_owned(), config.display().to_string()];
    all.extend(args[1..].iter().map(|a| (*a).to_owned()));
    all.extend(["--redis".to_owned(), redis.url()]);
    let (ok, out, err) = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = all.iter().map(String::as_str).collect();
        run_sluice_with(&args, std::path::Path::new("."), FAST_EXPORT)
    })
    .await
    .unwrap();
    assert!(ok, "sluice {args:?} failed: {out}{err}");
    out
}

const PRODUCER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_follows_an_entry_through_two_parked_retries_to_its_ack() {
    let receiver = Receiver::start().await;
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let run = RunDir::new(
        &redis,
        TestConfig::of(
            Sub::fixture("traced")
                .delayed("traced.delayed")
                .set("handler_timeout", "7s"),
        )
        .set("telemetry", Raw(&telemetry_at(&receiver, "http/protobuf"))),
    );
    // The config's protocol rules over a stray OTEL_EXPORTER_OTLP_PROTOCOL.
    let host = run.spawn_env(&[
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
    ]);
    let id = add_with(
        &mut conn,
        "traced",
        &Control::Retry { ms: 300, times: 2 },
        &[("traceparent", PRODUCER), ("tracestate", "vendor=abc")],
    )
    .await;
    let spans = receiver
        .wait_origin(&id, "three attempts, the last acked", |spans| {
            named(spans, "delivery")
                .iter()
                .any(|s| attribute(s, "outcome").as_deref() == Some("ack"))
                && named(spans, "sweep").len() == 2
                && named(spans, "parked").len() == 2
        })
        .await;
    let producer_trace = unhex("4bf92f3577b34da6a3ce929d0e0e4736");
    let producer_span = unhex("00f067aa0ba902b7");
    assert!(
        spans.iter().all(|s| s.trace_id == producer_trace),
        "every span is in the producer's trace"
    );
    let attempts = named(&spans, "delivery");
    assert_eq!(attempts.len(), 3, "{attempts:#?}");
    for (n, (attempt, outcome)) in attempts.iter().zip(["retry", "retry", "ack"]).enumerate() {
        assert_eq!(
            attempt.parent_span_id, producer_span,
            "attempt {n}'s parent"
        );
        assert_eq!(number(attempt, "attempt"), Some(n as i64 + 1));
        assert_eq!(number(attempt, "retry_count"), Some(n as i64));
        assert_eq!(number(attempt, "delivery_count"), Some(1));
        assert_eq!(attribute(attempt, "outcome").as_deref(), Some(outcome));
        assert_eq!(attribute(attempt, "stream").as_deref(), Some("traced"));
        assert_eq!(attribute(attempt, "group").as_deref(), Some("g"));
        assert!(attribute(attempt, "digest").is_some());
        assert_eq!(number(attempt, "time_limit_ms"), Some(7000));
        let memory = number(attempt, "memory_bytes").unwrap();
        assert!(memory > 0, "memory used is recorded");
        assert_eq!(
            attempt.trace_state, "vendor=abc",
            "the producer's tracestate kept"
        );
        if n < 2 {
            assert_eq!(number(attempt, "retry_delay_ms"), Some(300));
        }
    }
    assert_eq!(attribute(attempts[0], "id").as_deref(), Some(id.as_str()));
    assert_ne!(
        attribute(attempts[2], "id").as_deref(),
        Some(id.as_str()),
        "a copy"
    );
    // Each parked wait is a child of the attempt that parked it and lasts its delay.
    let parked = named(&spans, "parked");
    for (wait, attempt) in parked.iter().zip(&attempts) {
        assert_eq!(wait.parent_span_id, attempt.span_id);
        assert_eq!(
            (wait.end_time_unix_nano - wait.start_time_unix_nano) / 1_000_000,
            300
        );
        assert_eq!(number(wait, "delay_ms"), Some(300));
        assert!(number(wait, "retry_count").is_some());
    }
    // Each sweep says when the retry was due and how late it moved.
    for sweep in named(&spans, "sweep") {
        assert_eq!(sweep.parent_span_id, producer_span);
        assert!(number(sweep, "due_ms").is_some());
        assert!(number(sweep, "retry_count").is_some());
        let late = number(sweep, "lateness_ms").unwrap();
        assert!(late >= 0);
    }
    drop(host);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_without_a_traceparent_gets_its_own_trace_and_a_bad_one_is_counted() {
    let receiver = Receiver::start_grpc().await;
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let run = RunDir::new(
        &redis,
        TestConfig::of(Sub::fixture("own").delayed("own.delayed"))
            .set("telemetry", Raw(&telemetry_at(&receiver, "grpc"))),
    );
    let host = run.spawn_env(FAST_EXPORT);
    let id = add(&mut conn, "own", &Control::Retry { ms: 200, times: 1 }).await;
    let big = "0".repeat(100_000);
    let mut bad_ids = Vec::new();
    for bad in [
        "garbage",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        &big,
    ] {
        bad_ids.push(add_with(&mut conn, "own", &Control::Ack, &[("traceparent", bad)]).await);
    }
    let spans = receiver
        .wait_origin(&id, "the entry's root and both attempts", |spans| {
            named(spans, "delivery").len() == 2 && named(spans, "entry").len() == 1
        })
        .await;
    let root = named(&spans, "entry")[0];
    assert!(root.parent_span_id.is_empty(), "the entry span is the root");
    assert_eq!(attribute(root, "stream").as_deref(), Some("own"));
    // The root covers the entry's wait in the stream: from its XADD (the id's time).
    let added_ms: u64 = id.split('-').next().unwrap().parse().unwrap();
    assert_eq!(root.start_time_unix_nano / 1_000_000, added_ms);
    for attempt in named(&spans, "delivery") {
        assert_eq!(attempt.trace_id, root.trace_id);
        assert_eq!(attempt.parent_span_id, root.span_id);
        assert_eq!(attribute(attempt, "trace_id"), Some(hex(&root.trace_id)));
    }
    // A bad traceparent: handled as usual, in a trace of its own, and counted.
    for bad in &bad_ids {
        let spans = receiver
            .wait_origin(bad, "the bad traceparent's entry", |spans| {
                named(spans, "delivery")
                    .iter()
                    .any(|s| attribute(s, "outcome").as_deref() == Some("ack"))
                    && named(spans, "entry").len() == 1
            })
            .await;
        assert_ne!(spans[0].trace_id, root.trace_id);
        assert_ne!(spans[0].trace_id, vec![0; 16]);
    }
    let (_, metrics) = http_get(host.admin_addr().await, "/metrics").await;
    assert!(
        metrics.contains("sluice_trace_context_rejected_total 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("sluice_trace_spans_dropped_total 0"),
        "{metrics}"
    );
    assert_eq!(
        spans
            .iter()
            .map(|s| s.trace_id.clone())
            .collect::<std::collections::HashSet<_>>()
            .len(),
        1
    );
    assert!(
        receiver
            .spans()
            .iter()
            .all(|(service, _)| service == "billing")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trace_survives_a_sigkill_between_attempts() {
    let receiver = Receiver::start().await;
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let run = RunDir::new(
        &redis,
        TestConfig::of(Sub::fixture("crash").delayed("crash.delayed"))
            .set("telemetry", Raw(&telemetry_at(&receiver, "http/protobuf"))),
    );
    let mut first = run.spawn_env(FAST_EXPORT);
    // Parked for long enough that the first host is gone before it is due.
    let id = add(&mut conn, "crash", &Control::Retry { ms: 1500, times: 1 }).await;
    let before = receiver
        .wait_origin(&id, "the first attempt's span", |spans| {
            named(spans, "delivery").len() == 1 && named(spans, "parked").len() == 1
        })
        .await;
    first.kill();
    // While it waits, `sluice parked --json` names its trace.
    let config = run.path().join("sluice.toml");
    let parked = cli(&["parked", "--json"], &config, &redis).await;
    let line: serde_json::Value = serde_json::from_str(parked.lines().next().unwrap()).unwrap();
    let trace_id = hex(&named(&before, "delivery")[0].trace_id);
    assert_eq!(
        line["entries"][0]["trace_id"],
        trace_id.as_str(),
        "{parked}"
    );
    // An operator makes it due now: a span of its own in the entry's trace.
    let out = cli(&["retry-now", "--all"], &config, &redis).await;
    assert!(out.contains('1'), "{out}");
    let _second = run.spawn_env(FAST_EXPORT);
    let spans = receiver
        .wait_origin(&id, "the second host's attempt", |spans| {
            named(spans, "delivery").len() == 2
        })
        .await;
    let attempts = named(&spans, "delivery");
    let first_attempt = named(&before, "delivery")[0];
    assert_eq!(attempts[1].trace_id, first_attempt.trace_id);
    assert_eq!(attempts[1].parent_span_id, first_attempt.parent_span_id);
    assert_eq!(attribute(attempts[1], "outcome").as_deref(), Some("ack"));
    assert_eq!(number(attempts[1], "attempt"), Some(2));
    assert_eq!(named(&spans, "sweep").len(), 1);
    let retry_now = wait_for(SPAN_WAIT, "the operator's retry-now span", || {
        let found = receiver
            .trace(&first_attempt.trace_id)
            .into_iter()
            .find(|s| s.name == "retry-now");
        async move { found }
    })
    .await;
    assert_eq!(retry_now.parent_span_id, first_attempt.parent_span_id);
    assert_eq!(
        attribute(&retry_now, "set").as_deref(),
        Some("crash.delayed")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeued_dead_letter_comes_back_in_its_original_trace() {
    let receiver = Receiver::start().await;
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let run = RunDir::new(
        &redis,
        TestConfig::of(Sub::fixture("fixme").delayed("fixme.delayed"))
            .set("telemetry", Raw(&telemetry_at(&receiver, "http/protobuf"))),
    );
    let host = run.spawn_env(FAST_EXPORT);
    let id = add(
        &mut conn,
        "fixme",
        &Control::DeadUntilRequeued {
            reason: "gateway down".into(),
        },
    )
    .await;
    wait_dead_letters(&conn, "fixme", 1).await;
    let dead = dead_lettered(&mut conn, "fixme").await;
    let letter = dead[0].0.clone();
    let first = receiver
        .wait_origin(&id, "the dead-lettering attempt", |spans| {
            named(spans, "delivery").len() == 1
        })
        .await;
    let trace_id = hex(&first[0].trace_id);
    // Where operators look: `sluice dead-letters --json` and the page give the trace id and
    // its link.
    let config = run.path().join("sluice.toml");
    let listed = cli(&["dead-letters", "--json"], &config, &redis).await;
    let rows: serde_json::Value = serde_json::from_str(listed.lines().next().unwrap()).unwrap();
    let row = if rows.is_array() { &rows[0] } else { &rows };
    assert_eq!(row["trace_id"], trace_id.as_str(), "{listed}");
    let link = format!("https://traces.example/t/{trace_id}?x=1&y=2");
    assert_eq!(row["trace_link"], link.as_str(), "{listed}");
    let human = cli(&["dead-letters"], &config, &redis).await;
    assert!(human.contains(&format!("trace {trace_id}")), "{human}");
    let admin = host.admin_addr().await;
    let session = log_in(admin).await;
    let (code, page) = http_request_bare(
        admin,
        "GET",
        "/ui/s/fixme/g/dead-letters",
        &session.headers(),
        b"",
    )
    .await;
    assert_eq!(code, 200);
    assert!(
        page.contains(&format!(
            r#"<a href="https://traces.example/t/{trace_id}?x=1&amp;y=2" rel="noopener noreferrer" target="_blank"><code>{trace_id}</code></a>"#
        )),
        "{page}"
    );
    // The operator's CLI exports its own span into the entry's trace.
    let out = cli(&["requeue", &letter], &config, &redis).await;
    assert!(out.contains("requeued 1"), "{out}");
    let spans = receiver
        .wait_origin(
            &id,
            "the dead-lettering attempt, the requeue and the new attempt",
            |spans| {
                named(spans, "delivery")
                    .iter()
                    .any(|s| attribute(s, "outcome").as_deref() == Some("ack"))
                    && named(spans, "requeue").len() == 1
            },
        )
        .await;
    let attempts = named(&spans, "delivery");
    assert_eq!(
        attribute(attempts[0], "outcome").as_deref(),
        Some("dead-letter")
    );
    assert_eq!(
        attribute(attempts[0], "reason").as_deref(),
        Some("gateway down")
    );
    let requeue = named(&spans, "requeue")[0];
    assert_eq!(attribute(requeue, "dead_letter_id"), Some(letter));
    let acked = attempts.last().unwrap();
    assert!(spans.iter().all(|s| s.trace_id == attempts[0].trace_id));
    assert!(requeue.start_time_unix_nano < acked.start_time_unix_nano);
    assert_eq!(hex(&acked.trace_id), trace_id);
    assert_eq!(
        named(&receiver.trace(&attempts[0].trace_id), "entry").len(),
        1
    );
}

/// An HTTP server that answers 200 and keeps the `traceparent` header of every request.
async fn header_keeper() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let kept = seen.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: axum::http::HeaderMap| {
            let kept = kept.clone();
            async move {
                let value = headers
                    .get("traceparent")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("none")
                    .to_owned();
                kept.lock().unwrap().push(value);
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, seen)
}

/// A host exporting to a receiver, whose fixture subscription on `stream` may call a server
/// that keeps each request's `traceparent`.
struct WithUpstream {
    host: HostProcess,
    receiver: Receiver,
    upstream: SocketAddr,
    seen: Arc<Mutex<Vec<String>>>,
    conn: redis::aio::MultiplexedConnection,
    _run: RunDir,
    _redis: Redis,
}

async fn with_upstream(stream: &str) -> WithUpstream {
    let receiver = Receiver::start().await;
    let (upstream, seen) = header_keeper().await;
    let redis = Redis::start();
    let conn = redis.conn().await;
    let grant = format!(r#"["http://{upstream}"]"#);
    let run = RunDir::new(
        &redis,
        TestConfig::of(Sub::fixture(stream).set("allowed_outbound_hosts", Raw(&grant)))
            .set("telemetry", Raw(&telemetry_at(&receiver, "http/protobuf"))),
    );
    let host = run.spawn_env(FAST_EXPORT);
    WithUpstream {
        host,
        receiver,
        upstream,
        seen,
        conn,
        _run: run,
        _redis: redis,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbound_requests_are_child_spans_and_carry_the_hosts_traceparent() {
    // Every part bound: what is not would be dropped (the host killed) at once.
    let WithUpstream {
        host: _host,
        receiver,
        upstream,
        seen,
        mut conn,
        _run,
        _redis,
    } = with_upstream("web").await;
    // The guest tries to put the request in another trace: the host's header wins.
    let forged = "00-11111111111111111111111111111111-2222222222222222-01";
    let call = add(
        &mut conn,
        "web",
        &Control::Http {
            url: format!("http://{upstream}/hook"),
            body: "x".into(),
            timeout_ms: 0,
            traceparent: forged.into(),
        },
    )
    .await;
    let asked = add(&mut conn, "web", &Control::Traceparent).await;
    let logged = add(
        &mut conn,
        "web",
        &Control::Log {
            line: "charged p-17".into(),
        },
    )
    .await;
    wait_dead_letters(&conn, "web", 2).await;
    // What the handler logs is on its attempt's span.
    let spans = receiver
        .wait_origin(&logged, "the logging attempt", |spans| {
            named(spans, "delivery").len() == 1
        })
        .await;
    let events = &named(&spans, "delivery")[0].events;
    assert!(
        events.iter().any(|e| e.name.contains("fixture log line")
            && e.attributes
                .iter()
                .any(|a| format!("{:?}", a.value).contains("charged p-17"))),
        "{events:#?}"
    );
    let spans = receiver
        .wait_origin(&call, "the attempt and its request span", |spans| {
            named(spans, "delivery").len() == 1
        })
        .await;
    let attempt = named(&spans, "delivery")[0];
    let request = wait_for(SPAN_WAIT, "the request's span", || {
        let found = receiver
            .trace(&attempt.trace_id)
            .into_iter()
            .find(|s| s.parent_span_id == attempt.span_id && s.name == "POST");
        async move { found }
    })
    .await;
    assert_eq!(
        attribute(&request, "http.request.method").as_deref(),
        Some("POST")
    );
    assert_eq!(
        attribute(&request, "server.address").as_deref(),
        Some("127.0.0.1")
    );
    assert_eq!(number(&request, "http.response.status_code"), Some(200));
    assert!(request.end_time_unix_nano > request.start_time_unix_nano);
    let headers = seen.lock().unwrap().clone();
    assert_eq!(
        headers,
        vec![format!(
            "00-{}-{}-01",
            hex(&attempt.trace_id),
            hex(&request.span_id)
        )]
    );
    // The SDK tells the handler its attempt's traceparent and trace id.
    let dead = dead_lettered(&mut conn, "web").await;
    let reason = reason_of_origin(&dead, &asked);
    let spans = receiver
        .wait_origin(&asked, "the asking attempt", |spans| {
            named(spans, "delivery").len() == 1
        })
        .await;
    let attempt = named(&spans, "delivery")[0];
    assert_eq!(
        reason,
        format!(
            "traceparent=00-{0}-{1}-01 trace_id={0}",
            hex(&attempt.trace_id),
            hex(&attempt.span_id)
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_telemetry_the_sdk_says_there_is_no_trace() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let _host = HostProcess::run(&redis, Sub::fixture("plain"));
    let id = add(&mut conn, "plain", &Control::Traceparent).await;
    wait_dead_letters(&conn, "plain", 1).await;
    let dead = dead_lettered(&mut conn, "plain").await;
    assert_eq!(
        reason_of_origin(&dead, &id),
        "traceparent=none trace_id=none"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_not_there_changes_nothing_for_deliveries() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let telemetry = format!(r#"{{ endpoint = "http://127.0.0.1:{}" }}"#, free_port());
    let _host = HostProcess::run(
        &redis,
        TestConfig::of(Sub::fixture("untraced")).set("telemetry", Raw(&telemetry)),
    );
    let mut ids = Vec::new();
    for _ in 0..200 {
        ids.push(add(&mut conn, "untraced", &Control::Ack).await);
    }
    for id in &ids {
        wait_acked(&conn, "untraced", "g", id).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_cannot_flood_its_trace_with_request_spans() {
    let WithUpstream {
        host,
        receiver,
        upstream,
        seen,
        mut conn,
        _run,
        _redis,
    } = with_upstream("flood").await;
    let id = add(
        &mut conn,
        "flood",
        &Control::HttpMany {
            urls: vec![format!("http://{upstream}/hook"); 70],
            sequential: true,
        },
    )
    .await;
    wait_dead_letters(&conn, "flood", 1).await;
    let spans = receiver
        .wait_origin(&id, "the attempt", |spans| {
            named(spans, "delivery").len() == 1
        })
        .await;
    let attempt = named(&spans, "delivery")[0].clone();
    let requests = wait_for(SPAN_WAIT, "the request spans", || {
        let requests: Vec<Span> = receiver
            .trace(&attempt.trace_id)
            .into_iter()
            .filter(|s| s.parent_span_id == attempt.span_id && s.name == "POST")
            .collect();
        async move { (requests.len() >= 64).then_some(requests) }
    })
    .await;
    assert_eq!(
        requests.len(),
        64,
        "one span each for the first 64 requests"
    );
    // Every request still went out in the attempt's trace: the last six name the attempt.
    let headers = seen.lock().unwrap().clone();
    assert_eq!(headers.len(), 70);
    let trace = hex(&attempt.trace_id);
    assert!(
        headers
            .iter()
            .all(|h| h.starts_with(&format!("00-{trace}-"))),
        "{headers:?}"
    );
    let naming_attempt = headers
        .iter()
        .filter(|h| h.contains(&hex(&attempt.span_id)))
        .count();
    assert_eq!(naming_attempt, 6);
    let (_, metrics) = http_get(host.admin_addr().await, "/metrics").await;
    assert!(
        metrics.contains("sluice_trace_spans_dropped_total 6"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sampling_ratio_keeps_whole_entries_and_follows_the_producer() {
    let receiver = Receiver::start().await;
    let (upstream, seen) = header_keeper().await;
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let telemetry = format!(
        r#"{{ endpoint = "http://{}", sampling_ratio = 0.0 }}"#,
        receiver.addr
    );
    let grant = format!(r#"["http://{upstream}"]"#);
    let run = RunDir::new(
        &redis,
        TestConfig::of(
            Sub::fixture("sampled")
                .delayed("sampled.delayed")
                .set("allowed_outbound_hosts", Raw(&grant)),
        )
        .set("telemetry", Raw(&telemetry)),
    );
    let _host = run.spawn_env(FAST_EXPORT);
    let own = add(&mut conn, "sampled", &Control::Retry { ms: 100, times: 1 }).await;
    let unsampled = "00-5bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
    let declined = add_with(
        &mut conn,
        "sampled",
        &Control::Ack,
        &[("traceparent", unsampled)],
    )
    .await;
    // The producer sampled this one: its entry is traced whatever the ratio.
    let wanted = add_with(
        &mut conn,
        "sampled",
        &Control::Ack,
        &[("traceparent", PRODUCER)],
    )
    .await;
    let spans = receiver
        .wait_origin(&wanted, "the producer-sampled entry", |spans| {
            named(spans, "delivery").len() == 1
        })
        .await;
    assert_eq!(hex(&spans[0].trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
    // The others were handled (the retried one twice) and left no span at all.
    wait_acked(&conn, "sampled", "g", &wanted).await;
    wait_for(SPAN_WAIT, "the retried entry's copy acked", || {
        let mut conn = conn.clone();
        async move {
            let parked: u64 = redis::cmd("ZCARD")
                .arg("sampled.delayed")
                .query_async(&mut conn)
                .await
                .unwrap();
            let copies: u64 = redis::cmd("XLEN")
                .arg("sampled.delayed.lane")
                .query_async(&mut conn)
                .await
                .unwrap();
            let pending = pending(&mut conn, "sampled.delayed.lane", "g").await;
            (copies == 1 && parked == 0 && pending == 0).then_some(())
        }
    })
    .await;
    // Not sampled, still in its trace: the SDK and an outbound request name the entry's
    // context, marked unsampled (the guest's own header replaced).
    let asked = add(&mut conn, "sampled", &Control::Traceparent).await;
    let call = add(
        &mut conn,
        "sampled",
        &Control::Http {
            url: format!("http://{upstream}/hook"),
            body: "x".into(),
            timeout_ms: 0,
            traceparent: "00-11111111111111111111111111111111-2222222222222222-01".into(),
        },
    )
    .await;
    wait_dead_letters(&conn, "sampled", 2).await;
    let dead = dead_lettered(&mut conn, "sampled").await;
    let (trace, root) = own_root_of("sampled", "g", &asked);
    assert_eq!(
        reason_of_origin(&dead, &asked),
        format!("traceparent=00-{trace}-{root}-00 trace_id={trace}")
    );
    let (trace, root) = own_root_of("sampled", "g", &call);
    assert_eq!(
        seen.lock().unwrap().clone(),
        vec![format!("00-{trace}-{root}-00")]
    );
    let all = receiver.spans();
    for origin in [&own, &declined, &asked, &call] {
        assert!(
            !all.iter()
                .any(|(_, s)| attribute(s, "origin_id").as_deref() == Some(origin.as_str())),
            "{origin} was not sampled"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_gives_the_handler_its_trace() {
    let receiver = Receiver::start().await;
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let component = probe_python().display().to_string();
    let run = RunDir::new(
        &redis,
        TestConfig::of(Sub::new(&component, "probe-python"))
            .set("telemetry", Raw(&telemetry_at(&receiver, "http/protobuf"))),
    );
    let _host = run.spawn_env(FAST_EXPORT);
    let id = add(
        &mut conn,
        "probe-python",
        &serde_json::json!({ "attack": "trace" }),
    )
    .await;
    wait_dead_letters(&conn, "probe-python", 1).await;
    let spans = receiver
        .wait_origin(&id, "the attempt", |spans| {
            named(spans, "delivery").len() == 1
        })
        .await;
    let attempt = named(&spans, "delivery")[0];
    let dead = dead_lettered(&mut conn, "probe-python").await;
    assert_eq!(
        reason_of_origin(&dead, &id),
        format!(
            "trace_id={0} traceparent=00-{0}-{1}-01",
            hex(&attempt.trace_id),
            hex(&attempt.span_id)
        )
    );
}

/// The trace id and root span id of an entry's own trace, as the host derives them.
fn own_root_of(stream: &str, group: &str, origin: &str) -> (String, String) {
    let (trace, span) = sluice_host::observe::telemetry::context::own_ids(stream, group, origin);
    (trace.to_string(), span.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_groups_retry_copy_makes_no_span() {
    let receiver = Receiver::start().await;
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    // Two groups whose retries go to the stream's tail, each skipping the other's copies.
    let sub = |group: &str| {
        Sub::fixture("both")
            .set("group", group)
            .set("consumer", format!("{group}-1"))
            .delayed(&format!("both.{group}.delayed"))
            .set("retry_lane", false)
            .set("other_groups_see_retries", true)
    };
    let run = RunDir::new(
        &redis,
        TestConfig::of(sub("a"))
            .and(sub("b"))
            .set("telemetry", Raw(&telemetry_at(&receiver, "http/protobuf"))),
    );
    let _host = run.spawn_env(FAST_EXPORT);
    let id = add_with(
        &mut conn,
        "both",
        &Control::Retry { ms: 100, times: 1 },
        &[("traceparent", PRODUCER)],
    )
    .await;
    let spans = receiver
        .wait_origin(&id, "each group's two attempts", |spans| {
            named(spans, "delivery")
                .iter()
                .filter(|s| attribute(s, "outcome").as_deref() == Some("ack"))
                .count()
                == 2
        })
        .await;
    // After both copies (stream order), a last entry both groups ack: once its spans are in,
    // any span of a copy would be too.
    let last = add(&mut conn, "both", &Control::Ack).await;
    receiver
        .wait_origin(&last, "the last entry's attempts", |spans| {
            named(spans, "delivery").len() == 2
        })
        .await;
    let in_trace: Vec<Span> = receiver
        .trace(&unhex("4bf92f3577b34da6a3ce929d0e0e4736"))
        .into_iter()
        .filter(|s| s.name == "delivery")
        .collect();
    assert_eq!(
        in_trace.len(),
        4,
        "two attempts per group, no span for a copy: {in_trace:#?}"
    );
    assert_eq!(named(&spans, "delivery").len(), 4);
}
