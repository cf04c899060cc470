use sluice_guest::prelude::*;

#[subscriber(RedisStream::new("s").group("g"))]
fn handle(payload: String) -> HandlerOutcome {
    let _ = payload;
    HandlerOutcome::ack()
}

fn main() {}
