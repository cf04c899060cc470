//! `sluice new`: a ready project in one command: a handler with a delayed retry, its
//! `sluice.toml`, a README with the next commands and a `.gitignore`. It builds and passes
//! `sluice check` with no edits.

use std::path::{Path, PathBuf};

use super::{Lang, ProjectError, identifier, io};

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

/// Write a new `lang` project named `name` into `parent/name`; returns its directory.
pub fn new_project(
    parent: &Path,
    name: &str,
    lang: Lang,
    sdk: Option<&SdkCrates>,
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
    let ident = identifier(name);
    let fill = |text: &str| {
        text.replace("{name}", name)
            .replace("{ident}", &ident)
            .replace("{lang}", &lang.to_string())
    };
    let mut files: Vec<(&str, String)> = vec![
        ("sluice.toml", fill(SLUICE_TOML)),
        ("README.md", fill(README)),
    ];
    match lang {
        Lang::Rust => {
            let patch = match sdk {
                Some(sdk) => format!(
                    "# sluice-guest is not on crates.io yet: take it from a checkout (or use\n# `git = \"...\"` instead of `path`). Remove this table once it is published.\n[patch.crates-io]\nsluice-guest = {{ path = {:?} }}\nsluice-guest-macros = {{ path = {:?} }}\nsluice-descriptor = {{ path = {:?} }}\n",
                    sdk.guest, sdk.macros, sdk.descriptor
                ),
                None => "# sluice-guest is not on crates.io yet: point it at a checkout of Sluice, e.g.\n# [patch.crates-io]\n# sluice-guest = { path = \"/path/to/sluice/guest-sdk\" }\n# sluice-guest-macros = { path = \"/path/to/sluice/guest-sdk/macros\" }\n# sluice-descriptor = { path = \"/path/to/sluice/guest-sdk/descriptor\" }\n".to_owned(),
            };
            files.push(("Cargo.toml", fill(CARGO_TOML) + "\n" + &patch));
            files.push(("src/lib.rs", fill(RUST_HANDLER)));
            files.push((".gitignore", "target/\n".to_owned()));
        }
        Lang::Python => {
            files.push(("app.py", fill(PYTHON_HANDLER)));
            files.push((".gitignore", "target/\n__pycache__/\n".to_owned()));
        }
        Lang::Js => {
            files.push(("src/app.js", fill(JS_HANDLER)));
            files.push((".gitignore", "target/\nnode_modules/\n".to_owned()));
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

const README: &str = r#"# {name}

A Sluice handler in {lang} for the Redis stream `{name}`:
it acks each entry; an entry whose payload has `"retry": true` is retried once, after 5 s,
waiting in the Redis sorted set `{name}.delayed` (a retry there survives any crash).

```sh
sluice build              # builds target/{ident}.wasm
sluice check sluice.toml  # what the host will do with it
sluice dev                # dev Redis + host; rebuilds and hot-swaps on every save
```

Then add an entry: `redis-cli -p <port from sluice dev> XADD {name} '*' payload '{"id":"1","retry":true}'`.
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

const RUST_HANDLER: &str = r#"//! The {name} handler. `sluice build` compiles it to a WebAssembly component.

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
"#;

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
// componentize-js; it puts `sluice_guest.js` (the SDK) next to this file.

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
