//! `[[subscription.schedule]]`: entries a subscription gives itself on a cron schedule. Each
//! one is checked here, before anything runs: the cron expression (five fields, or six with
//! seconds first) parses and fires at least once, the time zone is an IANA name, the entry
//! (`payload`, a TOML table written as JSON, or `fields`) is within bounds.

use std::str::FromStr as _;

use serde::Deserialize;

use super::ConfigError;
use super::check::Validator;

/// The most schedules one subscription may have.
pub const MAX_SCHEDULES: usize = 100;
/// The largest entry a schedule may write (its fields' names and values).
pub const MAX_SCHEDULE_ENTRY_BYTES: usize = 64 * 1024;

/// One `[[subscription.schedule]]` table, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSchedule {
    name: Option<String>,
    cron: String,
    time_zone: Option<String>,
    payload: Option<toml::Table>,
    fields: Option<toml::Table>,
    missed: Option<String>,
}

/// What a tick that no host could fire (every host down, Redis away) becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missed {
    /// Nothing: the next tick fires as usual.
    Skip,
    /// One entry, as soon as a host can fire it, however many ticks were missed.
    Once,
}

/// What a schedule's tick writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScheduledEntry {
    /// This JSON in the subscription's payload field (known once its descriptor is).
    Payload(String),
    /// These fields, names and values.
    Fields(Vec<(String, String)>),
}

impl ScheduledEntry {
    /// The entry's fields, the payload in `payload_field`.
    pub fn fields(&self, payload_field: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
        match self {
            Self::Payload(json) => {
                vec![(payload_field.as_bytes().to_vec(), json.as_bytes().to_vec())]
            }
            Self::Fields(fields) => fields
                .iter()
                .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
                .collect(),
        }
    }
}

/// A schedule, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// Its name: what its Redis state is keyed by, so renaming it starts it afresh and
    /// editing its expression keeps its ticks (no tick fires twice across the change).
    pub name: String,
    /// The cron expression, as written.
    pub cron: String,
    /// The time zone its expression is read in.
    pub time_zone: chrono_tz::Tz,
    /// The entry each tick writes.
    pub entry: ScheduledEntry,
    /// What a missed tick becomes.
    pub missed: Missed,
}

impl Schedule {
    /// The parsed expression (checked when the config was read).
    pub fn expression(&self) -> croner::Cron {
        parse(&self.cron).unwrap_or_else(|_| unreachable!("checked when the config was read"))
    }

    /// The first tick strictly after `after_ms` (epoch ms), as epoch ms, in its time zone.
    /// Ticks are whole seconds.
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        use chrono::TimeZone as _;
        let after = chrono::Utc
            .timestamp_millis_opt(after_ms.div_euclid(1000) * 1000)
            .single()?
            .with_timezone(&self.time_zone);
        let next = self.expression().find_next_occurrence(&after, false).ok()?;
        Some(next.timestamp_millis())
    }

    /// The last tick at or before `at_ms` (epoch ms).
    pub fn last_at_or_before(&self, at_ms: i64) -> Option<i64> {
        use chrono::TimeZone as _;
        let at = chrono::Utc
            .timestamp_millis_opt(at_ms.div_euclid(1000) * 1000)
            .single()?
            .with_timezone(&self.time_zone);
        let last = self.expression().find_previous_occurrence(&at, true).ok()?;
        Some(last.timestamp_millis())
    }
}

/// `cron` parsed: five fields, or six with seconds first; no years.
fn parse(cron: &str) -> Result<croner::Cron, croner::errors::CronError> {
    croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Optional)
        .year(croner::parser::Year::Disallowed)
        .build()
        .parse(cron)
}

/// The subscription's `schedule` tables, checked.
pub(super) fn schedules(
    v: &Validator<'_>,
    key: &dyn Fn(&str) -> String,
    raw: Option<&[RawSchedule]>,
) -> Result<Vec<Schedule>, ConfigError> {
    let raw = raw.unwrap_or_default();
    if raw.len() > MAX_SCHEDULES {
        return Err(v.invalid(
            &key("schedule"),
            &raw.len().to_string(),
            &format!("at most {MAX_SCHEDULES} schedules a subscription"),
        ));
    }
    let mut out: Vec<Schedule> = Vec::with_capacity(raw.len());
    for (n, s) in raw.iter().enumerate() {
        let at = |k: &str| key(&format!("schedule[{n}].{k}"));
        if raw.len() > 1 && s.name.is_none() {
            return Err(v.invalid(
                &at("name"),
                "(none)",
                "give each schedule a `name` when there are several: its ticks are kept under it, and a position would move when one is added or removed",
            ));
        }
        let schedule = one(v, &at, s, n)?;
        if out.iter().any(|o| o.name == schedule.name) {
            return Err(v.invalid(
                &at("name"),
                &schedule.name,
                "two schedules of one subscription share this name (each one's ticks are kept under its name)",
            ));
        }
        out.push(schedule);
    }
    Ok(out)
}

fn one(
    v: &Validator<'_>,
    at: &dyn Fn(&str) -> String,
    s: &RawSchedule,
    n: usize,
) -> Result<Schedule, ConfigError> {
    let name = s.name.clone().unwrap_or_else(|| (n + 1).to_string());
    if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
        return Err(v.invalid(
            &at("name"),
            &name,
            "1 to 128 characters, no control characters",
        ));
    }
    parse(&s.cron).map_err(|e| {
        v.invalid(
            &at("cron"),
            &s.cron,
            &format!("{e} (five fields, or six with seconds first, like \"*/5 * * * *\")"),
        )
    })?;
    let time_zone = match s.time_zone.as_deref() {
        None => chrono_tz::UTC,
        Some(tz) => chrono_tz::Tz::from_str(tz).map_err(|_| {
            v.invalid(
                &at("time_zone"),
                tz,
                "not an IANA time zone (like \"UTC\" or \"Europe/Berlin\")",
            )
        })?,
    };
    let entry = entry(v, at, s)?;
    let missed = match s.missed.as_deref() {
        None | Some("skip") => Missed::Skip,
        Some("once") => Missed::Once,
        Some(other) => {
            return Err(v.invalid(
                &at("missed"),
                other,
                "expected \"skip\" (a tick no host could fire is dropped) or \"once\" (one entry when a host can)",
            ));
        }
    };
    let schedule = Schedule {
        name,
        cron: s.cron.clone(),
        time_zone,
        entry,
        missed,
    };
    // An expression that never fires (the 30th of February) is a mistake, said now.
    let now = crate::support::clock::now_ms() as i64;
    if schedule.next_after(now).is_none() {
        return Err(v.invalid(&at("cron"), &s.cron, "it never fires"));
    }
    Ok(schedule)
}

/// The entry a schedule writes: `payload` as JSON in the payload field, or `fields`.
fn entry(
    v: &Validator<'_>,
    at: &dyn Fn(&str) -> String,
    s: &RawSchedule,
) -> Result<ScheduledEntry, ConfigError> {
    let entry = match (&s.payload, &s.fields) {
        (Some(payload), None) => {
            ScheduledEntry::Payload(serde_json::to_string(payload).map_err(|e| {
                v.invalid(
                    &at("payload"),
                    "{ .. }",
                    &format!("cannot be written as JSON: {e}"),
                )
            })?)
        }
        (None, Some(fields)) if !fields.is_empty() => fields
            .iter()
            .map(|(name, value)| match value {
                toml::Value::String(text) => Ok((name.clone(), text.clone())),
                other => Err(v.invalid(
                    &at(&format!("fields.{name}")),
                    &other.to_string(),
                    "expected text (a stream field's value is text)",
                )),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(ScheduledEntry::Fields)?,
        _ => {
            return Err(v.invalid(
                &at("payload"),
                "{ .. }",
                "name exactly one of `payload` (a table, written as JSON) and `fields` (names to text)",
            ));
        }
    };
    let bytes: usize = entry
        .fields("payload")
        .iter()
        .map(|(n, v)| n.len() + v.len())
        .sum();
    if bytes > MAX_SCHEDULE_ENTRY_BYTES {
        return Err(v.invalid(
            &at("payload"),
            &format!("{bytes} bytes"),
            &format!("a scheduled entry is at most {MAX_SCHEDULE_ENTRY_BYTES} bytes"),
        ));
    }
    Ok(entry)
}

#[cfg(test)]
mod tests {
    use super::super::file::parse_file;
    use super::*;

    fn load(schedule: &str) -> Result<Vec<Schedule>, String> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("h.wasm"), b"\0asm").unwrap();
        let text = format!("[[subscription]]\ncomponent = \"h.wasm\"\n{schedule}");
        parse_file(&dir.path().join("sluice.toml"), &text)
            .map(|file| file.subscriptions[0].schedules.clone())
            .map_err(|e| crate::support::chain::chain(&e))
    }

    #[test]
    fn schedules_are_read_and_their_mistakes_named() {
        let got = load(
            "[[subscription.schedule]]\nname = \"nightly\"\ncron = \"30 2 * * *\"\ntime_zone = \"Europe/Berlin\"\nmissed = \"once\"\npayload = { job = \"report\", n = 3 }\n[[subscription.schedule]]\nname = \"ping\"\ncron = \"*/10 * * * * *\"\nfields = { kind = \"ping\" }\n",
        )
        .unwrap();
        assert_eq!(got[0].name, "nightly");
        assert_eq!(got[0].missed, Missed::Once);
        assert_eq!(
            got[0].entry,
            ScheduledEntry::Payload(r#"{"job":"report","n":3}"#.into())
        );
        assert_eq!(got[1].name, "ping");
        assert_eq!(
            got[1].entry.fields("payload"),
            vec![(b"kind".to_vec(), b"ping".to_vec())]
        );
        // 02:30 in Berlin is 01:30 UTC in winter: 2026-12-07 is winter.
        let midnight_utc = 1_796_601_600_000; // 2026-12-07T00:00:00Z
        assert_eq!(
            got[0].next_after(midnight_utc),
            Some(midnight_utc + 90 * 60_000)
        );
        // Ticks are whole seconds, whatever the millisecond asked from.
        assert_eq!(
            got[1].next_after(midnight_utc + 1_234),
            Some(midnight_utc + 10_000)
        );
        assert_eq!(
            got[1].last_at_or_before(midnight_utc + 10_999),
            Some(midnight_utc + 10_000)
        );
        let err =
            |schedule: &str| load(&format!("[[subscription.schedule]]\n{schedule}")).unwrap_err();
        assert!(err("cron = \"nope\"\npayload = {}").contains("schedule[0].cron"));
        assert!(err("cron = \"* * * * * * *\"\npayload = {}").contains("schedule[0].cron"));
        assert!(err("cron = \"0 0 30 2 *\"\npayload = {}").contains("never fires"));
        assert!(
            err("cron = \"* * * * *\"\ntime_zone = \"Mars/Olympus\"\npayload = {}")
                .contains("IANA")
        );
        assert!(err("cron = \"* * * * *\"").contains("exactly one"));
        assert!(
            err("cron = \"* * * * *\"\npayload = {}\nmissed = \"twice\"")
                .contains("schedule[0].missed")
        );
        let unknown = err("cron = \"* * * * *\"\npayload = {}\ncolour = 1");
        assert!(unknown.contains("colour"), "{unknown}");
        assert!(err("cron = \"* * * * *\"\nfields = { n = 1 }").contains("expected text"));
        let big = "x".repeat(MAX_SCHEDULE_ENTRY_BYTES + 1);
        assert!(
            err(&format!(
                "cron = \"* * * * *\"\nfields = {{ a = \"{big}\" }}"
            ))
            .contains("at most")
        );
        let twice = load(
            "[[subscription.schedule]]\nname = \"a\"\ncron = \"* * * * *\"\npayload = {}\n[[subscription.schedule]]\nname = \"a\"\ncron = \"* * * * *\"\npayload = {}\n",
        );
        assert!(twice.unwrap_err().contains("share this name"));
    }
}
