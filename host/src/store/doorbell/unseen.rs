//! The doorbell's look for what it did not hear: with keyspace events, a write the server did
//! not publish as a stream event (events turned off for a moment between two checks of the
//! setting, a RENAME, COPY or RESTORE that publishes only a generic event) rings nothing, and
//! an idle reader that trusts its bell would not read for minutes. So the doorbell takes each
//! stream's last id before it subscribes it ([`Doorbell::take_tips`]: an entry before that is
//! read by the read its subscription rings for), and every [`EVERY`] looks whether an entry
//! came after it ([`Doorbell::look_for_unseen`], one script per
//! [`super::poll::KEYS_PER_READ`] streams, `lua/unseen.lua`): if one did, it rings and takes
//! the new last id. An entry added unheard is read within about [`EVERY`]; one heard of costs
//! its reader one more read at the next look, at most.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::Script;

use super::{Doorbell, Down, Kind};

/// How often the doorbell looks for entries it did not hear of: each look is one XREAD per
/// idle stream inside a script (at 5,000 subscriptions, 15,000 every look: 1,500 a second at
/// 10 s, most of what an idle host asked of Redis; 500 at 30 s).
pub const EVERY: Duration = Duration::from_secs(30);

static UNSEEN: LazyLock<Script> =
    LazyLock::new(|| Script::new(crate::store::lua!("store/doorbell/lua/unseen")));

impl Doorbell {
    /// Take the last id of the streams among `keys`, before they are subscribed.
    pub(super) async fn take_tips(&self, keys: &[Arc<str>]) -> Result<(), Down> {
        let streams: Vec<Arc<str>> = {
            let map = self.lock();
            keys.iter()
                .filter(|k| map.get(*k).is_some_and(|key| key.kind == Kind::Stream))
                .cloned()
                .collect()
        };
        for chunk in streams.chunks(super::poll::KEYS_PER_READ) {
            let tips = self
                .script(&super::poll::TIPS, chunk, "the streams' last ids")
                .await?;
            let mut map = self.lock();
            for (name, tip) in chunk.iter().zip(tips) {
                if let Some(key) = map.get_mut(name) {
                    key.last = Some(if tip.is_empty() || tip == "!" {
                        "0-0".to_owned()
                    } else {
                        tip
                    });
                }
            }
        }
        Ok(())
    }

    /// Look for entries added to the subscribed streams after their last known ids, and ring
    /// the bells of those that got one.
    pub(super) async fn look_for_unseen(&self) -> Result<(), Down> {
        let known: Vec<(Arc<str>, String)> = self
            .lock()
            .iter()
            .filter(|(_, key)| key.kind == Kind::Stream && key.wanted > 0 && key.subscribed)
            .filter_map(|(name, key)| Some((name.clone(), key.last.clone()?)))
            .collect();
        for chunk in known.chunks(super::poll::KEYS_PER_READ) {
            let mut invocation = UNSEEN.prepare_invoke();
            for (name, last) in chunk {
                invocation.key(&**name).arg(last);
            }
            let found = tokio::time::timeout(
                crate::store::redis_conn::COMMAND_TIMEOUT,
                invocation.invoke_async::<Vec<String>>(&mut self.conn.clone()),
            )
            .await
            .map_err(|_| Down::Failed("the look for unheard entries timed out".to_owned()))?
            .map_err(|err| Down::Failed(format!("the look for unheard entries: {err}")))?;
            let mut map = self.lock();
            for ((name, _), tip) in chunk.iter().zip(found) {
                if tip.is_empty() {
                    continue;
                }
                if let Some(key) = map.get_mut(name) {
                    tracing::debug!(key = %name, "entries after the last id known: ringing");
                    key.last = Some(tip);
                    key.ring();
                }
            }
        }
        Ok(())
    }
}
