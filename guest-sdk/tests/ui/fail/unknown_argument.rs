use sluice_guest::prelude::*;

#[subscriber(RedisStream::new("s").group("g"))]
fn handle(payload: &String, attempts: u32) -> HandlerOutcome {
    let _ = (payload, attempts);
    HandlerOutcome::ack()
}

fn main() {}
