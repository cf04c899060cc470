//! One TOML file, read: its raw shape parsed (`raw`), its host-wide keys checked (`globals`),
//! then what its top level gives every subscription and each `[[subscription]]` table in turn.
//! Errors name the file, the key (`subscription[0].block`) and the value as written.

use std::path::Path;

use super::check::Validator;
use super::globals::{Globals, globals};
use super::raw::RawConfig;
use super::redis_access::file_redis;
use super::subscription::{Shared, subscription};
use super::{ConfigError, SubscriptionConfig};

/// One parsed TOML file.
#[derive(Debug)]
pub(super) struct FileConfig {
    /// Its host-wide settings, to merge with the other files'.
    pub(super) globals: Globals,
    /// Its subscriptions, in order.
    pub(super) subscriptions: Vec<SubscriptionConfig>,
}

/// Parse and check the TOML file at `path`, whose text is `text`.
pub(super) fn parse_file(path: &Path, text: &str) -> Result<FileConfig, ConfigError> {
    let raw: RawConfig = toml::from_str(text).map_err(|source| ConfigError::Parse {
        path: path.to_owned(),
        source,
    })?;
    if raw.subscriptions.is_empty() {
        return Err(ConfigError::NoSubscriptions(path.to_owned()));
    }
    let base = path.parent().unwrap_or(Path::new("."));
    let v = Validator { path };
    let globals = globals(&v, base, &raw)?;
    let (redis, redis_access) = file_redis(&v, base, &raw)?;
    let shared = Shared {
        redis,
        redis_access,
        consumer: raw.consumer.as_deref(),
    };
    let subscriptions = raw
        .subscriptions
        .into_iter()
        .enumerate()
        .map(|(i, sub)| subscription(&v, base, i, sub, &shared))
        .collect::<Result<_, _>>()?;
    Ok(FileConfig {
        globals,
        subscriptions,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn parse(text: &str) -> Result<FileConfig, ConfigError> {
        let dir = std::env::temp_dir();
        let component = dir.join("sluice-config-test.wasm");
        std::fs::write(&component, b"\0asm").unwrap();
        parse_file(
            &dir.join("sluice.toml"),
            &text.replace("COMPONENT", "sluice-config-test.wasm"),
        )
    }

    #[test]
    fn a_list_of_redis_urls_names_a_cluster() {
        let file = parse(
            "redis = [\"redis://a:7000\", \"redis://b:7001\"]\n[[subscription]]\ncomponent = \"COMPONENT\"\n",
        )
        .unwrap();
        assert_eq!(
            file.subscriptions[0].redis.as_deref(),
            Some("redis://a:7000 redis://b:7001")
        );
        for (value, expected) in [
            ("[]", "at least one cluster node"),
            ("[\"redis://a:1 redis://b:2\"]", "without spaces"),
            ("[\"redis+sentinel://a:1/m\"]", "Sentinel URL as one string"),
        ] {
            let text = format!("[[subscription]]\ncomponent = \"COMPONENT\"\nredis = {value}\n");
            let err = crate::support::chain::chain(&parse(&text).err().unwrap());
            assert!(err.contains("subscription[0].redis"), "{err}");
            assert!(err.contains(expected), "{err}");
        }
    }

    #[test]
    fn metrics_are_per_subscription_up_to_200_subscriptions_unless_set() {
        let dir = std::env::temp_dir().join(format!("sluice-metrics-scope-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("c.wasm"), b"\0asm").unwrap();
        let load = |n: usize, key: &str| {
            let mut text = key.to_owned();
            for i in 0..n {
                text.push_str(&format!(
                    "[[subscription]]\ncomponent = \"c.wasm\"\nstream = \"s{i}\"\n"
                ));
            }
            let path = dir.join("sluice.toml");
            std::fs::write(&path, text).unwrap();
            crate::config::Config::load(&[path])
                .unwrap()
                .metrics_per_subscription
        };
        assert!(load(200, ""));
        assert!(!load(201, ""));
        assert!(load(201, "metrics_per_subscription = true\n"));
        assert!(!load(1, "metrics_per_subscription = false\n"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn doorbell_takes_auto_poll_or_off() {
        let file =
            parse("doorbell = \"poll\"\n[[subscription]]\ncomponent = \"COMPONENT\"\n").unwrap();
        assert_eq!(
            file.globals.doorbell,
            Some(crate::config::DoorbellMode::Poll)
        );
        let err = parse("doorbell = \"sometimes\"\n[[subscription]]\ncomponent = \"COMPONENT\"\n")
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("doorbell") && err.contains("sometimes"),
            "{err}"
        );
    }

    #[test]
    fn unknown_key_is_named() {
        let err = parse("[[subscription]]\ncomponent = \"COMPONENT\"\nblok = \"1s\"\n")
            .err()
            .unwrap();
        let text = crate::support::chain::chain(&err);
        assert!(text.contains("blok"), "{text}");
    }

    #[test]
    fn tls_files_behind_sentinel_are_refused() {
        let dir = std::env::temp_dir().join(format!("sluice-sentinel-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("ca.pem"), b"-----BEGIN CERTIFICATE-----").unwrap();
        let text = format!(
            "redis = \"redis+sentinel://10.0.0.1:26379/mymaster\"\nredis_ca_file = \"{}\"\n[[subscription]]\ncomponent = \"COMPONENT\"\n",
            dir.join("ca.pem").display()
        );
        let err = parse(&text).err().unwrap().to_string();
        assert!(err.contains("not supported behind Sentinel"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_duration_is_named() {
        let err = parse("[[subscription]]\ncomponent = \"COMPONENT\"\nblock = \"soon\"\n")
            .err()
            .unwrap();
        let text = err.to_string();
        assert!(
            text.contains("subscription[0].block") && text.contains("soon"),
            "{text}"
        );
    }

    #[test]
    fn delayed_retry_none_removes_the_set() {
        let file = parse("[[subscription]]\ncomponent = \"COMPONENT\"\ndelayed_retry = \"none\"\n")
            .ok()
            .unwrap();
        assert_eq!(file.subscriptions[0].overrides.delayed_retry, Some(None));
    }

    #[test]
    fn memory_limit_parses_units() {
        let file = parse("[[subscription]]\ncomponent = \"COMPONENT\"\nmemory_limit = \"32MiB\"\n")
            .ok()
            .unwrap();
        assert_eq!(file.subscriptions[0].limits.memory_limit, 32 * 1024 * 1024);
    }

    #[test]
    fn outbound_hosts_and_http_timeout() {
        let file = parse(
            "[[subscription]]\ncomponent = \"COMPONENT\"\nhandler_timeout = \"5s\"\n\
             allowed_outbound_hosts = [\"https://*.example.com\", \"http://127.0.0.1:*\"]\n",
        )
        .ok()
        .unwrap();
        let http = &file.subscriptions[0].limits.outbound_http;
        assert_eq!(http.allowed.len(), 2);
        assert_eq!(
            http.timeout,
            Duration::from_secs(5),
            "defaults to handler_timeout"
        );
        assert!(
            http.check(&"https://api.example.com/x".parse().unwrap())
                .is_ok()
        );
    }

    #[test]
    fn bad_outbound_host_and_long_http_timeout_are_named() {
        let err = parse(
            "[[subscription]]\ncomponent = \"COMPONENT\"\nallowed_outbound_hosts = [\"https://a.com\", \"a.com\"]\n",
        )
        .err()
        .unwrap()
        .to_string();
        assert!(
            err.contains("subscription[0].allowed_outbound_hosts[1]") && err.contains("no scheme"),
            "{err}"
        );
        let err = parse(
            "[[subscription]]\ncomponent = \"COMPONENT\"\nhandler_timeout = \"1s\"\nhttp_timeout = \"2s\"\n",
        )
        .err()
        .unwrap()
        .to_string();
        assert!(
            err.contains("subscription[0].http_timeout") && err.contains("at most handler_timeout"),
            "{err}"
        );
    }

    #[test]
    fn the_journals_keys_are_checked_and_named() {
        let sub = |extra: &str| {
            parse(&format!(
                "[[subscription]]\ncomponent = \"COMPONENT\"\nallowed_outbound_hosts = [\"https://a.com\"]\n{extra}"
            ))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
        };
        for (extra, key, says) in [
            (
                "effects = \"journal\"\njournal_statuses = [\"5xx\"]\n",
                "journal_statuses",
                "5xx",
            ),
            (
                "effects = \"journal\"\njournal_statuses = [\"2xx\", \"429\"]\n",
                "journal_statuses",
                "429",
            ),
            (
                "effects = \"journal\"\njournal_statuses = []\n",
                "journal_statuses",
                "at least one",
            ),
            (
                "effects = \"journal\"\njournal_max_calls = 0\n",
                "journal_max_calls",
                "1 to",
            ),
            (
                "effects = \"none\"\njournal_max_calls = 5\n",
                "journal_max_calls",
                "\"5\" is not valid: means nothing with effects = \"none\"",
            ),
            (
                "effects = \"JOURNAL\"\n",
                "effects",
                "\"journal\" or \"none\"",
            ),
            (
                "effects = \"none\"\npoison_check = true\n",
                "poison_check",
                "needs effects",
            ),
            (
                "idempotency_header = \"a b\"\n",
                "idempotency_header",
                "header name",
            ),
            (
                "idempotency_header = \"Authorization\"\n",
                "idempotency_header",
                "for something else",
            ),
            (
                "idempotency_header = \"content-length\"\n",
                "idempotency_header",
                "for something else",
            ),
            (
                "idempotency_header = \"If-Match\"\n",
                "idempotency_header",
                "for something else",
            ),
        ] {
            let err = sub(extra);
            assert!(
                err.contains(&format!("subscription[0].{key}")) && err.contains(says),
                "{extra}: {err}"
            );
        }
        // Unset effects leaves it to the component: the plan checks the bounds and the poison
        // check against what it asks for.
        for ok in [
            "effects = \"journal\"\njournal_statuses = [\"2xx\", \"409\"]\npoison_check = true\n",
            "journal_max_calls = 5\npoison_check = true\n",
        ] {
            assert_eq!(sub(ok), "", "{ok}");
        }
    }

    /// The configs the Kubernetes manifests ship parse, listen where the probes look, keep
    /// the consumer name the pod's own, and stop within the pod's grace period.
    #[test]
    fn the_kubernetes_manifests_configs_parse_and_fit_the_pod() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes");
        let deployment =
            std::fs::read_to_string(root.join("base/deployment.yaml")).expect("the deployment");
        let grace: u64 = deployment
            .lines()
            .find_map(|l| l.trim().strip_prefix("terminationGracePeriodSeconds:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("the deployment sets terminationGracePeriodSeconds");
        assert!(deployment.contains("containerPort: 9187"), "{deployment}");
        for config in ["base/sluice.toml", "overlays/example/sluice.toml"] {
            let text = std::fs::read_to_string(root.join(config)).expect(config);
            assert!(
                text.contains("component = \"/components/"),
                "{config}: {text}"
            );
            // The pod's secrets, where a test can make them (private, as the pod mounts them).
            let secrets = tempfile::tempdir().unwrap();
            let mut text = text.replace("/components/bank_payments.wasm", "COMPONENT");
            for secret in [
                "/etc/sluice/secrets/redis/password",
                "/etc/sluice/secrets/admin/token",
                "/etc/sluice/secrets/redis/ca.crt",
            ] {
                // A CA only where the overlay talks TLS.
                if secret.ends_with("ca.crt") && !text.contains(secret) {
                    continue;
                }
                assert!(text.contains(secret), "{config}: {secret}");
                let file = secrets.path().join(secret.rsplit('/').next().unwrap());
                std::fs::write(&file, "not-a-real-secret").unwrap();
                std::fs::set_permissions(
                    &file,
                    std::os::unix::fs::PermissionsExt::from_mode(0o600),
                )
                .unwrap();
                text = text.replace(secret, &file.display().to_string());
            }
            let file = parse(&text).unwrap_or_else(|e| panic!("{config}: {e}"));
            let globals = &file.globals;
            assert_eq!(
                globals.admin,
                Some(Some("0.0.0.0:9187".parse().unwrap())),
                "{config}"
            );
            assert!(
                file.subscriptions
                    .iter()
                    .all(|s| s.overrides.consumer.is_none()),
                "{config}: a fixed consumer name"
            );
            let shutdown = globals.shutdown_timeout.expect("shutdown_timeout");
            assert!(
                shutdown + Duration::from_secs(10) <= Duration::from_secs(grace),
                "{config}: shutdown_timeout {shutdown:?} leaves no room in the {grace} s grace period"
            );
            // Below the emptyDir's mount, which Kubernetes makes 0777: the host makes this
            // directory 0700 itself.
            assert_eq!(
                globals.cache_dir.as_deref(),
                Some(Path::new("/var/cache/sluice/compiled")),
                "{config}"
            );
        }
    }
}
