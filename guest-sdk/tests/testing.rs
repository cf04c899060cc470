//! `sluice_guest::testing`: a handler run natively on made-up deliveries, as the host would
//! run it (the payload decoded, the state built from the test's config, the outcome returned).

use serde::Deserialize;
use sluice_guest::prelude::*;
use sluice_guest::testing::{TestDelivery, handler};

#[derive(Debug, Deserialize, serde::Serialize)]
struct Order {
    id: String,
}

#[derive(Clone)]
struct Api {
    url: String,
}

impl FromConfig for Api {
    fn from_config(config: &sluice_guest::config::Config) -> Result<Self, String> {
        Ok(Self {
            url: config.require("api_url")?,
        })
    }
}

#[subscriber(RedisStream::new("orders").group("billing"))]
async fn handle(order: &Order, State(api): State<Api>, delivery: &Delivery) -> HandlerOutcome {
    if order.id == "slow" {
        sluice_guest::time::sleep(Duration::from_millis(5)).await;
    }
    if order.id == "call" {
        let sent = sluice_guest::http::Request::post(&api.url)
            .json(order)
            .send()
            .await;
        return match sent {
            Ok(_) => HandlerOutcome::ack(),
            Err(err) => HandlerOutcome::dead_letter(err.to_string()),
        };
    }
    if delivery.previous_attempts() == 0 && delivery.field_str("retry") == Some("yes") {
        return HandlerOutcome::retry_after(Duration::from_secs(5));
    }
    let note = sluice_guest::config::get("note").unwrap_or_default();
    HandlerOutcome::dead_letter(format!("{} at {} {note}", order.id, api.url))
}

fn order(id: &str) -> TestDelivery {
    TestDelivery::json(&format!(r#"{{"id": "{id}"}}"#)).config("api_url", "http://api")
}

#[test]
fn the_handler_sees_its_payload_state_config_and_attempt() {
    let outcome = order("o1").config("note", "n").run(&handler!(handle));
    assert_eq!(outcome.dead_letter_reason(), Some("o1 at http://api n"));
    let first = order("o2").field("retry", "yes").run(&handler!(handle));
    assert_eq!(first.retry_delay(), Some(Duration::from_secs(5)));
    let again = order("o2")
        .field("retry", "yes")
        .retry_count(1)
        .run(&handler!(handle));
    assert!(again.dead_letter_reason().is_some(), "{again:?}");
    let slow = order("slow").run(&handler!(handle));
    assert!(slow.dead_letter_reason().is_some(), "{slow:?}");
}

#[test]
fn an_undecodable_payload_is_dead_lettered_as_the_host_would() {
    let outcome = TestDelivery::json("{oops").run(&handler!(handle));
    let reason = outcome.dead_letter_reason().unwrap_or_default();
    assert!(
        reason.contains("undecodable payload") && reason.contains("Order"),
        "{reason}"
    );
}

#[test]
fn http_says_it_needs_the_host() {
    let outcome = order("call").run(&handler!(handle));
    let reason = outcome.dead_letter_reason().unwrap_or_default();
    assert!(reason.contains("sluice test"), "{reason}");
}

#[test]
#[should_panic(expected = "config value `api_url` is not set")]
fn a_state_that_cannot_be_built_names_the_missing_value() {
    TestDelivery::json(r#"{"id": "x"}"#).run(&handler!(handle));
}
