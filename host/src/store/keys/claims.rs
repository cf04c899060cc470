//! Which subscription owns a key ([`claim`]): the first to use a stream, delayed set, retry
//! lane or dead-letter stream records it in Redis, and a different subscription that would use
//! the key is refused at start ([`Claimed`]), before one takes, trims or reads the other's
//! entries.

use super::names::claim_key;
use super::subscription::SubscriptionKeys;

/// A key another subscription claimed first.
#[derive(Debug, thiserror::Error)]
#[error(
    "`{key}` is the {role} of {owner}, and this subscription (stream `{stream}` group `{group}`) would use it as its {our_role}: one would take, trim or read the other's entries; give this subscription a key of its own (or, if {owner} no longer runs: its claim lapses a day after its last host stopped, or delete it now: DEL {claim}; retries it left parked in a set are then dead-lettered by this subscription, where they can be requeued)"
)]
pub struct Claimed {
    /// The key.
    pub key: String,
    /// What it is for the subscription that claimed it.
    pub role: String,
    /// That subscription, as recorded.
    pub owner: String,
    /// What it would be for this one.
    pub our_role: &'static str,
    /// This subscription's stream.
    pub stream: String,
    /// This subscription's group.
    pub group: String,
    /// The claim's own key.
    pub claim: String,
}

/// Why the keys of a subscription could not be claimed.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// Another subscription has one of them.
    #[error(transparent)]
    Claimed(#[from] Claimed),
    /// Redis could not be asked.
    #[error("cannot record which subscription owns its keys")]
    Redis(#[from] redis::RedisError),
}

/// `lua/claim.lua`.
static CLAIM: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(crate::store::lua!("store/keys/lua/claim")));

/// What a stream read by subscriptions is, in its claim.
const STREAM_ROLE: &str = "stream";
/// What a dead-letter stream is, in its claim (another subscription may read it as a stream).
const DEAD_LETTER_ROLE: &str = "dead-letter stream";

/// Who claims a key, as the claims name it (JSON): the stream, and the group for the keys only
/// one subscription may use.
fn owner_of(stream: &str, group: Option<&str>) -> String {
    match group {
        Some(group) => serde_json::json!({ "stream": stream, "group": group }),
        None => serde_json::json!({ "stream": stream }),
    }
    .to_string()
}

/// The default dead-letter stream of the subscription a claim's owner names, if it names one.
fn default_dead_letter_of(owner: &str) -> Option<String> {
    let parsed: serde_json::Value = serde_json::from_str(owner).ok()?;
    let stream = parsed.get("stream")?.as_str()?;
    let group = parsed.get("group")?.as_str()?;
    Some(sluice_descriptor::default_dead_letter(stream, group))
}

/// The subscription a claim's owner names, for a message.
fn describe_owner(owner: &str) -> String {
    let parsed = serde_json::from_str::<serde_json::Value>(owner).ok();
    let field = |name: &str| {
        parsed
            .as_ref()
            .and_then(|v| v.get(name)?.as_str().map(str::to_owned))
    };
    match (field("stream"), field("group")) {
        (Some(stream), Some(group)) => format!("stream `{stream}` group `{group}`"),
        (Some(stream), None) => format!("the subscriptions to stream `{stream}`"),
        _ => format!("the subscription recorded as {owner:?}"),
    }
}

/// How long a claim lasts unless its subscription renews it: a subscription gone (every host of
/// it stopped) for this long no longer holds its keys, and another may take them.
pub const CLAIM_LEASE: std::time::Duration = std::time::Duration::from_secs(86_400);
/// How often a running subscription renews its claims.
pub const CLAIM_RENEW: std::time::Duration = std::time::Duration::from_secs(3_600);

/// Claim the keys of this subscription in Redis: its stream (shared by every group that reads
/// it), and the keys only it may use (its delayed set, retry lane and dead-letter stream). The
/// first to use a key holds it, across hosts and configs, for [`CLAIM_LEASE`] after its last
/// claim (a running subscription claims again every [`CLAIM_RENEW`]), and a different one is
/// refused here, before it reads, with an error naming both. Every host of one subscription
/// (one stream and group) shares them. A dead-letter stream is read as a stream only under its
/// owner's default name (a subscription that handles dead letters): one named after another
/// subscription's stream never feeds it.
pub async fn claim<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
) -> Result<(), ClaimError> {
    let (stream, group) = (&*keys.stream, &*keys.group);
    let mut owned: Vec<(&str, &'static str, Option<&str>)> = vec![
        (stream, STREAM_ROLE, None),
        (&keys.dead_letter, DEAD_LETTER_ROLE, Some(group)),
    ];
    owned.extend(
        keys.delayed
            .as_deref()
            .map(|k| (k, "delayed-retry set", Some(group))),
    );
    owned.extend(keys.lane.as_deref().map(|k| (k, "retry lane", Some(group))));
    let text = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        redis::Value::SimpleString(s) => s.clone(),
        other => format!("{other:?}"),
    };
    let lease = u64::try_from(CLAIM_LEASE.as_millis()).unwrap_or(u64::MAX);
    // Keys found to be another's dead-letter stream under its default name, which this one may
    // read as its stream: claimed again with them allowed (one more call, only then).
    let mut readable = String::new();
    let (i, owner, role) = loop {
        let mut invocation = CLAIM.prepare_invoke();
        for (key, role, group) in &owned {
            invocation
                .key(claim_key(key))
                .arg(owner_of(stream, *group))
                .arg(*role);
        }
        invocation
            .arg(DEAD_LETTER_ROLE)
            .arg(STREAM_ROLE)
            .arg(lease)
            .arg(&readable);
        let conflict: Vec<redis::Value> = invocation.invoke_async(conn).await?;
        let [index, owner, role] = conflict.as_slice() else {
            return Ok(());
        };
        let i = match index {
            redis::Value::Int(i) => usize::try_from(*i).unwrap_or(1).max(1),
            _ => 1,
        };
        let (owner, role) = (text(owner), text(role));
        let (key, our_role, _) = owned.get(i - 1).copied().unwrap_or(owned[0]);
        let marker = format!(",{i},");
        if role == DEAD_LETTER_ROLE
            && our_role == STREAM_ROLE
            && !readable.contains(&marker)
            && default_dead_letter_of(&owner).as_deref() == Some(key)
        {
            readable = format!("{readable},{i},");
            continue;
        }
        break (i - 1, owner, role);
    };
    let (key, our_role, _) = owned.get(i).copied().unwrap_or(owned[0]);
    Err(Claimed {
        key: key.to_owned(),
        role,
        owner: describe_owner(&owner),
        our_role,
        stream: stream.to_owned(),
        group: group.to_owned(),
        claim: claim_key(key),
    }
    .into())
}
