use sluice_guest::prelude::*;

#[subscriber(RedisStream::new("s").group("g"))]
fn handle() -> HandlerOutcome {
    HandlerOutcome::ack()
}

fn main() {}
