//! The configuration's keys, in one table: the parser's test checks it against the keys the
//! parser accepts, and `docs/src/reference/configuration.md` is written from it (a test fails
//! when the page and the table differ; `SLUICE_BLESS=1` rewrites the page).

use std::fmt::Write as _;

/// Where a key goes in a config file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// At the top of the file: the whole host (or every subscription of the file).
    Top,
    /// In a `[[subscription]]` table.
    Subscription,
}

/// One row of the reference: keys documented together, what they do, their default.
#[derive(Debug, Clone, Copy)]
pub struct KeyDoc {
    /// Where the keys go.
    pub scope: Scope,
    /// The keys.
    pub keys: &'static [&'static str],
    /// What they do (Markdown).
    pub meaning: &'static str,
    /// What holds when they are not set (Markdown).
    pub default: &'static str,
}

/// Every key a config file may have.
pub const KEYS: &[KeyDoc] = &[
    KeyDoc {
        scope: Scope::Top,
        keys: &["redis"],
        meaning: "Redis URL for every subscription of this file (`rediss://` for TLS, `redis+sentinel://h:p,h:p/master` behind Sentinel), or a list of a cluster's nodes (`[\"redis://a:7000\", \"redis://b:7001\"]`); a password in it is redacted everywhere",
        default: "a private dev `redis-server`",
    },
    KeyDoc {
        scope: Scope::Top,
        keys: &["redis_username", "redis_password_file"],
        meaning: "the ACL user and a file holding its password (not readable by every user)",
        default: "the URL's",
    },
    KeyDoc {
        scope: Scope::Top,
        keys: &["redis_ca_file"],
        meaning: "PEM certificates to trust for `rediss://` instead of the system roots",
        default: "system roots",
    },
    KeyDoc {
        scope: Scope::Top,
        keys: &["redis_cert_file", "redis_key_file"],
        meaning: "this host's client certificate and key (PEM), for servers that require them",
        default: "none",
    },
    KeyDoc {
        scope: Scope::Top,
        keys: &["consumer"],
        meaning: "consumer name for every subscription of this file",
        default: "`sluice-<hostname>`",
    },
    KeyDoc {
        scope: Scope::Top,
        keys: &["cache_dir"],
        meaning: "where compiled components are cached",
        default: "`.sluice/cache`",
    },
    KeyDoc {
        scope: Scope::Top,
        keys: &["shutdown_timeout"],
        meaning: "how long a shutdown waits for in-flight deliveries",
        default: "`10s`",
    },
    KeyDoc {
        scope: Scope::Top,
        keys: &["admin"],
        meaning: "address of the admin HTTP server (metrics, health), or `\"off\"`",
        default: "`127.0.0.1:9187`",
    },
    KeyDoc {
        scope: Scope::Top,
        keys: &["admin_token_file", "admin_token_env"],
        meaning: "where the admin API's bearer token is; required beyond loopback",
        default: "none",
    },
    KeyDoc {
        scope: Scope::Top,
        keys: &["admin_read_token_file", "admin_read_token_env"],
        meaning: "where a read-only token is: it may see what the operator token sees (the API's listings, the page, `/v1/scaling`, `sluice scaler`) and is answered 403 on every action; for dashboards, KEDA and on-call readers. It must differ from the operator token",
        default: "none",
    },
    KeyDoc {
        scope: Scope::Top,
        keys: &["rollout_key_file", "rollout_key_env"],
        meaning: "where the key that seals canaries is (at least 128 random bits, the same on every host of a group, never in Redis): only a host holding it starts a canary, and hosts run a candidate or take a verdict only under its seal, so a Redis user cannot make them run its code",
        default: "derived from the admin token; without either, canaries are refused",
    },
    KeyDoc {
        scope: Scope::Top,
        keys: &["cache_max_size"],
        meaning: "the most the compiled-component cache holds; the least recently used go first (also at most 32 components). Besides, `sluice dev` keeps compiled functions there (`functions/`, at most 1 GiB, least recently used first). `sluice cache prune` empties both of what was not used lately",
        default: "`2GiB`",
    },
    KeyDoc {
        scope: Scope::Top,
        keys: &["max_instances"],
        meaning: "the most handler instances alive at once in this host, across every subscription: the instance pool reserves address space for this many (each with room for the largest `memory_limit`), whatever the number of subscriptions. Each subscription still holds at most `max_in_flight` + 1; idle instances give their slot to whoever waits, and are dropped after 30 s",
        default: "`256` (or fewer: what the subscriptions' `max_in_flight` add up to)",
    },
    KeyDoc {
        scope: Scope::Top,
        keys: &["doorbell"],
        meaning: "how idle subscriptions learn that their streams were written. `auto`: from keyspace events when the server publishes them (`notify-keyspace-events` with `Ktz`), with one connection per Redis and no command per idle subscription; without them, above 100 subscriptions on one Redis (not counting partitioned ones, whose partitions share blocking reads), by polling (one blocking `XREAD` per 500 idle streams, the delayed sets' due times every 5 s, 100 sets a second at most); otherwise each subscription keeps a blocking read on a connection of its own. `poll`: polling without keyspace events whatever the number. `off`: every subscription keeps its blocking read, events or not (the fastest path for a few busy streams). Not on a Redis Cluster: partitions keep their blocking reads there",
        default: "`auto`",
    },
    KeyDoc {
        scope: Scope::Top,
        keys: &["metrics_per_subscription"],
        meaning: "whether `/metrics` labels its series with `stream` and `group`. Each subscription then adds about 40 series (5 histograms of up to 25 each, and its counters and gauges), so a host of thousands exports hundreds of thousands. Off, every family is summed over the host (the labels are empty) and the number of series does not depend on the number of subscriptions; each subscription's own counts stay on the page, in `/v1/subscriptions` and in `sluice status`",
        default: "`true` up to 200 subscriptions, `false` above",
    },
    KeyDoc {
        scope: Scope::Top,
        keys: &["admin_max_upload"],
        meaning: "largest component the admin API accepts",
        default: "`64MiB`",
    },
    KeyDoc {
        scope: Scope::Top,
        keys: &["admin_read_only"],
        meaning: "the admin API and web page only show: swaps, requeues, deletes and the other actions are refused and hidden",
        default: "`false`",
    },
    KeyDoc {
        scope: Scope::Top,
        keys: &["admin_open_on_loopback"],
        meaning: "open the admin API and page on loopback without any key: every local user and process can then read entries' data and act (a machine only you use). Otherwise, with no admin token, they take a key made for each process, printed to its standard error at start (by `sluice dev` in its banner)",
        default: "`false`: the admin token, or the process's own key",
    },
    KeyDoc {
        scope: Scope::Top,
        keys: &["watch_interval"],
        meaning: "how often component files are checked for a new version, or `\"off\"`",
        default: "`1s`",
    },
    KeyDoc {
        scope: Scope::Top,
        keys: &["telemetry"],
        meaning: "`[telemetry]`: where traces go. `endpoint` (an http(s) URL of an OTLP collector), `protocol` (`\"http/protobuf\"`, `\"grpc\"`, or `\"console\"`: one line per span on standard error, no collector), `headers_file` (a private file of `name=value` lines: credentials), `service_name`, `sampling_ratio` (0 to 1), `resource` (a table of attributes), `trace_url` (a link template with `{trace_id}`). The `OTEL_*` variables apply where these are silent",
        default: "off",
    },
    KeyDoc {
        scope: Scope::Top,
        keys: &["subscription"],
        meaning: "`[[subscription]]`: one table per subscription, with the keys below",
        default: "none: a config names at least one",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["component"],
        meaning: "path of the `.wasm` component (relative to the TOML file)",
        default: "required",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &[
            "redis",
            "redis_username",
            "redis_password_file",
            "redis_ca_file",
            "redis_cert_file",
            "redis_key_file",
            "consumer",
        ],
        meaning: "as above, for this subscription only",
        default: "the file's",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["stream", "group"],
        meaning: "override the descriptor's stream and group",
        default: "the descriptor's",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["claim_min_idle"],
        meaning: "make it a claiming subscription (XAUTOCLAIM after this idle)",
        default: "the descriptor's",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["consumer_gone_after"],
        meaning: "on a non-claiming subscription, take over the pending entries of another consumer idle this long (a host that came back under another name, or never came back), or `\"off\"`",
        default: "`max(60s, 2 × handler_timeout + block)`",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["block", "count"],
        meaning: "XREADGROUP BLOCK and COUNT",
        default: "`1s`, `64`",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["dead_letter"],
        meaning: "dead-letter stream (one subscription's own: two may not share one)",
        default: "`<stream>.<group>.dead-letter`",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["max_retries"],
        meaning: "failed attempts before dead-lettering; a component's own value is capped at 100, this key is not",
        default: "the component's, else `8`",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["min_delay"],
        meaning: "the shortest wait of any retry (`retry_after(0)` and backoffs included), at least `1ms`",
        default: "`1ms`",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["payload_field"],
        meaning: "entry field holding the JSON payload",
        default: "`payload`",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["max_delay"],
        meaning: "longest delay the handler asks for (checked against ttl)",
        default: "unset",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["failure_backoff"],
        meaning: "`{ initial = \"500ms\", max = \"1m\" }` after a trap",
        default: "as shown",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["delayed_retry"],
        meaning: "`{ key = \"...\", ttl = \"1h\" }`, or `\"none\"` to drop the descriptor's",
        default: "the descriptor's",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["retry_lane"],
        meaning: "`true`: due retries go to the group's own retry lane (`<key>.lane`, next to the delayed set, same hash tag), which only this group reads and which the reader serves before the stream. `false`: to the stream's tail, where every group of the stream reads them as new entries; refused at start (and held at sweep time) while another group reads the stream, unless `other_groups_see_retries` (see [Several services on one stream](../concepts/fan-out.md)). Set it alike on every host of the group",
        default: "`true` (with a delayed set)",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["retry_lane_slots"],
        meaning: "handler slots kept for due retries, which new stream entries never take, so a retry due behind a backlog of slow handlers starts at once (less than `max_in_flight`)",
        default: "an eighth of `max_in_flight` (none below 8)",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["other_groups_see_retries"],
        meaning: "with `retry_lane = false`: run although other consumer groups read the stream; each of them then reads every retry as a new entry (Sluice groups skip each other's retries; other services do not). Warned about in the log, `sluice check` and the page",
        default: "`false`: refused",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["rate_limit"],
        meaning: "`{ per_second = 100, burst = 10 }`: the most deliveries a second the whole group starts, every host together (a token bucket in Redis, in the stream's hash slot; each read takes its tokens in one script call, fetched ahead while the budget is ample). New entries, due retries and claims all count. See [Flow control](../operating/flow-control.md)",
        default: "none; `burst` defaults to a tenth of a second's worth (at least 1)",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["circuit_breaker"],
        meaning: "`{ failure_rate = 0.5, window = \"30s\", min_deliveries = 20, open_for = \"30s\", probes = 3 }`: when at least `failure_rate` of the deliveries of the last `window` failed (traps, limits, and retries the handler marked \"downstream down\") and there were at least `min_deliveries`, every host of the group stops reading, and holds due retries without counting attempts, for `open_for`; then `probes` deliveries try, and the first answer closes it or opens it again. Shared through Redis. See [Flow control](../operating/flow-control.md)",
        default: "none; `probes` 3",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["canary"],
        meaning: "`{ window = \"5m\", failure_rate_increase = 0.01, dead_letter_rate_increase = 0.01, retry_rate_increase = 0.05, p99_ratio = 2.0, p99_slack = \"10ms\", min_deliveries = 100 }`, each optional: how a canary (`sluice swap --canary`) is judged. The candidate is rolled back as soon as its failure (trap, limit), dead-letter or retry rate is shown above the incumbent's plus the increase (the lowest rate its counts allow above the highest the incumbent's allow), or its handler-time p99 above `p99_ratio` times the incumbent's (and `p99_slack` more, once both had `min_deliveries`); promoted when `window` passes with no threshold shown broken and at least `min_deliveries` attempts on it. See [Safe rollout](../operating/rollout.md)",
        default: "the values shown",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["partitions"],
        meaning: "read this many partitions of the stream, each with its own hash tag (`<key>:{<stream>:<n>}`)",
        default: "the descriptor's, else `1`",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["ordered_by"],
        meaning: "handle entries with one key in stream order, across hosts and retries: `{ field = \"<stream field>\" }` or `{ payload = \"<JSON pointer>\" }` (a string, an integer or a boolean there is a key), with `on_dead_letter = \"release\"` (the next entry goes) or `\"hold\"` (the key waits until the dead letter is requeued, deleted or released) and `max_key_bytes` (longer keys go unordered, counted); `\"none\"` removes the component's. Needs a delayed-retry set and the retry lane",
        default: "the component's (`.ordered_by(..)`), else unordered; `on_dead_letter = \"release\"`, `max_key_bytes = 256`",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["dedupe"],
        meaning: "acknowledge without calling the handler an entry whose key's first entry was read within the window: `{ field = \"<stream field>\" }` or `{ payload = \"<JSON pointer>\" }`, with `window` (1s to 30 days, whole seconds), `max_key_bytes` (longer keys are no key: handled, counted) and `max_keys` (new keys taken per window; past it new keys are not remembered, their entries run, counted `over_max_keys`, while known keys still skip their duplicates); shared by every host of the group, each group its own; `\"none\"` removes the component's. Not with `ordered_by`. See [Deduplication](../concepts/dedupe.md)",
        default: "the component's (`.dedupe(..)`), else none; `window = \"24h\"`, `max_key_bytes = 256`, `max_keys = 1000000`",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["schedule"],
        meaning: "`[[subscription.schedule]]` tables: entries the subscription gives itself on a cron schedule, each tick exactly one entry for the group however many hosts run (claimed in Redis): `cron` (five fields, or six with seconds first), `payload` (a table, written as the payload's JSON) or `fields` (names to text), `time_zone` (IANA), `missed = \"skip\"` (a tick no host fired is dropped) or `\"once\"` (one entry for the latest when a host starts), `name` (what its state is kept under: keep it when editing the expression; required with several). Needs a delayed-retry set; at most 100, each entry at most 64 KiB. See [Schedules](../concepts/schedules.md)",
        default: "none; `time_zone = \"UTC\"`, `missed = \"skip\"`, a lone schedule's `name` \"1\"",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["max_in_flight_per_key"],
        meaning: "entries of one key handled at once across every host of the group (1: strict order); only with `ordered_by`",
        default: "the component's, else 1",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["dead_letter_maxlen"],
        meaning: "trim the dead-letter stream to about this many entries (XADD MAXLEN ~): the oldest dead letters are dropped for good",
        default: "never trimmed",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["history_entries"],
        meaning: "how many entries' histories (each park and dead letter of an entry, for the entry's page) the subscription keeps in Redis: two keys in all, about 170 bytes per record plus its reason, up to 32 records an entry; the ones due to go soonest leave first, each goes 7 days after its last record; `0` turns the history off",
        default: "`1000`",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["retention"],
        meaning: "`{ keep_acked = \"1h\", max_len = 1000000, every = \"10s\" }`: trim entries every consumer group of the stream has acknowledged, older than `keep_acked`; never one a group has pending or unread (see [Stream retention](../operating/retention.md))",
        default: "off: the stream grows until producers cap it",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["dead_letter_retention"],
        meaning: "`{ keep = \"30d\" }`: trim dead letters older than this",
        default: "kept for ever",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["max_in_flight"],
        meaning: "deliveries handled at once",
        default: "`16`",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["isolation"],
        meaning: "`\"reuse\"` instances, or a fresh one `\"per-delivery\"`",
        default: "`reuse`",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["recycle_after"],
        meaning: "deliveries before a reused instance is replaced",
        default: "`10000`",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["handler_timeout"],
        meaning: "wall-clock limit of one delivery",
        default: "`10s`",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["memory_limit"],
        meaning: "linear-memory cap per instance, e.g. `\"64MiB\"`",
        default: "`64MiB`",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["host_memory_limit"],
        meaning: "what the host holds for an instance: resource handles (one per 32KiB) and HTTP header maps (32KiB each)",
        default: "`8MiB`",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["max_entry_bytes"],
        meaning: "the largest entry given to the handler, counting its fields' names and values and 64 bytes for each field (a million one-byte fields cost the host and the guest far more than their bytes); a larger one is dead-lettered unhandled. The host never holds more of an entry than this: every read (any transport, a cluster too) drops the fields that would take the entry past it as they arrive, and the entry is copied whole to the dead letters inside Redis; the admin page and API show at most 256 KiB of a value and 1 MiB of an entry",
        default: "`8MiB`",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["log_lines", "log_bytes"],
        meaning: "guest log budget per delivery (past it lines are dropped and counted)",
        default: "`100`, `64KiB`",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["fuel"],
        meaning: "deterministic instruction budget per delivery",
        default: "unmetered",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["allowed_outbound_hosts"],
        meaning: "hosts the guest may send HTTP requests to, e.g. `[\"https://*.example.com\", \"http://127.0.0.1:8080\"]`",
        default: "none",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["http_timeout"],
        meaning: "longest an HTTP request may wait to connect, for a response, or between body chunks",
        default: "`handler_timeout`",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["idempotency_header"],
        meaning: "the header every outbound request carries a stable idempotency key in (the same for the same call of the same entry on every retry: see the effects page), unless the handler set it; `\"none\"` sends none. Not one a request needs for something else (`Host`, `Content-Length`, `Authorization`, `traceparent`, ...)",
        default: "`\"Idempotency-Key\"`",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["effects"],
        meaning: "`\"journal\"`: each outbound call's response is recorded in Redis, and a later attempt of the same entry gets the recorded response of a call it makes again, without the network (see the effects page); `\"none\"` keeps every call live whatever the component asks",
        default: "the component's (`.effects(Effects::Journal)`), else `\"none\"`",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["journal_statuses"],
        meaning: "the responses the journal records, as classes (`\"2xx\"`) or statuses (`\"409\"`)",
        default: "`[\"2xx\"]`",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &[
            "journal_max_response_bytes",
            "journal_max_entry_bytes",
            "journal_max_calls",
        ],
        meaning: "the journal's bounds: the largest response one call records (at most 16MiB), what one entry's journal holds in bytes (at most 64MiB) and in calls (at most 10,000); a call past them stays live on the next attempt, counted",
        default: "256KiB, 4MiB, 64",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["poison_check"],
        meaning: "an attempt that traps or raises runs once more at once, with its journal and no network; the same failure dead-letters the entry now (\"fails the same way on the same input\") instead of retrying it; a different outcome retries as usual. Costs a second run of every failing attempt; needs `effects = \"journal\"` when the handler may call out",
        default: "false",
    },
    KeyDoc {
        scope: Scope::Subscription,
        keys: &["config"],
        meaning: "`[subscription.config]`: string values the guest can read",
        default: "empty",
    },
];

/// The configuration reference page of the book.
pub fn markdown() -> String {
    let mut out = String::from(
        "# Configuration reference\n\n<!-- generated: do not edit; the host's config table writes this file (host/src/config/reference.rs, `SLUICE_BLESS=1 cargo test -p sluice-host reference`) -->\n\nA `sluice.toml` holds keys for the whole host at its top and one `[[subscription]]` table per subscription. Durations are written like `\"500ms\"`, `\"10s\"`, `\"1h\"`; sizes like `\"64MiB\"`. Unknown keys are errors that name the key. A subscription's keys override what its component's descriptor says. See [an example config](example-config.md).\n",
    );
    for (scope, title) in [
        (Scope::Top, "Top level"),
        (Scope::Subscription, "In `[[subscription]]`"),
    ] {
        let _ = write!(
            out,
            "\n## {title}\n\n| key | meaning | default |\n|-----|---------|---------|\n"
        );
        for row in KEYS.iter().filter(|r| r.scope == scope) {
            let keys = row
                .keys
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ");
            let _ = writeln!(out, "| {keys} | {} | {} |", row.meaning, row.default);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys the parser's raw shape accepts at `scope`, from its own unknown-key error.
    fn accepted(scope: Scope) -> Vec<String> {
        let text = match scope {
            Scope::Top => "not_a_key = 1\n",
            Scope::Subscription => "[[subscription]]\ncomponent = \"x.wasm\"\nnot_a_key = 1\n",
        };
        let err = super::super::raw::parse_str(text).expect_err("an unknown key is refused");
        let (_, expected) = err
            .split_once("expected one of")
            .unwrap_or_else(|| panic!("{err}"));
        let mut keys: Vec<String> = expected
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect();
        keys.sort();
        keys
    }

    #[test]
    fn the_table_names_every_key_the_parser_accepts_and_no_other() {
        for scope in [Scope::Top, Scope::Subscription] {
            let mut documented: Vec<String> = KEYS
                .iter()
                .filter(|r| r.scope == scope)
                .flat_map(|r| r.keys.iter().map(|k| (*k).to_owned()))
                .collect();
            documented.sort();
            assert_eq!(documented, accepted(scope), "{scope:?}");
        }
    }

    #[test]
    fn the_reference_page_is_written_from_the_table() {
        let page = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../docs/src/reference/configuration.md");
        let want = markdown();
        if std::env::var_os("SLUICE_BLESS").is_some() {
            std::fs::write(&page, &want).unwrap();
        }
        let have = std::fs::read_to_string(&page).unwrap_or_default();
        assert!(
            have == want,
            "{} differs from the config table: run `SLUICE_BLESS=1 cargo test -p sluice-host reference` and commit it",
            page.display()
        );
    }
}
