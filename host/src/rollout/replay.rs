//! Replay (in progress).
