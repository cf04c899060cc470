//! The poison check (`poison_check = true`): an attempt that trapped or raised runs once more
//! at once, with the attempt's journal of outbound calls and without the network. The same
//! failure again means the input itself is poison: the entry is dead-lettered now with the
//! reason "fails the same way on the same input", not retried `max_retries` times over hours.
//! Any other result (success, another failure, or a run that made a call its journal does not
//! hold, whose failure may be that call's) keeps the first failure, and the normal retry
//! follows. It sits beside [`super::dispatch`], which calls it between the handler and the
//! decision.

use std::sync::Arc;

use crate::entry::delivery::Delivery;
use crate::entry::outcome::{Failure, Outcome};
use crate::handler::Version;
use crate::store::effects::{DeliveryJournal, JournalStore};

/// Run an attempt that trapped or raised once more, offline (calls its journal does not hold
/// fail): the same failure again is the entry's dead letter now; any other result keeps the
/// first failure (a retry). Other results pass through untouched.
pub(crate) async fn check(
    delivery: &mut Delivery,
    version: &Version,
    journal: Option<&Arc<JournalStore>>,
    result: Result<Outcome, Failure>,
) -> Result<Outcome, Failure> {
    let failure = match &result {
        Err(f @ (Failure::Trap(_) | Failure::Raised { .. })) => f,
        _ => return result,
    };
    let live = delivery.journal.take();
    let offline = journal.map(|store| Arc::new(DeliveryJournal::offline(store.clone())));
    delivery.journal.clone_from(&offline);
    let again = version.handler.handle(delivery).await;
    delivery.journal = live;
    // A call the journal did not hold failed offline: whatever the failure says, it may
    // have come from that call, so it is not taken as the input's.
    let missed = offline.as_ref().is_some_and(|o| o.missed());
    match again {
        Err(second) if !missed && second.to_string() == failure.to_string() => {
            tracing::warn!(%failure, "fails the same way on the same input (run again at once, offline): dead-lettered now");
            Ok(Outcome::DeadLetter(format!(
                "fails the same way on the same input: {failure}"
            )))
        }
        other => {
            tracing::info!(first = %failure, again = ?other.as_ref().map_err(ToString::to_string), "the failure did not repeat on the same input run again offline: retried as usual");
            result
        }
    }
}
