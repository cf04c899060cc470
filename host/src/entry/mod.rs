//! What an entry is on its way: read, handed to a handler, decided, parked, remembered. Values
//! and pure rules; the pipeline above moves them.
//!
//! - [`delivery`] is what one read entry becomes: its id, fields as bytes, and the bookkeeping
//!   a delayed retry carries (checked against the stream's secret).
//! - [`outcome`] is a pure function from the handler's result and the retry policy to an
//!   action: ack, retry after a delay, or dead-letter.
//! - [`member`] is what a parked retry is in its delayed set and in the retry lane.
//! - [`history`] is the record every park and dead letter adds to the entry's history.

pub mod delivery;
pub mod history;
pub mod member;
pub mod outcome;
