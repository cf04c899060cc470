//! The admin server's settings: where it listens (`admin`), where its bearer token and the
//! rollout key come from (`<name>_file` or `<name>_env`, never the config itself), and the
//! rule that a server reachable beyond loopback needs a token.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use super::check::Validator;
use super::{Config, ConfigError, TokenSource};

/// `admin`: an address, or `"off"` (`Some(None)`); `None` when the file is silent.
pub(super) fn address(
    v: &Validator<'_>,
    text: Option<&str>,
) -> Result<Option<Option<SocketAddr>>, ConfigError> {
    Ok(match text {
        None => None,
        Some("off") => Some(None),
        Some(text) => Some(Some(text.parse().map_err(|e| {
            v.invalid(
                "admin",
                text,
                &format!("{e}; write an address like \"127.0.0.1:9187\" or \"off\""),
            )
        })?)),
    })
}

/// Where the secret `<name>_file` or `<name>_env` names is (one of them at most).
pub(super) fn secret_source(
    v: &Validator<'_>,
    base: &Path,
    name: &str,
    (file, env): (&Option<PathBuf>, &Option<String>),
) -> Result<Option<TokenSource>, ConfigError> {
    Ok(match (file, env) {
        (Some(_), Some(_)) => {
            return Err(v.invalid(
                &format!("{name}_file"),
                "",
                &format!("set {name}_file or {name}_env, not both"),
            ));
        }
        (Some(file), None) => Some(TokenSource::File(base.join(file))),
        (None, Some(var)) => Some(TokenSource::Env(var.clone())),
        (None, None) => None,
    })
}

impl Config {
    /// An admin server beyond loopback needs a token, for every mutating call.
    pub(super) fn check_admin(&self, path: PathBuf) -> Result<(), ConfigError> {
        let Some(addr) = self.admin else {
            return Ok(());
        };
        if addr.ip().is_loopback() {
            return Ok(());
        }
        if self.admin_open_on_loopback {
            return Err(ConfigError::Value {
                path,
                key: "admin_open_on_loopback".into(),
                value: "true".into(),
                reason: format!(
                    "the admin server binds {addr}, beyond loopback: its mutating calls always need a token"
                ),
            });
        }
        if self.admin_token.is_none() {
            return Err(ConfigError::Value {
                path,
                key: "admin".into(),
                value: addr.to_string(),
                reason: "the admin server binds beyond loopback, so its API needs a bearer token: set admin_token_file or admin_token_env".into(),
            });
        }
        Ok(())
    }
}
