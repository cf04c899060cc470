//! Where each key the polling doorbell serves stands: which read names a stream (the chunks
//! of up to [`KEYS_PER_READ`] streams, [`Doorbell::place`]), the last id seen on it and how it
//! moves when entries come ([`Doorbell::advance`]) or the stream is made again
//! ([`Doorbell::recheck`]), and each delayed set's earliest due time
//! ([`Doorbell::poll_sets`]). The reads themselves are [`super::poll`]'s.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::poll::{EARLIEST, KEYS_PER_READ, TIPS};
use super::{Doorbell, Down, Kind, OUT, QUIET, RANG, UNSUBSCRIBE_AFTER};

impl Doorbell {
    /// The chunks of keys that idle readers read after they rang (to be read again).
    pub(super) fn take_rejoined(&self) -> Vec<usize> {
        let names: Vec<Arc<str>> = std::mem::take(
            &mut *self
                .rejoined
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let map = self.lock();
        names
            .iter()
            .filter_map(|name| map.get(name).and_then(|k| k.chunk))
            .collect()
    }

    /// Look at `keys`' last ids again: a key that is not a stream now leaves the reads (rung
    /// once, so that its reader's own read says what is wrong); one that is a stream again
    /// comes back; one whose last id went below what was seen is read from there. The chunks
    /// whose reads changed.
    pub(super) async fn recheck(&self, keys: &[Arc<str>]) -> Result<Vec<usize>, Down> {
        let mut changed = Vec::new();
        for chunk in keys.chunks(KEYS_PER_READ) {
            let tips = self.script(&TIPS, chunk, "the streams' last ids").await?;
            let mut map = self.lock();
            for (name, tip) in chunk.iter().zip(tips) {
                let Some(key) = map.get_mut(name) else {
                    continue;
                };
                let moved = if tip == "!" {
                    !std::mem::replace(&mut key.bad, true)
                } else if key.bad {
                    key.bad = false;
                    if !tip.is_empty() {
                        key.last = Some(tip);
                    }
                    true
                } else if !tip.is_empty()
                    && key.last.as_deref().is_some_and(|last| below(&tip, last))
                {
                    key.last = Some(tip);
                    true
                } else {
                    false
                };
                if moved {
                    key.ring();
                    if let Some(i) = key.chunk {
                        changed.push(i);
                    }
                }
            }
        }
        changed.sort_unstable();
        changed.dedup();
        Ok(changed)
    }

    /// Move `keys` (streams that got entries) to their last entry, then ring them: a reader
    /// rung now reads everything up to there, and the next read answers for what comes after.
    pub(super) async fn advance(&self, keys: &[Arc<str>]) -> Result<(), Down> {
        for chunk in keys.chunks(KEYS_PER_READ) {
            let tips = self.script(&TIPS, chunk, "the streams' last ids").await?;
            let mut map = self.lock();
            for (name, tip) in chunk.iter().zip(tips) {
                if let Some(key) = map.get_mut(name) {
                    if tip == "!" {
                        key.bad = true;
                    } else if !tip.is_empty() {
                        // Emptied meanwhile: what comes next has a higher id than what was
                        // seen.
                        key.last = Some(tip);
                    }
                    // Rung again before a reader read it: out of the reads until one has.
                    let _ =
                        key.awaiting
                            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |state| {
                                Some(if state == QUIET { RANG } else { OUT })
                            });
                    key.ring();
                }
            }
        }
        Ok(())
    }

    /// Take in what is wanted and not polled yet: a stream seen before is read on from where
    /// it was; a new one from its last entry, rung once; a delayed set gets its first look,
    /// rung once.
    pub(super) async fn poll_reconcile(&self) -> Result<(), Down> {
        let fresh: Vec<Arc<str>> = {
            let mut map = self.lock();
            let mut fresh = Vec::new();
            for (name, key) in map.iter_mut() {
                if key.wanted == 0 || key.subscribed || key.kind != Kind::Stream {
                    continue;
                }
                if key.last.is_some() {
                    key.subscribed = true;
                } else {
                    fresh.push(name.clone());
                }
            }
            fresh
        };
        for chunk in fresh.chunks(KEYS_PER_READ) {
            let tips = self.script(&TIPS, chunk, "the streams' last ids").await?;
            let mut map = self.lock();
            for (name, tip) in chunk.iter().zip(tips) {
                if let Some(key) = map.get_mut(name) {
                    key.last = Some(if tip.is_empty() {
                        "0-0".to_owned()
                    } else {
                        tip
                    });
                    key.subscribed = true;
                    key.ring();
                }
            }
        }
        self.poll_sets(true).await
    }

    /// Fit the polled streams into `chunks` (a key keeps its chunk while it is polled; a new
    /// one goes where there is room): the chunks that changed.
    pub(super) fn place(&self, chunks: &mut Vec<Vec<Arc<str>>>) -> Vec<usize> {
        let mut map = self.lock();
        let mut changed = Vec::new();
        for (i, chunk) in chunks.iter_mut().enumerate() {
            let before = chunk.len();
            chunk.retain(|name| {
                let keep = map.get(name).is_some_and(|k| k.subscribed);
                if !keep && let Some(key) = map.get_mut(name) {
                    key.chunk = None;
                }
                keep
            });
            if chunk.len() != before {
                changed.push(i);
            }
        }
        for (name, key) in map.iter_mut() {
            if key.kind != Kind::Stream || !key.subscribed || key.chunk.is_some() {
                continue;
            }
            let i = match chunks.iter().position(|c| c.len() < KEYS_PER_READ) {
                Some(i) => i,
                None => {
                    chunks.push(Vec::new());
                    chunks.len() - 1
                }
            };
            chunks[i].push(name.clone());
            key.chunk = Some(i);
            if !changed.contains(&i) {
                changed.push(i);
            }
        }
        changed
    }

    /// Look at the wanted delayed sets' earliest due times (only those not looked at yet, with
    /// `only_new`), and ring each whose changed (or that is looked at for the first time).
    pub(super) async fn poll_sets(&self, only_new: bool) -> Result<(), Down> {
        let keys: Vec<Arc<str>> = self
            .lock()
            .iter()
            .filter(|(_, k)| k.kind == Kind::Set && k.wanted > 0 && !(only_new && k.subscribed))
            .map(|(name, _)| name.clone())
            .collect();
        for chunk in keys.chunks(KEYS_PER_READ) {
            let earliest = self
                .script(&EARLIEST, chunk, "the delayed sets' due times")
                .await?;
            let mut map = self.lock();
            for (name, score) in chunk.iter().zip(earliest) {
                if let Some(key) = map.get_mut(name) {
                    if !key.subscribed || key.last.as_deref() != Some(score.as_str()) {
                        key.ring();
                    }
                    key.last = Some(score);
                    key.subscribed = true;
                }
            }
        }
        Ok(())
    }

    /// How many delayed sets are wanted now.
    pub(super) fn sets_wanted(&self) -> usize {
        self.lock()
            .values()
            .filter(|k| k.kind == Kind::Set && k.wanted > 0)
            .count()
    }

    /// Stop polling what nobody has wanted for [`UNSUBSCRIBE_AFTER`]: whether a stream left.
    pub(super) fn drop_unwanted(&self) -> bool {
        let now = Instant::now();
        let mut streams = false;
        for key in self.lock().values_mut() {
            if key.wanted == 0
                && key.subscribed
                && key
                    .unwanted_since
                    .is_some_and(|since| now.duration_since(since) >= UNSUBSCRIBE_AFTER)
            {
                key.subscribed = false;
                streams |= key.kind == Kind::Stream;
            }
        }
        streams
    }
}

/// Whether stream id `a` is below `b` (`ms-seq`, compared as numbers).
fn below(a: &str, b: &str) -> bool {
    let parse = |id: &str| {
        let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
        (
            ms.parse::<u64>().unwrap_or(0),
            seq.parse::<u64>().unwrap_or(0),
        )
    };
    parse(a) < parse(b)
}

#[cfg(test)]
mod tests {
    use super::below;

    #[test]
    fn stream_ids_compare_as_numbers() {
        assert!(below("9-0", "10-0"));
        assert!(below("10-2", "10-10"));
        assert!(!below("10-0", "10-0"));
        assert!(!below("9999999999999-0", "1796371437440-0"));
    }
}
