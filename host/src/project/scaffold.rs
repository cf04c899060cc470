//! `sluice new`: a ready project in one command: a handler with a delayed retry, its
//! `sluice.toml`, a README with the next commands and a `.gitignore`. It builds and passes
//! `sluice check` with no edits.

use std::path::{Path, PathBuf};

use super::{Lang, ProjectError, Template, assets, identifier, io};

/// Where a Rust project finds the SDK until `sluice-guest` is on crates.io.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SdkCrates {
    /// The `sluice-guest` crate's directory.
    pub guest: PathBuf,
    /// The `sluice-guest-macros` crate's directory.
    pub macros: PathBuf,
    /// The `sluice-descriptor` crate's directory.
    pub descriptor: PathBuf,
}

impl SdkCrates {
    /// Find the three SDK crates in `dir` or its immediate subdirectories: the repository's
    /// `guest-sdk/` (with `macros/` and `descriptor/`) or a directory of unpacked `.crate`s.
    pub fn find(dir: &Path) -> Result<Self, ProjectError> {
        let mut candidates = vec![dir.to_owned()];
        if let Ok(entries) = std::fs::read_dir(dir) {
            candidates.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
        }
        let find = |wanted: &str| {
            candidates
                .iter()
                .find(|d| package_name(d).as_deref() == Some(wanted))
                .and_then(|d| d.canonicalize().ok())
        };
        match (
            find("sluice-guest"),
            find("sluice-guest-macros"),
            find("sluice-descriptor"),
        ) {
            (Some(guest), Some(macros), Some(descriptor)) => Ok(Self {
                guest,
                macros,
                descriptor,
            }),
            _ => Err(ProjectError::NoSdk {
                dir: dir.to_owned(),
            }),
        }
    }

    /// The SDK of the checkout this binary was built from, if it is still there.
    pub fn of_this_checkout() -> Option<Self> {
        Self::find(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest-sdk")).ok()
    }
}

/// The `name` of the package in `dir/Cargo.toml`, if there is one.
fn package_name(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("Cargo.toml")).ok()?;
    let manifest: toml::Table = toml::from_str(&text).ok()?;
    manifest
        .get("package")?
        .get("name")?
        .as_str()
        .map(str::to_owned)
}

/// Where a new Rust project takes the guest SDK from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SdkSource {
    /// A copy in the project's own `sluice-sdk/`, from this binary: the project builds
    /// wherever it is moved or cloned.
    Vendored,
    /// The crates of a checkout (SDK development), named by paths relative to the project.
    Checkout(SdkCrates),
}

/// Write a new `lang` project named `name` from `template` into `parent/name`; returns its
/// directory.
pub fn new_project(
    parent: &Path,
    name: &str,
    lang: Lang,
    template: Template,
    sdk: &SdkSource,
) -> Result<PathBuf, ProjectError> {
    let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !valid {
        return Err(ProjectError::BadName {
            name: name.to_owned(),
        });
    }
    let dir = parent.join(name);
    if dir.exists() {
        return Err(ProjectError::Exists { path: dir });
    }
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    let mut files = template_files(name, lang, template);
    let fill = filler(name, lang);
    // Build outputs and what `sluice dev` keeps (compile cache, dev Redis data).
    let ignored = "target/\n.sluice/\n";
    match lang {
        Lang::Rust => {
            let patch = sdk_patch(sdk, &dir, &mut files)?;
            files.push(("Cargo.toml".into(), fill(CARGO_TOML) + "\n" + &patch));
            let handler = match template {
                Template::Ack => RUST_HANDLER,
                Template::Http => RUST_HANDLER_HTTP,
            };
            files.push(("src/lib.rs".into(), fill(handler)));
            files.push((".gitignore".into(), ignored.to_owned()));
        }
        Lang::Python => {
            let handler = match template {
                Template::Ack => PYTHON_HANDLER,
                Template::Http => PYTHON_HANDLER_HTTP,
            };
            files.push(("app.py".into(), fill(handler)));
            files.push((".gitignore".into(), format!("{ignored}__pycache__/\n")));
        }
        Lang::Js => {
            let handler = match template {
                Template::Ack => JS_HANDLER,
                Template::Http => JS_HANDLER_HTTP,
            };
            files.push(("src/app.js".into(), fill(handler)));
            files.push((".gitignore".into(), format!("{ignored}node_modules/\n")));
        }
    }
    for (file, text) in files {
        let path = dir.join(file);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        std::fs::write(&path, text).map_err(io(&path))?;
    }
    Ok(dir)
}

/// The template's text with the project's name, identifier and language filled in.
fn filler(name: &str, lang: Lang) -> impl Fn(&str) -> String + '_ {
    let ident = identifier(name);
    move |text: &str| {
        text.replace("{name}", name)
            .replace("{ident}", &ident)
            .replace("{lang}", &lang.to_string())
    }
}

/// The files every language gets from `template`: the config, the README, the example
/// fixtures and (for `http`) the stand-in API.
fn template_files(name: &str, lang: Lang, template: Template) -> Vec<(String, String)> {
    let fill = filler(name, lang);
    let (toml, fixtures) = match template {
        Template::Ack => (SLUICE_TOML, FIXTURES_ACK),
        Template::Http => (SLUICE_TOML_HTTP, FIXTURES_HTTP),
    };
    let readme = match template {
        Template::Ack => fill(README),
        Template::Http => fill(README) + &fill(README_HTTP),
    };
    let mut files: Vec<(String, String)> = vec![
        ("sluice.toml".into(), fill(toml)),
        ("README.md".into(), readme),
        // The handler's own tests, without Redis: `sluice test fixtures/example.json`.
        ("fixtures/example.json".into(), fixtures.to_owned()),
    ];
    if template == Template::Http {
        // Something to call on a developer's machine: the template runs green from the start.
        files.push(("stub_api.py".into(), STUB_API.to_owned()));
    }
    files
}

/// Where a Rust project takes the SDK from: the `[patch]` table of its Cargo.toml, and (for a
/// vendored SDK) the SDK's files added to `files`.
fn sdk_patch(
    sdk: &SdkSource,
    dir: &Path,
    files: &mut Vec<(String, String)>,
) -> Result<String, ProjectError> {
    let patch = match sdk {
        SdkSource::Vendored => {
            for (file, text) in assets::RUST_SDK {
                files.push((format!("{VENDORED_SDK}/{file}"), (*text).to_owned()));
            }
            let at = |c: &str| format!("{VENDORED_SDK}/{c}");
            patch_table(
                "sluice-guest is not on crates.io yet: this project carries the SDK it builds\n# against in sluice-sdk/ (from the `sluice` that made it).",
                &at("guest"),
                &at("macros"),
                &at("descriptor"),
            )
        }
        SdkSource::Checkout(sdk) => {
            let dir = dir.canonicalize().map_err(io(dir))?;
            let rel = |p: &Path| relative(&dir, p).display().to_string();
            patch_table(
                "sluice-guest from a checkout of Sluice, relative to this project.",
                &rel(&sdk.guest),
                &rel(&sdk.macros),
                &rel(&sdk.descriptor),
            )
        }
    };
    Ok(patch)
}

/// The directory of a Rust project that holds its copy of the SDK.
pub const VENDORED_SDK: &str = "sluice-sdk";

fn patch_table(why: &str, guest: &str, macros: &str, descriptor: &str) -> String {
    format!(
        "# {why}\n# Remove this table once sluice-guest is published.\n[patch.crates-io]\nsluice-guest = {{ path = {guest:?} }}\nsluice-guest-macros = {{ path = {macros:?} }}\nsluice-descriptor = {{ path = {descriptor:?} }}\n"
    )
}

/// `to` as a path relative to the directory `from` (both absolute).
fn relative(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<_> = from.components().collect();
    let to: Vec<_> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut rel = PathBuf::new();
    for _ in common..from.len() {
        rel.push("..");
    }
    for part in &to[common..] {
        rel.push(part);
    }
    rel
}

const SLUICE_TOML: &str = r#"# How the host runs this handler. `sluice build` writes the component; `sluice run sluice.toml`
# (or `sluice dev`) runs it. With no `redis` key the host starts a private dev redis-server;
# set `redis = "redis://host:6379"` for a real one.

[[subscription]]
component = "target/{ident}.wasm"
# The hosts this handler may call over HTTP (any other request fails as denied), e.g.
# allowed_outbound_hosts = ["https://api.example.com"]

# Values the handler reads with its SDK's config API.
[subscription.config]
greeting = "hello"
"#;

const README_HTTP: &str = r#"
The handler posts each event to `api_url` (in `sluice.toml`). To try it on your machine, run the
stand-in API first, in another terminal: it answers 200 and prints each event it gets.

```sh
python3 stub_api.py           # on 127.0.0.1:8080, where api_url points
python3 stub_api.py --fail 3  # answers 503 three times first: see the retries wait (`sluice parked`)
```
"#;

/// Made-up deliveries and the outcomes the template's handler gives them (`sluice test`).
const FIXTURES_ACK: &str = include_str!("templates/fixtures_ack.json");
/// The same for the `http` template (its first case needs `stub_api.py` running).
const FIXTURES_HTTP: &str = include_str!("templates/fixtures_http.json");

/// The stand-in API of the `http` template (Python's standard library only).
const STUB_API: &str = include_str!("templates/stub_api.py");

const README: &str = r#"# {name}

A Sluice handler in {lang} for the Redis stream `{name}`; retries wait in the Redis sorted
set `{name}.delayed`, so a retry survives any crash. See `sluice.toml` for how it runs.

```sh
sluice build              # builds target/{ident}.wasm
sluice check              # what the host will do with it (reads ./sluice.toml)
sluice dev                # dev Redis + host; rebuilds and hot-swaps on every save
sluice send '{"id":"1"}'  # (in another terminal) add an entry; `sluice dev` shows it handled
sluice test fixtures/example.json   # the handler on made-up deliveries, no Redis needed
```
"#;

const CARGO_TOML: &str = r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"

# A handler is a WebAssembly component: cargo builds one only for a cdylib.
[lib]
crate-type = ["cdylib"]

[dependencies]
sluice-guest = "0.1"
serde = { version = "1", features = ["derive"] }
tracing = "0.1"

# Its own project, not a member of an enclosing workspace.
[workspace]
"#;

const RUST_HANDLER: &str = r##"//! The {name} handler. `sluice build` compiles it to a WebAssembly component.

use serde::Deserialize;
use sluice_guest::prelude::*;

/// What producers put in an entry's `payload` field, as JSON.
#[derive(Debug, Deserialize)]
struct Event {
    id: String,
    /// Ask for one retry first.
    #[serde(default)]
    retry: bool,
}

#[subscriber(
    RedisStream::new("{name}")
        .group("{name}")
        .delayed_retry(DelayedRetry::durable_zset("{name}.delayed"))
)]
async fn handle(event: &Event, delivery: &Delivery) -> HandlerOutcome {
    if event.retry && delivery.previous_attempts() == 0 {
        tracing::info!(event.id, "retrying in 5 s");
        return HandlerOutcome::retry_after(Duration::from_secs(5));
    }
    let greeting = sluice_guest::config::get("greeting").unwrap_or_default();
    tracing::info!(event.id, origin = %delivery.origin_id, "{greeting}: handled");
    HandlerOutcome::ack()
}

/// `cargo test`: the handler on made-up deliveries, natively, without a host or Redis
/// (`sluice test fixtures/example.json` runs the built component in its sandbox).
#[cfg(test)]
mod tests {
    use super::*;
    use sluice_guest::testing::{TestDelivery, handler};

    #[test]
    fn an_entry_is_acked() {
        let outcome = TestDelivery::json(r#"{"id": "1"}"#)
            .config("greeting", "hello")
            .run(&handler!(handle));
        assert!(outcome.is_ack(), "{outcome:?}");
    }

    #[test]
    fn an_entry_that_asks_is_retried_once_after_5_s() {
        let asks = TestDelivery::json(r#"{"id": "2", "retry": true}"#);
        let first = asks.clone().run(&handler!(handle));
        assert_eq!(first.retry_delay(), Some(Duration::from_secs(5)));
        assert!(asks.retry_count(1).run(&handler!(handle)).is_ack());
    }
}
"##;

const PYTHON_HANDLER: &str = r#""""The {name} handler. `sluice build` compiles it to a WebAssembly component with
componentize-py."""

import logging

from sluice_guest import DelayedRetry, Delivery, RedisStream, ack, config, retry_after, subscriber

log = logging.getLogger("{ident}")


@subscriber(
    RedisStream("{name}")
    .group("{name}")
    .delayed_retry(DelayedRetry.durable_zset("{name}.delayed"))
)
def handle(event: dict, delivery: Delivery):
    if event.get("retry") and delivery.previous_attempts == 0:
        log.info("retrying %s in 5 s", event.get("id"))
        return retry_after(5)
    log.info("%s: handled %s (origin %s)", config.get("greeting", ""), event.get("id"),
             delivery.origin_id)
    return ack()
"#;

const JS_HANDLER: &str = r#"// The {name} handler. `sluice build` compiles it to a WebAssembly component with
// componentize-js. Each build copies src/ into target/sluice/js/src/ with `sluice_guest.js` (the
// SDK) beside it, which is where `./sluice_guest.js` below resolves.

import { subscriber, RedisStream, DelayedRetry, ack, retryAfter, config, log } from "./sluice_guest.js";

export const { handle, subscription } = subscriber(
  new RedisStream("{name}")
    .group("{name}")
    .delayedRetry(DelayedRetry.durableZset("{name}.delayed")),
  async (event, delivery) => {
    if (event.retry && delivery.previousAttempts === 0) {
      log.info("retrying in 5 s", { id: event.id });
      return retryAfter(5);
    }
    log.info(`${config.get("greeting", "")}: handled`, { id: event.id, origin: delivery.originId });
    return ack();
  },
);
"#;

const SLUICE_TOML_HTTP: &str = r#"# How the host runs this handler. `sluice build` writes the component; `sluice run` (or
# `sluice dev`) runs it. With no `redis` key the host starts a private dev redis-server; set
# `redis = "redis://host:6379"` for a real one.

[[subscription]]
component = "target/{ident}.wasm"
# The only hosts this handler may call: any other request fails as denied.
allowed_outbound_hosts = ["http://127.0.0.1:8080"]

# Values the handler reads with its SDK's config API.
[subscription.config]
api_url = "http://127.0.0.1:8080/events"
"#;

const RUST_HANDLER_HTTP: &str = r##"//! The {name} handler: posts each event to an HTTP API. A call that fails for a while (no
//! answer, a timeout, a 5xx or a 429) parks a durable retry in the Redis sorted set
//! `{name}.delayed`, later each time; a refusal (another 4xx) dead-letters the entry, since
//! sending it again would be refused again.

use serde::{Deserialize, Serialize};
use sluice_guest::http::Request;
use sluice_guest::prelude::*;

/// What producers put in an entry's `payload` field, as JSON.
#[derive(Debug, Deserialize, Serialize)]
struct Event {
    id: String,
    #[serde(default)]
    message: String,
}

#[subscriber(
    RedisStream::new("{name}")
        .group("{name}")
        .delayed_retry(DelayedRetry::durable_zset("{name}.delayed"))
)]
async fn handle(event: &Event, delivery: &Delivery) -> HandlerOutcome {
    let url = sluice_guest::config::get("api_url")
        .unwrap_or_else(|| "http://127.0.0.1:8080/events".to_owned());
    // 10 s, 20 s, 40 s, ... at most 10 minutes; after max_retries the entry is dead-lettered.
    let later = Duration::from_secs((10u64 << delivery.previous_attempts().min(6)).min(600));
    let sent = Request::post(&url)
        // The API can drop a repeat: a retry after a timeout may follow a call that worked.
        .header("idempotency-key", &event.id)
        .json(event)
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    match sent {
        Ok(response) if response.is_success() => HandlerOutcome::ack(),
        Ok(response) if response.status() == 429 || response.status() >= 500 => {
            tracing::warn!(event.id, status = response.status(), "the API is failing; retrying later");
            HandlerOutcome::retry_after(later)
        }
        Ok(response) => HandlerOutcome::dead_letter(format!(
            "{url} refused the event: {} {}",
            response.status(),
            response.text()
        )),
        Err(err) if err.is_denied() => HandlerOutcome::dead_letter(err.to_string()),
        Err(err) => {
            tracing::warn!(event.id, %err, "the API did not answer; retrying later");
            HandlerOutcome::retry_after(later)
        }
    }
}

/// `cargo test`: the handler on made-up deliveries, natively, without a host or Redis. There is
/// no HTTP natively, so the call fails as an API that does not answer would; `sluice test
/// fixtures/example.json` runs the built component's real call (against `stub_api.py`).
#[cfg(test)]
mod tests {
    use super::*;
    use sluice_guest::testing::{TestDelivery, handler};

    #[test]
    fn an_event_the_api_did_not_take_comes_back_later_each_time() {
        let event = TestDelivery::json(r#"{"id": "1"}"#);
        let first = event.clone().run(&handler!(handle));
        assert_eq!(first.retry_delay(), Some(Duration::from_secs(10)), "{first:?}");
        let third = event.retry_count(2).run(&handler!(handle));
        assert_eq!(third.retry_delay(), Some(Duration::from_secs(40)), "{third:?}");
    }

    #[test]
    fn a_payload_that_is_not_an_event_is_dead_lettered() {
        let outcome = TestDelivery::json(r#"{"message": "no id"}"#).run(&handler!(handle));
        assert!(outcome.dead_letter_reason().is_some(), "{outcome:?}");
    }
}
"##;

const PYTHON_HANDLER_HTTP: &str = r#""""The {name} handler: posts each event to an HTTP API. A call that fails for a while (no
answer, a timeout, a 5xx or a 429) parks a durable retry in the Redis sorted set
`{name}.delayed`, later each time; a refusal (another 4xx) dead-letters the entry, since sending
it again would be refused again."""

import logging

from sluice_guest import (DelayedRetry, Delivery, RedisStream, ack, config, dead_letter, http,
                          retry_after, subscriber)

log = logging.getLogger("{ident}")


@subscriber(
    RedisStream("{name}")
    .group("{name}")
    .delayed_retry(DelayedRetry.durable_zset("{name}.delayed"))
)
def handle(event: dict, delivery: Delivery):
    url = config.get("api_url", "http://127.0.0.1:8080/events")
    # 10 s, 20 s, 40 s, ... at most 10 minutes; after max_retries the entry is dead-lettered.
    later = min(10 * 2 ** min(delivery.previous_attempts, 6), 600)
    try:
        # The API can drop a repeat: a retry after a timeout may follow a call that worked.
        response = http.post(url, json=event, timeout=5.0,
                             headers={"idempotency-key": str(event.get("id", ""))})
    except http.HttpError as err:
        if err.is_denied:
            return dead_letter(str(err))
        log.warning("the API did not answer (%s); retrying in %s s", err, later)
        return retry_after(later)
    if response.ok:
        return ack()
    if response.status == 429 or response.status >= 500:
        log.warning("the API answered %s; retrying in %s s", response.status, later)
        return retry_after(later)
    return dead_letter(f"{url} refused the event: {response.status} {response.text}")
"#;

const JS_HANDLER_HTTP: &str = r#"// The {name} handler: posts each event to an HTTP API. A call that fails for a while (no
// answer, a timeout, a 5xx or a 429) parks a durable retry in the Redis sorted set
// `{name}.delayed`, later each time; a refusal (another 4xx) dead-letters the entry, since
// sending it again would be refused again.

import { subscriber, RedisStream, DelayedRetry, ack, retryAfter, deadLetter, config, log, fetchWithTimeout } from "./sluice_guest.js";

export const { handle, subscription } = subscriber(
  new RedisStream("{name}")
    .group("{name}")
    .delayedRetry(DelayedRetry.durableZset("{name}.delayed")),
  async (event, delivery) => {
    const url = config.get("api_url", "http://127.0.0.1:8080/events");
    // 10 s, 20 s, 40 s, ... at most 10 minutes; after max_retries the entry is dead-lettered.
    const later = Math.min(10 * 2 ** Math.min(delivery.previousAttempts, 6), 600);
    let response;
    try {
      // The API can drop a repeat: a retry after a timeout may follow a call that worked.
      response = await fetchWithTimeout(url, {
        method: "POST",
        headers: { "content-type": "application/json", "idempotency-key": String(event.id ?? "") },
        body: JSON.stringify(event),
      }, 5);
    } catch (err) {
      log.warn(`the API did not answer (${err.message}); retrying in ${later} s`, { id: event.id });
      return retryAfter(later);
    }
    if (response.ok) return ack();
    if (response.status === 429 || response.status >= 500) {
      log.warn(`the API answered ${response.status}; retrying in ${later} s`, { id: event.id });
      return retryAfter(later);
    }
    return deadLetter(`${url} refused the event: ${response.status} ${await response.text()}`);
  },
);
"#;
