//! Which waiting entries an operator means: a payload field (a JSON pointer into the entry's
//! JSON payload, equal to a value or starting with a prefix), a range of retry counts and a
//! range of times (a dead letter's writing, a parked entry's due time), a dead letter's reason.
//! The page, the API and the bulk jobs ([`super::jobs`]) all match with [`Filter::matches`].

use super::OperateError;

/// How a payload field must compare.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Compare {
    /// The field's value is exactly this (a string's text, or a number or boolean as written).
    Equals(String),
    /// The field's value starts with this.
    Prefix(String),
}

/// What an operator filters on; every part given must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Filter {
    /// A JSON pointer into the payload (`/customer/id`) and how its value compares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<(String, Compare)>,
    /// The least retry count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries_min: Option<u32>,
    /// The most retry count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries_max: Option<u32>,
    /// The earliest time (epoch ms): written (dead letters) or due (parked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_ms: Option<i64>,
    /// The latest time (epoch ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_ms: Option<i64>,
    /// A dead letter's reason contains this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The largest payload a payload filter parses; a larger one never matches.
pub const MAX_PAYLOAD: usize = 1 << 20;

/// The most bytes of a pointer or a value: a filter is a short thing an operator types.
const MAX_TEXT: usize = 1024;

/// A filter as the page's form and the API's query give it: every part optional text.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct FilterQuery {
    /// The JSON pointer.
    pub field: Option<String>,
    /// The value it must equal.
    pub value: Option<String>,
    /// The prefix its value must start with (instead of `value`).
    pub prefix: Option<String>,
    /// The least retry count.
    pub retries_min: Option<String>,
    /// The most retry count.
    pub retries_max: Option<String>,
    /// The earliest time: epoch ms or RFC 3339.
    pub from: Option<String>,
    /// The latest time.
    pub to: Option<String>,
    /// The dead letter's reason contains this.
    pub reason: Option<String>,
}

fn given(text: &Option<String>) -> Option<&str> {
    text.as_deref().map(str::trim).filter(|t| !t.is_empty())
}

fn time(name: &str, text: &str) -> Result<i64, OperateError> {
    if let Ok(ms) = text.parse::<i64>() {
        return Ok(ms);
    }
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.timestamp_millis())
        .map_err(|_| {
            OperateError::Invalid(format!(
                "{name} `{text}` is neither epoch ms nor an RFC 3339 time with its zone"
            ))
        })
}

fn count(name: &str, text: &str) -> Result<u32, OperateError> {
    text.parse()
        .map_err(|_| OperateError::Invalid(format!("{name} `{text}` is not a count")))
}

impl FilterQuery {
    /// Whether any part is given.
    pub fn is_empty(&self) -> bool {
        [
            &self.field,
            &self.value,
            &self.prefix,
            &self.retries_min,
            &self.retries_max,
            &self.from,
            &self.to,
            &self.reason,
        ]
        .iter()
        .all(|t| given(t).is_none())
    }

    /// The filter, each part checked: a pointer starts with `/`, one of value and prefix.
    pub fn parse(&self) -> Result<Filter, OperateError> {
        let too_long = [&self.field, &self.value, &self.prefix, &self.reason]
            .iter()
            .any(|t| t.as_ref().is_some_and(|t| t.len() > MAX_TEXT));
        if too_long {
            return Err(OperateError::Invalid(format!(
                "a filter's texts are at most {MAX_TEXT} bytes"
            )));
        }
        let field = match (given(&self.field), &self.value, given(&self.prefix)) {
            (None, None, None) => None,
            (Some(pointer), _, _) if !pointer.starts_with('/') => {
                return Err(OperateError::Invalid(format!(
                    "field `{pointer}` is not a JSON pointer: write it like /customer/id"
                )));
            }
            (Some(pointer), Some(value), None) => {
                Some((pointer.to_owned(), Compare::Equals(value.clone())))
            }
            (Some(pointer), None, Some(prefix)) => {
                Some((pointer.to_owned(), Compare::Prefix(prefix.to_owned())))
            }
            (Some(_), Some(_), Some(_)) => {
                return Err(OperateError::Invalid(
                    "give a value or a prefix, not both".into(),
                ));
            }
            (None, _, _) | (Some(_), None, None) => {
                return Err(OperateError::Invalid(
                    "a payload filter needs a field (a JSON pointer) and a value or a prefix"
                        .into(),
                ));
            }
        };
        Ok(Filter {
            field,
            retries_min: given(&self.retries_min)
                .map(|t| count("retries_min", t))
                .transpose()?,
            retries_max: given(&self.retries_max)
                .map(|t| count("retries_max", t))
                .transpose()?,
            from_ms: given(&self.from).map(|t| time("from", t)).transpose()?,
            to_ms: given(&self.to).map(|t| time("to", t)).transpose()?,
            reason: given(&self.reason).map(str::to_owned),
        })
    }
}

/// What one waiting entry shows a filter.
pub struct Candidate<'a> {
    /// Its fields.
    pub fields: &'a [(Vec<u8>, Vec<u8>)],
    /// The field that carries the JSON payload.
    pub payload_field: &'a str,
    /// Its retry count, when known.
    pub retries: Option<u32>,
    /// Its time (written or due), when known.
    pub at_ms: Option<i64>,
    /// Its reason (dead letters).
    pub reason: Option<&'a str>,
}

impl Filter {
    /// Whether `c` matches every part given.
    pub fn matches(&self, c: &Candidate<'_>) -> bool {
        let retries = c.retries.unwrap_or(0);
        if self.retries_min.is_some_and(|min| retries < min)
            || self.retries_max.is_some_and(|max| retries > max)
        {
            return false;
        }
        if self.from_ms.is_some() || self.to_ms.is_some() {
            let Some(at) = c.at_ms else { return false };
            if self.from_ms.is_some_and(|f| at < f) || self.to_ms.is_some_and(|t| at > t) {
                return false;
            }
        }
        if let Some(want) = &self.reason
            && !c.reason.is_some_and(|r| r.contains(want.as_str()))
        {
            return false;
        }
        let Some((pointer, compare)) = &self.field else {
            return true;
        };
        let Some((_, payload)) = c
            .fields
            .iter()
            .find(|(name, _)| name.as_slice() == c.payload_field.as_bytes())
        else {
            return false;
        };
        // A payload over MAX_PAYLOAD is not parsed (a filter's cost per entry is bounded).
        if payload.len() > MAX_PAYLOAD {
            return false;
        }
        let Ok(json) = serde_json::from_slice::<serde_json::Value>(payload) else {
            return false;
        };
        let Some(value) = json.pointer(pointer) else {
            return false;
        };
        let text = match value {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        match compare {
            Compare::Equals(want) => text == *want,
            Compare::Prefix(want) => text.starts_with(want.as_str()),
        }
    }

    /// The filter in words, for a confirmation and the audit record.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some((pointer, compare)) = &self.field {
            parts.push(match compare {
                Compare::Equals(v) => format!("{pointer} = {v:?}"),
                Compare::Prefix(p) => format!("{pointer} starts with {p:?}"),
            });
        }
        match (self.retries_min, self.retries_max) {
            (Some(a), Some(b)) => parts.push(format!("retries {a}..={b}")),
            (Some(a), None) => parts.push(format!("retries >= {a}")),
            (None, Some(b)) => parts.push(format!("retries <= {b}")),
            (None, None) => {}
        }
        if let Some(f) = self.from_ms {
            parts.push(format!("from {}", super::format_ms(f)));
        }
        if let Some(t) = self.to_ms {
            parts.push(format!("to {}", super::format_ms(t)));
        }
        if let Some(r) = &self.reason {
            parts.push(format!("reason contains {r:?}"));
        }
        if parts.is_empty() {
            "every entry".to_owned()
        } else {
            parts.join(", ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate<'a>(fields: &'a [(Vec<u8>, Vec<u8>)], retries: u32) -> Candidate<'a> {
        Candidate {
            fields,
            payload_field: "payload",
            retries: Some(retries),
            at_ms: Some(1_000),
            reason: Some("card declined"),
        }
    }

    #[test]
    fn a_pointer_matches_by_value_or_prefix_and_ranges_bound_retries_and_times() {
        let fields = vec![(
            b"payload".to_vec(),
            br#"{"customer":{"id":"cus_42","tier":3}}"#.to_vec(),
        )];
        let q = |field: &str, value: Option<&str>, prefix: Option<&str>| FilterQuery {
            field: Some(field.into()),
            value: value.map(Into::into),
            prefix: prefix.map(Into::into),
            ..FilterQuery::default()
        };
        let c = candidate(&fields, 2);
        assert!(
            q("/customer/id", Some("cus_42"), None)
                .parse()
                .unwrap()
                .matches(&c)
        );
        assert!(
            q("/customer/tier", Some("3"), None)
                .parse()
                .unwrap()
                .matches(&c)
        );
        assert!(
            q("/customer/id", None, Some("cus_"))
                .parse()
                .unwrap()
                .matches(&c)
        );
        assert!(
            !q("/customer/id", Some("cus_4"), None)
                .parse()
                .unwrap()
                .matches(&c)
        );
        assert!(!q("/nope", Some("x"), None).parse().unwrap().matches(&c));
        assert!(
            q("customer", Some("x"), None).parse().is_err(),
            "not a pointer"
        );
        let ranged = FilterQuery {
            retries_min: Some("3".into()),
            ..FilterQuery::default()
        };
        assert!(!ranged.parse().unwrap().matches(&c));
        let timed = FilterQuery {
            from: Some("2000".into()),
            ..FilterQuery::default()
        };
        assert!(!timed.parse().unwrap().matches(&c));
        let reason = FilterQuery {
            reason: Some("declined".into()),
            ..FilterQuery::default()
        };
        assert!(reason.parse().unwrap().matches(&c));
    }
}
