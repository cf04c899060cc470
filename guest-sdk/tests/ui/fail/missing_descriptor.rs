use sluice_guest::prelude::*;

#[subscriber]
fn handle(payload: &String) -> HandlerOutcome {
    let _ = payload;
    HandlerOutcome::ack()
}

fn main() {}
