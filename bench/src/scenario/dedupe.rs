//! `dedupe`: the cost of deduplication per entry. The wasm fixture acks `n` entries, each with
//! a key of its own (every entry is a first entry: the whole check, no duplicate to skip),
//! without dedupe and with it; then with 30 % duplicates. The goal: dedupe costs at most 10 %
//! of the `wasm` throughput.

use anyhow::Result;

use super::{Bench, Report};

impl Bench {
    /// Without dedupe, with it on distinct keys, and with 30 % duplicates.
    pub async fn dedupe(&self, n: usize) -> Result<Vec<Report>> {
        let on = "dedupe = { payload = \"/account\", window = \"1h\" }\n";
        let mut plain = self.keyed_throughput("dedupe-off", (n, n), "").await?;
        let mut distinct = self.keyed_throughput("dedupe-on", (n, n), on).await?;
        // 7 of 10 entries' keys are new; the rest repeat one.
        let keys = n * 7 / 10;
        let mut dups = self
            .keyed_throughput("dedupe-30pct-dups", (n, keys), on)
            .await?;
        let ratio = distinct.msgs_per_s / plain.msgs_per_s;
        distinct.extra.push(("x_of_plain", ratio));
        dups.extra
            .push(("x_of_plain", dups.msgs_per_s / plain.msgs_per_s));
        plain.extra.push(("x_of_plain", 1.0));
        Ok(vec![plain, distinct, dups])
    }
}
