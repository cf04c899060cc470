//! The admin server of a running service: who may use it (the configured token, else this
//! process's session key), the key that seals canaries, and starting it once every
//! subscription is set up.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::wiring::Wiring;
use super::{RunError, Service};

impl Service {
    /// Start the admin server, when configured, with every subscription's view and controls;
    /// the address it bound, which no guest's outbound HTTP may reach.
    pub(super) async fn start_admin(
        &self,
        w: &mut Wiring,
        stop: &CancellationToken,
    ) -> Result<Option<SocketAddr>, RunError> {
        let Some(addr) = self.plan.admin else {
            return Ok(None);
        };
        let token = match &self.plan.admin_token {
            Some(source) => Some(source.read().map_err(RunError::Token)?),
            None => None,
        };
        // No token: the page and API are bound to whoever started this process, by a key
        // made for it (unless the operator opened them on loopback on purpose).
        let session_key = token.is_none() && !self.plan.admin_open_on_loopback;
        let token = if session_key {
            Some(self.session_key())
        } else {
            token
        };
        let read_token = match &self.plan.admin_read_token {
            Some(source) => Some(source.read().map_err(RunError::Token)?),
            None => None,
        };
        if let (Some(read), Some(token)) = (&read_token, &token)
            && read == token
        {
            return Err(RunError::SameTokens);
        }
        let options = crate::serve::AdminOptions {
            token,
            read_token,
            session_key,
            max_upload: usize::try_from(self.plan.admin_max_upload).unwrap_or(usize::MAX),
            open_on_loopback: self.plan.admin_open_on_loopback,
            read_only: self.plan.admin_read_only,
            swaps: std::mem::take(&mut w.swap_controls),
            rollouts: std::mem::take(&mut w.rollouts),
        };
        let bound = crate::serve::serve(
            addr,
            self.metrics.clone(),
            std::mem::take(&mut w.admin_subscriptions),
            options,
            stop.clone(),
        )
        .await?;
        // No guest's outbound HTTP may reach the host's own admin listener.
        if let Some(sub) = self.plan.subscriptions.first() {
            sub.component.runtime().protected().add(bound);
        }
        self.admin_addr.send_replace(Some(bound));
        Ok(Some(bound))
    }

    /// This process's admin session key: the one the plan carries (`sluice dev` printed it in
    /// its banner), else a new one, written once to standard error (the terminal of whoever
    /// started the process), never to the log.
    fn session_key(&self) -> String {
        if let Some(key) = &self.plan.admin_session_key {
            return key.clone();
        }
        let key = crate::serve::new_session_key();
        eprintln!(
            "no admin token is configured: the admin API and page take this process's session key instead (set admin_token_file for a lasting one):\n  {key}"
        );
        tracing::warn!(
            "no admin token is configured: the admin API and page take this process's session key, written to standard error at start"
        );
        key
    }

    /// The key that seals canaries: configured, from the admin token, or (`sluice dev` on its
    /// private Redis) made for this process; `None` refuses and ignores canaries.
    pub(super) fn rollout_key(
        &self,
    ) -> Result<
        Option<Arc<crate::control::rollout::key::RolloutKey>>,
        crate::control::rollout::key::KeyError,
    > {
        use crate::control::rollout::key::RolloutKey;
        let key = match RolloutKey::resolve(
            self.plan.rollout_key.as_ref(),
            self.plan.admin_token.as_ref(),
        )? {
            Some(key) => Some(key),
            None if self.plan.rollout_key_ephemeral => Some(RolloutKey::ephemeral()?),
            None => None,
        };
        if key.is_none() && !self.plan.subscriptions.is_empty() {
            tracing::info!(
                "no rollout key (rollout_key_file, rollout_key_env or an admin token): canaries are refused on this host, and records other hosts write are not joined"
            );
        }
        Ok(key.map(Arc::new))
    }
}
