use sluice_guest::prelude::*;

#[subscriber(RedisStream::new("s").group("g"))]
fn handle(payload: &String) -> bool {
    payload.is_empty()
}

fn main() {}
