//! Workspace integration tests live in `all/`; this library is empty.
