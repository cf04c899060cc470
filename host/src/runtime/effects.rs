//! Effects that happen once: what the host adds to a handler's outbound calls so that the
//! service it calls can tell a retry from a new request, without a line of handler code.
//!
//! Every request an attempt sends carries the subscription's `idempotency_header`
//! (`Idempotency-Key` unless configured otherwise, or none) unless the handler set that header
//! itself. Its value is derived from the entry's stream, group and origin id, its effects epoch
//! (the `sluice-effects-epoch` field) and the request's position in the attempt (0 for the first request
//! sent): the same call of the same entry gets the same key on every retry, redelivery,
//! take-over by another host, and requeue of a dead letter; a requeue that asks for new keys
//! sets a new epoch. The value is a digest (`sluice-` and 32 hex digits), so it has one length
//! whatever the names, and names nothing a service should not see. Where the stream has a
//! secret (every stream with a delayed-retry set or whose calls carry keys), the digest is an
//! HMAC with a key derived from it once ([`call_key`]): a guest that shares a gateway account
//! with another subscription cannot work out the keys that subscription's calls will carry
//! and send them first.

use std::sync::Arc;

use hmac::{Hmac, Mac as _};
use sha2::{Digest as _, Sha256};

use crate::entry::delivery::Delivery;
use crate::store::keys::Secret;

/// What the key derived from a stream's secret for idempotency keys is for.
pub const IDEMPOTENCY_KEY_USE: &[u8] = b"sluice idempotency keys";

/// The key a stream's idempotency keys are made with: derived from its secret (once, where a
/// partition or a replay starts), so what goes to third parties is never made with the key
/// that seals the host's bookkeeping.
pub fn call_key(secret: &Secret) -> Option<[u8; 32]> {
    let mac = Hmac::<Sha256>::new_from_slice(secret.value().as_bytes()).ok()?;
    Some(
        mac.chain_update(IDEMPOTENCY_KEY_USE)
            .finalize()
            .into_bytes()
            .into(),
    )
}

/// Each part length-prefixed, then the call's position: no two different identities feed the
/// same bytes.
fn feed(hash: &mut impl sha2::digest::Update, parts: [&[u8]; 4], call: u32) {
    for part in parts {
        hash.update(&(part.len() as u64).to_be_bytes());
        hash.update(part);
    }
    hash.update(&u64::from(call).to_be_bytes());
}

/// What names one attempt's calls: the entry behind it, the same on every attempt.
#[derive(Debug, Clone)]
pub struct CallIdentity {
    stream: Arc<str>,
    group: Arc<str>,
    origin: String,
    epoch: Option<Vec<u8>>,
    key: Option<[u8; 32]>,
}

impl CallIdentity {
    /// The identity of `delivery`'s calls.
    pub fn of(delivery: &Delivery) -> Self {
        let epoch = delivery.effects_epoch().map(<[u8]>::to_vec);
        Self {
            stream: delivery.stream.clone(),
            group: delivery.group.clone(),
            origin: delivery.origin_id.clone(),
            epoch,
            key: delivery.call_key,
        }
    }

    /// The idempotency key of the attempt's request number `call` (0-based, in the order the
    /// guest sent them).
    pub fn key(&self, call: u32) -> String {
        let parts = [
            self.stream.as_bytes(),
            self.group.as_bytes(),
            self.origin.as_bytes(),
            self.epoch.as_deref().unwrap_or_default(),
        ];
        let keyed = self.key.and_then(|key| {
            let mut mac = Hmac::<Sha256>::new_from_slice(&key).ok()?;
            feed(&mut mac, parts, call);
            Some(mac.finalize().into_bytes())
        });
        let hash = keyed.unwrap_or_else(|| {
            let mut digest = Sha256::new();
            feed(&mut digest, parts, call);
            digest.finalize()
        });
        format!("sluice-{}", hex::encode(&hash[..16]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(origin: &str, epoch: Option<&str>) -> CallIdentity {
        CallIdentity {
            stream: "payments".into(),
            group: "billing".into(),
            origin: origin.to_owned(),
            epoch: epoch.map(|e| e.as_bytes().to_vec()),
            key: None,
        }
    }

    #[test]
    fn a_call_keeps_its_key_and_every_part_changes_it() {
        let a = identity("1-0", None);
        assert_eq!(a.key(0), identity("1-0", None).key(0));
        assert_eq!(a.key(0).len(), "sluice-".len() + 32);
        let others = [
            a.key(1),
            identity("1-1", None).key(0),
            identity("1-0", Some("9-0")).key(0),
            CallIdentity {
                group: "other".into(),
                ..a.clone()
            }
            .key(0),
            // Moving bytes between parts changes the key too.
            CallIdentity {
                stream: "paymentsb".into(),
                group: "illing".into(),
                ..a.clone()
            }
            .key(0),
        ];
        for other in &others {
            assert_ne!(&a.key(0), other);
        }
    }

    #[test]
    fn with_a_secret_the_key_is_the_secrets_and_stays_the_same() {
        let plain = identity("1-0", None);
        let keyed = |value: &str| CallIdentity {
            key: call_key(&Secret::from_value(value)),
            ..plain.clone()
        };
        assert_eq!(keyed("s1").key(3), keyed("s1").key(3));
        assert_ne!(keyed("s1").key(3), keyed("s2").key(3));
        assert_ne!(keyed("s1").key(3), plain.key(3));
        assert_eq!(keyed("s1").key(3).len(), "sluice-".len() + 32);
    }
}
