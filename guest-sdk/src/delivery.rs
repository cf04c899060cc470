//! One delivered entry, and how its payload becomes the handler's input type.

use serde::de::DeserializeOwned;
use sluice_descriptor::{DEFAULT_PAYLOAD_FIELD, PAYLOAD_FIELD_CONFIG_KEY};

use crate::__bindings::sluice::handler::types as wit;

/// A Redis Streams entry as delivered to the handler: where it came from, all of its fields,
/// and how often it was tried before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The stream the entry was read from.
    pub stream: String,
    /// The consumer group that read it.
    pub group: String,
    /// The entry id.
    pub id: String,
    /// The entry's fields, in stream order.
    pub fields: Vec<(String, Vec<u8>)>,
    /// How many times the entry was parked and re-added: 0 on the first delivery.
    pub retry_count: u32,
    /// How many times Redis delivered this entry id.
    pub delivery_count: u64,
    /// The id of the entry the producer first added: the same through every retry and requeue,
    /// while `id` changes when a retry comes back. Use it as the idempotency key.
    pub origin_id: String,
}

impl Delivery {
    pub(crate) fn from_wit(d: wit::Delivery) -> Self {
        Self {
            stream: d.stream,
            group: d.group,
            id: d.id,
            fields: d.fields,
            retry_count: d.retry_count,
            delivery_count: d.delivery_count,
            origin_id: d.origin_id,
        }
    }

    /// The raw bytes of field `name`, if the entry has it.
    pub fn field(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    /// Field `name` as UTF-8 text, if present and valid.
    pub fn field_str(&self, name: &str) -> Option<&str> {
        self.field(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// The number of attempts that failed before this one (retries through the delayed set
    /// plus redeliveries of a pending entry); 0 on the first attempt.
    pub fn previous_attempts(&self) -> u64 {
        u64::from(self.retry_count) + self.delivery_count.saturating_sub(1)
    }

    /// Decode the payload field (JSON) into `T`.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, DecodeError> {
        self.decode_field(&payload_field())
    }

    /// Decode field `field` (JSON) into `T`.
    pub(crate) fn decode_field<T: DeserializeOwned>(&self, field: &str) -> Result<T, DecodeError> {
        let Some(raw) = self.field(field) else {
            return Err(DecodeError::MissingField {
                field: field.to_owned(),
            });
        };
        serde_json::from_slice(raw).map_err(|source| DecodeError::Invalid {
            field: field.to_owned(),
            type_name: std::any::type_name::<T>(),
            source,
        })
    }
}

/// The payload field the host configured; asked once per instance (it cannot change under a
/// running instance).
#[cfg(target_arch = "wasm32")]
fn payload_field() -> std::borrow::Cow<'static, str> {
    static FIELD: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let field = FIELD.get_or_init(|| {
        crate::config::get(PAYLOAD_FIELD_CONFIG_KEY)
            .unwrap_or_else(|| DEFAULT_PAYLOAD_FIELD.to_owned())
    });
    std::borrow::Cow::Borrowed(field)
}

/// The payload field the running test's config names (natively, each test its own).
#[cfg(not(target_arch = "wasm32"))]
fn payload_field() -> std::borrow::Cow<'static, str> {
    crate::config::get(PAYLOAD_FIELD_CONFIG_KEY).map_or(DEFAULT_PAYLOAD_FIELD.into(), Into::into)
}

/// Why an entry's payload could not become the handler's input. The host dead-letters the
/// entry with this message as the reason.
#[derive(Debug)]
#[non_exhaustive]
pub enum DecodeError {
    /// The entry has no payload field.
    MissingField {
        /// The field that was looked for.
        field: String,
    },
    /// The field is there but is not JSON of the expected shape.
    Invalid {
        /// The payload field.
        field: String,
        /// The Rust type it should have decoded into.
        type_name: &'static str,
        /// What serde said.
        source: serde_json::Error,
    },
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::MissingField { field } => {
                write!(f, "undecodable payload: the entry has no `{field}` field")
            }
            Self::Invalid {
                field,
                type_name,
                source,
            } => write!(
                f,
                "undecodable payload: field `{field}` is not a valid {type_name}: {source}"
            ),
        }
    }
}

impl std::error::Error for DecodeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::MissingField { .. } => None,
            Self::Invalid { source, .. } => Some(source),
        }
    }
}
