//! The doorbell on keyspace events: one subscriber connection per Redis that SUBSCRIBEs the
//! keyspace channels of the keys idle readers want, rings a key's bell on every message, and
//! checks with PINGs (and, every few, the server's setting and the master's address) that its
//! rings can still be trusted.

use std::sync::Arc;

use futures::StreamExt;
use redis::RedisResult;
use redis::aio::{PubSub, PubSubSink};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    CHANNELS_PER_COMMAND, CHECK_EVERY_PINGS, Doorbell, Down, GATHER, PING_EVERY, PING_TIMEOUT,
    UNSUBSCRIBE_AFTER, unseen,
};
use crate::store::redis_conn::{CONNECT_TIMEOUT, ReconnectBackoff};

impl Doorbell {
    /// One connection's life: subscribe what is wanted, ring on every message, check the
    /// connection and the server; `Ok` only when stopped.
    pub(super) async fn session(
        &self,
        stop: &CancellationToken,
        backoff: &mut ReconnectBackoff,
    ) -> Result<(), Down> {
        let (pubsub, address) = self.subscriber().await?;
        let (mut sink, mut messages) = pubsub.split();
        for key in self.lock().values_mut() {
            key.subscribed = false;
        }
        self.reconcile(&mut sink).await?;
        self.live.send_replace(true);
        backoff.reset();
        tracing::info!(redis = %self.conn.name(), %address, "doorbell up: idle subscriptions wait for keyspace events");
        let mut ping = tokio::time::interval(PING_EVERY);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut pings = 0u32;
        let mut look = tokio::time::interval(unseen::EVERY);
        look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                _ = look.tick() => self.look_for_unseen().await?,
                message = messages.next() => {
                    let Some(message) = message else {
                        return Err(Down::Failed("the subscriber connection closed".to_owned()));
                    };
                    let channel = message.get_channel_name();
                    if let Some(key) = channel.strip_prefix(self.prefix.as_str())
                        && let Some(entry) = self.lock().get(key)
                    {
                        entry.ring();
                    }
                }
                () = self.changed.notified() => {
                    // Readers going idle together (thousands at start) are subscribed in a few
                    // commands, not one scan of every key each.
                    tokio::time::sleep(GATHER).await;
                    self.reconcile(&mut sink).await?;
                }
                _ = ping.tick() => {
                    pings = pings.wrapping_add(1);
                    self.ping(&mut sink, pings, &address).await?;
                }
            }
        }
    }

    /// A subscriber connection to the node commands go to now, and its address.
    async fn subscriber(&self) -> Result<(PubSub, String), Down> {
        let Some(client) = self.conn.node_client() else {
            return Err(Down::Off("a cluster".to_owned()));
        };
        let address = client.get_connection_info().addr().to_string();
        let pubsub = tokio::time::timeout(CONNECT_TIMEOUT, client.get_async_pubsub())
            .await
            .map_err(|_| Down::Failed(format!("no connection to {address} within the timeout")))?
            .map_err(|err| Down::Failed(format!("cannot connect to {address}: {err}")))?;
        Ok((pubsub, address))
    }

    /// The `pings`th check of the connection: a PING answered in time, keys let go of long
    /// enough unsubscribed, and every [`CHECK_EVERY_PINGS`] the server's setting and the
    /// master's address (still `address`) looked at again.
    async fn ping(&self, sink: &mut PubSubSink, pings: u32, address: &str) -> Result<(), Down> {
        match tokio::time::timeout(PING_TIMEOUT, sink.ping::<redis::Value>()).await {
            Ok(Ok(_)) => {}
            Ok(Err(err)) => return Err(Down::Failed(format!("PING: {err}"))),
            Err(_) => {
                return Err(Down::Failed(format!(
                    "PING not answered within {PING_TIMEOUT:?}"
                )));
            }
        }
        // Keys let go of long enough are unsubscribed here.
        self.reconcile(sink).await?;
        if pings.is_multiple_of(CHECK_EVERY_PINGS) {
            match self.check_server().await {
                Ok(None) => {}
                Ok(Some(why)) => return Err(Down::Off(why)),
                Err(err) => return Err(Down::Failed(format!("CONFIG GET: {err}"))),
            }
            let now = self
                .conn
                .node_client()
                .map(|c| c.get_connection_info().addr().to_string());
            if now.as_deref() != Some(address) {
                return Err(Down::Failed("the master moved".to_owned()));
            }
        }
        Ok(())
    }

    /// SUBSCRIBE what is wanted and not subscribed (ringing each once Redis confirms), and
    /// UNSUBSCRIBE what nobody has wanted for [`UNSUBSCRIBE_AFTER`].
    async fn reconcile(&self, sink: &mut redis::aio::PubSubSink) -> Result<(), Down> {
        let (add, drop): (Vec<Arc<str>>, Vec<Arc<str>>) = {
            let keys = self.lock();
            let now = Instant::now();
            let add = keys
                .iter()
                .filter(|(_, k)| k.wanted > 0 && !k.subscribed)
                .map(|(name, _)| name.clone())
                .collect();
            let drop = keys
                .iter()
                .filter(|(_, k)| {
                    k.wanted == 0
                        && k.subscribed
                        && k.unwanted_since
                            .is_some_and(|since| now.duration_since(since) >= UNSUBSCRIBE_AFTER)
                })
                .map(|(name, _)| name.clone())
                .collect();
            (add, drop)
        };
        for chunk in add.chunks(CHANNELS_PER_COMMAND) {
            // Where each stream stands before it is subscribed: what comes after is heard or
            // found by the look for unheard entries.
            self.take_tips(chunk).await?;
            let channels: Vec<String> = chunk.iter().map(|k| self.channel(k)).collect();
            self.timed(sink.subscribe(&channels), "SUBSCRIBE").await?;
            let mut keys = self.lock();
            for name in chunk {
                if let Some(key) = keys.get_mut(name) {
                    key.subscribed = true;
                    // From here on every write rings it; one may have come before.
                    key.ring();
                }
            }
        }
        for chunk in drop.chunks(CHANNELS_PER_COMMAND) {
            let channels: Vec<String> = chunk.iter().map(|k| self.channel(k)).collect();
            self.timed(sink.unsubscribe(&channels), "UNSUBSCRIBE")
                .await?;
            let mut keys = self.lock();
            for name in chunk {
                if let Some(key) = keys.get_mut(name) {
                    key.subscribed = false;
                }
            }
        }
        Ok(())
    }

    /// `call` (a SUBSCRIBE or UNSUBSCRIBE, `what`), failed unless answered within
    /// [`PING_TIMEOUT`].
    async fn timed(
        &self,
        call: impl std::future::Future<Output = RedisResult<()>>,
        what: &str,
    ) -> Result<(), Down> {
        match tokio::time::timeout(PING_TIMEOUT, call).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(err)) => Err(Down::Failed(format!("{what}: {err}"))),
            Err(_) => Err(Down::Failed(format!(
                "{what} not answered within {PING_TIMEOUT:?}"
            ))),
        }
    }

    /// The keyspace channel of `key`.
    fn channel(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }
}
