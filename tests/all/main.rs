//! Integration tests of the whole path, entry to settled outcome, against a real `redis-server`
//! started on a free port and real compiled guest components. One test binary, as wasmtime's
//! own tests are laid out.

// Test code: a failed expectation should panic with its message; the tests read the real wall
// clock (the host reads its own through `clock::now`, which a test may move).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

mod admin;
mod browser;
mod cli;
mod cluster;
mod common;
mod consuming;
mod crash;
mod cron;
mod dedupe;
mod delayed;
mod density;
mod effects;
mod entries;
mod examples;
mod fan_out;
mod flow;
mod guest_async;
mod handler_tests;
mod jobs;
mod lane;
mod lua;
mod network;
mod operate;
mod operations;
mod ordered;
mod projects;
mod properties;
mod redis_access;
mod retention;
mod roles;
mod rollout;
mod sandbox;
mod scaling;
mod scheduled;
mod structure;
mod swap;
mod traces;
mod ui;
mod upgrade;
