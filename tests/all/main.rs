//! Integration tests of the whole path, entry to settled outcome, against a real `redis-server`
//! started on a free port and real compiled guest components. One test binary, as wasmtime's
//! own tests are laid out.

mod common;
mod foundation;
