//! What the host wrote into the dead-letter stream, read back: the layouts of its bookkeeping
//! (a delivery's [`TAIL`], a parked member's), an entry's fields decoded into a
//! [`DeadLetter`], and how trust in that bookkeeping is decided.
//!
//! A letter is ours when the subscription it names is the one it is read for; its origin id is
//! trusted (kept by a requeue) only when it is ours and either the host's seal over it verifies
//! with the stream's secret, or it is in the earlier release's form (no seal) and was written
//! before this release took over the dead-letter stream (the secret's legacy cutoff).

use super::letter::{DeadLetter, Owner, Shape};
use crate::store::keys::{self, Seal};

/// The bookkeeping a delivery's dead letter ends with, in order.
pub const TAIL: [&str; 8] = [
    keys::REASON,
    keys::ORIGIN_STREAM,
    keys::ORIGIN_GROUP,
    keys::ORIGIN_ID,
    keys::ENTRY_ID,
    keys::RETRY_COUNT,
    keys::DELIVERY_COUNT,
    keys::MARK,
];

/// The same, as the earlier release wrote it: without the seal.
pub(super) const LEGACY_TAIL: &[&str] = TAIL.split_at(7).0;

/// The fields of a dead letter the sweep (or an operator) wrote for a parked member.
const MEMBER_LAYOUT: [&str; 6] = [
    keys::MEMBER,
    keys::REASON,
    keys::ORIGIN_KEY,
    keys::ORIGIN_STREAM,
    keys::ORIGIN_GROUP,
    keys::MARK,
];

/// The same, as the earlier release wrote it: no group, no seal.
pub(super) const LEGACY_MEMBER_LAYOUT: &[&str] = MEMBER_LAYOUT.split_at(4).0;

/// An entry's fields as Redis answers them.
type FieldPairs = Vec<(Vec<u8>, Vec<u8>)>;

/// A field's value as text (lossy: bookkeeping the host wrote is UTF-8).
fn text(value: &[u8]) -> String {
    String::from_utf8_lossy(value).into_owned()
}

/// Whether `part` is exactly the fields `names`, in order.
fn names_are(part: &[(Vec<u8>, Vec<u8>)], names: &[&str]) -> bool {
    part.len() == names.len()
        && part
            .iter()
            .zip(names)
            .all(|((n, _), want)| n.as_slice() == want.as_bytes())
}

/// Whether the letter `id` is one the earlier release wrote before this one took over the
/// dead-letter stream `owner` reads (the secret's legacy cutoff).
fn legacy_trusted(owner: &Owner<'_>, id: &str) -> bool {
    owner
        .secret
        .is_some_and(|secret| secret.trusts_legacy(owner.key, id))
}

impl DeadLetter {
    /// Decode the entry `id` of a dead-letter stream with `fields` as Redis returned them, for
    /// the subscription `owner`.
    pub fn decode(id: String, mut fields: Vec<(Vec<u8>, Vec<u8>)>, owner: &Owner<'_>) -> Self {
        // A traceback comes last, after the bookkeeping.
        if let Some((name, value)) = fields.last()
            && name.as_slice() == keys::TRACE.as_bytes()
        {
            let trace = text(value);
            let pair = fields.pop();
            let mut letter = Self::decode_layout(id.clone(), fields.clone(), owner);
            if letter.shape == Shape::Delivery {
                letter.trace = Some(trace);
                return letter;
            }
            // Not Sluice's layout with a traceback after it: the field is one of the entry's.
            fields.extend(pair);
            return Self::decode_layout(id, fields, owner);
        }
        Self::decode_layout(id, fields, owner)
    }

    /// The letter by the layout its field names have: a delivery's, a member's, or none.
    fn decode_layout(id: String, fields: Vec<(Vec<u8>, Vec<u8>)>, owner: &Owner<'_>) -> Self {
        let n = fields.len();
        for (tail, sealed) in [(&TAIL[..], true), (LEGACY_TAIL, false)] {
            if n >= tail.len() && names_are(&fields[n - tail.len()..], tail) {
                return Self::from_delivery(id, fields, tail.len(), sealed, owner);
            }
        }
        if names_are(&fields, &MEMBER_LAYOUT) || names_are(&fields, LEGACY_MEMBER_LAYOUT) {
            return Self::from_member(id, fields, owner);
        }
        Self {
            not_requeueable: Some("it was not written by Sluice".to_owned()),
            ours: true,
            ..Self::bare(id, Shape::Foreign, fields)
        }
    }

    /// A delivery's dead letter: its fields, then `tail_len` fields of bookkeeping (sealed, or
    /// the earlier release's).
    fn from_delivery(
        id: String,
        fields: Vec<(Vec<u8>, Vec<u8>)>,
        tail_len: usize,
        sealed: bool,
        owner: &Owner<'_>,
    ) -> Self {
        let (written, tail) = fields.split_at(fields.len() - tail_len);
        let value = |i: usize| text(&tail[i].1);
        let (stream, group, origin_id) = (value(1), value(2), value(3));
        let ours = stream == owner.stream && group == owner.group;
        // Which seal verifies says whether the fields are packed; without one (an earlier
        // release's dead letter), a lone `sluice-packed-fields` field is taken as packed.
        let sealed_as = if sealed && ours {
            delivery_seal(owner, [&stream, &group, &origin_id], written, &tail[7].1)
        } else {
            None
        };
        let trusted = ours
            && match sealed_as {
                Some(_) => true,
                None => !sealed && legacy_trusted(owner, &id),
            };
        let unpack = match sealed_as {
            Some(use_) => use_ == Seal::DeadLetterPacked,
            None => is_packed(written),
        };
        let (own, mut not_requeueable) = own_fields(written, unpack);
        if !ours {
            not_requeueable = Some(format!(
                "it belongs to stream `{stream}` group `{group}`, not to this subscription"
            ));
        }
        Self {
            reason: Some(value(0)),
            origin_id: Some(origin_id),
            entry_id: Some(value(4)),
            retry_count: value(5).parse().ok(),
            delivery_count: value(6).parse().ok(),
            not_requeueable,
            origin: Some((stream, group)),
            ours,
            trusted,
            ..Self::bare(id, Shape::Delivery, own)
        }
    }

    /// A parked member dead-lettered raw.
    fn from_member(id: String, fields: Vec<(Vec<u8>, Vec<u8>)>, owner: &Owner<'_>) -> Self {
        let reason = Some(text(&fields[1].1));
        let written = MemberOrigin {
            set: text(&fields[2].1),
            stream: text(&fields[3].1),
            group: fields.get(4).map(|(_, g)| text(g)),
        };
        let ours = written.stream == owner.stream
            && written.group.as_deref().is_none_or(|g| g == owner.group)
            && owner.set == Some(written.set.as_str());
        let vouched = written.sealed(owner, &fields)
            || (fields.len() == LEGACY_MEMBER_LAYOUT.len() && legacy_trusted(owner, &id));
        let origin = Some((
            written.stream.clone(),
            written.group.clone().unwrap_or_default(),
        ));
        let parked = match crate::entry::member::decode(&fields[0].1, 0) {
            Ok(parked) => parked,
            Err(err) => {
                return Self {
                    reason,
                    not_requeueable: Some(err.to_string()),
                    origin,
                    ours,
                    ..Self::bare(id, Shape::Member, fields)
                };
            }
        };
        let belongs = written.holds(parked.owner.as_ref());
        // Another subscription's member that reached this set (a set shared under an earlier
        // release, or a subscription renamed): requeueable here, as an entry of its own (its
        // origin is not this subscription's to vouch for).
        let not_requeueable = (!ours).then(|| {
            format!(
                "it came from delayed set `{}` of stream `{}`, not from this subscription's",
                written.set, written.stream
            )
        });
        Self {
            reason,
            not_requeueable,
            origin_id: Some(parked.origin_id),
            entry_id: Some(parked.entry_id),
            retry_count: Some(parked.retry_count),
            origin,
            ours,
            trusted: ours && belongs && vouched,
            ..Self::bare(id, Shape::Member, parked.fields)
        }
    }
}

/// Whether the fields a delivery's letter holds before its bookkeeping are one
/// `sluice-packed-fields` field (the form of an entry with too many fields).
pub(super) fn is_packed(written: &[(Vec<u8>, Vec<u8>)]) -> bool {
    matches!(written, [(name, _)] if name.as_slice() == keys::PACKED_FIELDS.as_bytes())
}

/// Which of the delivery seals (plain or packed fields) `mark` is, over the letter's stream,
/// group and origin id and the digest of the fields `written` before the bookkeeping; `None`
/// when neither verifies or there is no secret.
fn delivery_seal(
    owner: &Owner<'_>,
    [stream, group, origin_id]: [&str; 3],
    written: &[(Vec<u8>, Vec<u8>)],
    mark: &[u8],
) -> Option<Seal> {
    let secret = owner.secret?;
    let digest = keys::fields_digest(written);
    let parts: [&[u8]; 4] = [
        stream.as_bytes(),
        group.as_bytes(),
        origin_id.as_bytes(),
        digest.as_bytes(),
    ];
    [Seal::DeadLetter, Seal::DeadLetterPacked]
        .into_iter()
        .find(|use_| secret.verify(*use_, &parts, mark))
}

/// The entry's own fields of a delivery's letter: `written` (unpacked when `unpack`), with the
/// producer's names as it wrote them (see `keys::escaped_name`); and why it cannot be requeued,
/// when its packed fields do not decode.
fn own_fields(written: &[(Vec<u8>, Vec<u8>)], unpack: bool) -> (FieldPairs, Option<String>) {
    let mut own = written.to_vec();
    let mut not_requeueable = None;
    if unpack && let [(_, packed)] = written {
        match crate::entry::delivery::unpack_fields(packed) {
            Some(unpacked) => own = unpacked,
            None => not_requeueable = Some("its packed fields do not decode".to_owned()),
        }
    }
    for (name, _) in &mut own {
        if name.starts_with(keys::PRODUCER_PREFIX.as_bytes()) {
            *name = keys::producer_name(name).to_vec();
        }
    }
    (own, not_requeueable)
}

/// Where a member's letter says the member was parked: the set, its stream and (this
/// release's) group.
struct MemberOrigin {
    set: String,
    stream: String,
    group: Option<String>,
}

impl MemberOrigin {
    /// Whether the letter's seal (its last field, when it has one) verifies over this origin
    /// and the member with `owner`'s secret.
    fn sealed(&self, owner: &Owner<'_>, fields: &[(Vec<u8>, Vec<u8>)]) -> bool {
        fields.get(5).is_some_and(|(_, mark)| {
            owner.secret.is_some_and(|secret| {
                let parts: [&[u8]; 4] = [
                    self.set.as_bytes(),
                    self.stream.as_bytes(),
                    self.group.as_deref().unwrap_or_default().as_bytes(),
                    &fields[0].1,
                ];
                secret.verify(Seal::Member, &parts, mark)
            })
        })
    }

    /// Whether the member's own record of its subscription (`parked`, when it has one) is this
    /// origin's.
    fn holds(&self, parked: Option<&(String, String)>) -> bool {
        parked
            .is_none_or(|(s, g)| *s == self.stream && self.group.as_deref().is_none_or(|o| o == g))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::keys::Secret;

    fn pairs(items: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
        items
            .iter()
            .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    const OWNER: Owner<'static> = Owner {
        stream: "s",
        group: "g",
        set: Some("s.delayed"),
        secret: None,
        key: "s.g.dead-letter",
    };

    /// A delivery's dead letter of the earlier release (no seal) written for `group`.
    fn legacy_letter(group: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
        pairs(&[
            ("payload", "{}"),
            (keys::REASON, "the producer's own"),
            (keys::REASON, "declined"),
            (keys::ORIGIN_STREAM, "s"),
            (keys::ORIGIN_GROUP, group),
            (keys::ORIGIN_ID, "1-0"),
            (keys::ENTRY_ID, "4-0"),
            (keys::RETRY_COUNT, "2"),
            (keys::DELIVERY_COUNT, "3"),
        ])
    }

    #[test]
    fn a_deliverys_dead_letter_keeps_the_producers_own_sluice_fields() {
        let letter = DeadLetter::decode("5-0".into(), legacy_letter("g"), &OWNER);
        assert_eq!(letter.shape, Shape::Delivery);
        assert_eq!(letter.reason.as_deref(), Some("declined"));
        assert_eq!(letter.origin_id.as_deref(), Some("1-0"));
        assert_eq!(letter.retry_count, Some(2));
        assert_eq!(
            letter.fields,
            pairs(&[("payload", "{}"), (keys::REASON, "the producer's own")])
        );
        assert!(letter.not_requeueable.is_none());
        assert!(letter.ours);
        assert!(!letter.trusted, "no secret, no trust");
        assert!(letter.reason_contains("DECLINED"));
        assert_eq!(letter.written_ms(), Some(5));
    }

    /// A traceback after the bookkeeping is the letter's, not one of the entry's fields (a
    /// requeue leaves it); on an entry Sluice did not write, the same field stays the entry's.
    #[test]
    fn a_traceback_is_kept_apart_only_after_sluices_bookkeeping() {
        let mut fields = legacy_letter("g");
        fields.extend(pairs(&[(keys::TRACE, "Traceback\n  File \"app.py\"")]));
        let letter = DeadLetter::decode("5-0".into(), fields, &OWNER);
        assert_eq!(letter.shape, Shape::Delivery);
        assert_eq!(
            letter.trace.as_deref(),
            Some("Traceback\n  File \"app.py\"")
        );
        assert_eq!(
            letter.fields,
            pairs(&[("payload", "{}"), (keys::REASON, "the producer's own")])
        );
        let foreign = pairs(&[("payload", "{}"), (keys::TRACE, "mine")]);
        let letter = DeadLetter::decode("6-0".into(), foreign.clone(), &OWNER);
        assert_eq!(letter.shape, Shape::Foreign);
        assert_eq!(letter.trace, None);
        assert_eq!(letter.fields, foreign);
    }

    #[test]
    fn another_groups_dead_letter_is_not_ours() {
        let letter = DeadLetter::decode("5-0".into(), legacy_letter("other"), &OWNER);
        assert!(!letter.ours);
        assert!(
            letter
                .not_requeueable
                .as_deref()
                .is_some_and(|why| why.contains("group `other`")),
            "{letter:?}"
        );
    }

    #[test]
    fn only_a_sealed_or_old_enough_dead_letter_has_a_trusted_origin() {
        // The dead-letter stream's last id when this release first used it: 99-0.
        let secret = Secret::from_value("k").with_legacy_cutoff("s.g.dead-letter", "99-0");
        let owner = Owner {
            secret: Some(&secret),
            ..OWNER
        };
        // The earlier release's form: trusted only on entries that were there before.
        assert!(DeadLetter::decode("99-0".into(), legacy_letter("g"), &owner).trusted);
        assert!(!DeadLetter::decode("99-1".into(), legacy_letter("g"), &owner).trusted);
        let elsewhere = Owner {
            key: "other.dead-letter",
            ..owner
        };
        assert!(!DeadLetter::decode("1-0".into(), legacy_letter("g"), &elsewhere).trusted);
        // This release's: the seal over stream, group, origin and the fields before it.
        let own = pairs(&[("payload", "{}")]);
        let digest = keys::fields_digest(&own);
        let seal = |origin: &str| {
            secret.seal(
                Seal::DeadLetter,
                &[b"s", b"g", origin.as_bytes(), digest.as_bytes()],
            )
        };
        let sealed = |origin: &str, mark: &str| {
            let mut fields = own.clone();
            fields.extend(pairs(&[
                (keys::REASON, "declined"),
                (keys::ORIGIN_STREAM, "s"),
                (keys::ORIGIN_GROUP, "g"),
                (keys::ORIGIN_ID, origin),
                (keys::ENTRY_ID, "4-0"),
                (keys::RETRY_COUNT, "2"),
                (keys::DELIVERY_COUNT, "3"),
                (keys::MARK, mark),
            ]));
            fields
        };
        let good = DeadLetter::decode("500-0".into(), sealed("1-0", &seal("1-0")), &owner);
        assert!(good.trusted && good.ours, "{good:?}");
        // A forged origin under a real seal, or a made-up seal: not trusted, still requeueable
        // (as a new entry of its own).
        let forged = DeadLetter::decode("500-0".into(), sealed("7-0", &seal("1-0")), &owner);
        assert!(!forged.trusted);
        assert!(forged.not_requeueable.is_none());
        let made_up = DeadLetter::decode("500-0".into(), sealed("1-0", &"0".repeat(40)), &owner);
        assert!(!made_up.trusted);
    }

    #[test]
    fn foreign_entries_are_shown_but_not_requeued() {
        let letter = DeadLetter::decode("1-0".into(), pairs(&[("x", "y")]), &OWNER);
        assert_eq!(letter.shape, Shape::Foreign);
        assert!(letter.not_requeueable.is_some());
    }
}
