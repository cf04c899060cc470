use sluice_guest::prelude::*;

#[subscriber(RedisStream::new("s").group("g"))]
fn handle<T>(payload: &T) -> HandlerOutcome {
    let _ = payload;
    HandlerOutcome::ack()
}

fn main() {}
