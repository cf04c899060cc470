// A handler's success value is `()`: the host's world has no other, so the trait is sealed.
struct Receipt;

impl sluice_guest::handler::HandlerOutput for Receipt {}

fn main() {}
