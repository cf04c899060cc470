//! Stream entry ids as text (`<ms>-<seq>`): which strings are one ([`is_stream_id`]) and how
//! two compare ([`cmp_ids`]), as numbers, not as text.

/// Whether `id` is a stream entry id (`<ms>-<seq>`, digits only, each part at most 20 digits
/// as a 64-bit number is): what may name an entry in a key, a cursor or a lookup.
pub fn is_stream_id(id: &str) -> bool {
    let Some((ms, seq)) = id.split_once('-') else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
    digits(ms) && digits(seq)
}

/// Order stream ids numerically (`ms-seq`, each part up to 2^64 - 1).
pub fn cmp_ids(a: &str, b: &str) -> std::cmp::Ordering {
    fn parts(id: &str) -> (u64, u64) {
        let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
        (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
    }
    parts(a).cmp(&parts(b))
}
