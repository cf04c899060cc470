use sluice_guest::prelude::*;

#[subscriber(RedisStream::claiming("orders", Duration::from_secs(60)).group("shipping"))]
fn ship(order: &serde_json::Value, delivery: &Delivery) -> Result<(), HandlerOutcome> {
    if order.is_null() || delivery.retry_count > 3 {
        return Err(HandlerOutcome::dead_letter("no order"));
    }
    Ok(())
}

fn main() {}
