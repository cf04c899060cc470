//! Traces out (issue 29, in progress): the host exports its spans over OTLP to a collector —
//! here a receiver in the test, built on `opentelemetry-proto`'s types — and a collector that
//! is not there changes nothing for deliveries.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;

use crate::common::*;

/// An OTLP/HTTP receiver: every span it was sent, with its resource's service name.
struct Receiver {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<(String, Span)>>>,
}

impl Receiver {
    async fn start() -> Self {
        let spans: Arc<Mutex<Vec<(String, Span)>>> = Arc::default();
        let kept = spans.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                let kept = kept.clone();
                async move {
                    let request = ExportTraceServiceRequest::decode(body).unwrap();
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

    fn spans(&self) -> Vec<(String, Span)> {
        self.spans.lock().unwrap().clone()
    }
}

/// The value of a span's string attribute `key`.
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_attempt_is_exported_as_a_span_over_otlp_http() {
    let receiver = Receiver::start().await;
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let telemetry = format!(
        r#"{{ endpoint = "http://{}", service_name = "billing", resource = {{ "deployment.environment" = "test" }} }}"#,
        receiver.addr
    );
    let host = HostProcess::run(
        &redis,
        TestConfig::of(Sub::fixture("traced")).set("telemetry", Raw(&telemetry)),
    );
    let id = add(&mut conn, "traced", &Control::Ack).await;
    wait_acked(&conn, "traced", "g", &id).await;
    let (service, span) = wait_for(Duration::from_secs(60), "the attempt's span", || {
        let spans = receiver.spans();
        let id = id.clone();
        async move {
            spans
                .into_iter()
                .find(|(_, s)| s.name == "delivery" && attribute(s, "id").as_deref() == Some(&id))
        }
    })
    .await;
    assert_eq!(service, "billing");
    assert_eq!(attribute(&span, "stream").as_deref(), Some("traced"));
    assert_eq!(attribute(&span, "group").as_deref(), Some("g"));
    assert_eq!(span.trace_id.len(), 16);
    assert!(
        host.log_text().contains("exporting traces"),
        "{}",
        host.log_text()
    );
    // Nothing was dropped, and the metric says so.
    let (_, metrics) = http_get(host.admin_addr().await, "/metrics").await;
    assert!(
        metrics.contains("sluice_trace_spans_dropped_total 0"),
        "{metrics}"
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
