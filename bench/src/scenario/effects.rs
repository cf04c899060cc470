//! `effects`: what idempotency keys and the journal of outbound calls cost. Four runs on the
//! wasm path: entries that make no call, with and without `effects = "journal"` (goal: no
//! measurable difference); and entries that make one call each to a local server, with and
//! without the journal (each call then recorded: the cost per recorded call, and Redis's
//! commands per call, goal at most one round trip).

use anyhow::Result;
use sluice_fixture_control::Control;

use super::{Bench, Report};

impl Bench {
    /// The four runs: `n` entries without calls, `n / 10` with one call each.
    pub async fn effects(&self, n: usize) -> Result<Vec<Report>> {
        let server = local_server().await?;
        let grant = format!("[\"http://{server}\"]");
        let idle = serde_json::to_string(&Control::Ack)?;
        let call = serde_json::to_string(&Control::Calls {
            urls: vec![format!("http://{server}/charge")],
            body: "{\"amount_cents\":1200}".into(),
            headers: Vec::new(),
            retry_ms: 1000,
            trap: false,
            times: 0,
        })?;
        let calls = (n / 10).max(1);
        let mut off = self
            .effects_run("effects-idle-off", n, &idle, &grant, false)
            .await?;
        let mut on = self
            .effects_run("effects-idle-journal", n, &idle, &grant, true)
            .await?;
        on.extra.push(("x_of_off", on.msgs_per_s / off.msgs_per_s));
        off.extra.push(("x_of_off", 1.0));
        let live = self
            .effects_run("effects-call-off", calls, &call, &grant, false)
            .await?;
        let mut journaled = self
            .effects_run("effects-call-journal", calls, &call, &grant, true)
            .await?;
        if let (Some(a), Some(b)) = (live.us_per_delivery, journaled.us_per_delivery) {
            journaled.extra.push(("x_us_per_recorded_call", b - a));
        }
        Ok(vec![off, on, live, journaled])
    }

    /// `n` entries of `payload` on the wasm path, granted `grant`, with or without the journal.
    async fn effects_run(
        &self,
        scenario: &str,
        n: usize,
        payload: &str,
        grant: &str,
        journal: bool,
    ) -> Result<Report> {
        let stream = format!("bench-{scenario}");
        self.fill(&stream, n, |_| payload.to_owned()).await?;
        let effects = if journal {
            "effects = \"journal\"\n"
        } else {
            ""
        };
        let toml = format!(
            "[[subscription]]\ncomponent = {:?}\nstream = {stream:?}\ngroup = \"g\"\ncount = 128\nmax_in_flight = 256\nblock = \"100ms\"\nallowed_outbound_hosts = {grant}\ndelayed_retry = {{ key = \"{stream}.delayed\" }}\n{effects}",
            self.fixture.display().to_string()
        );
        let service = self.service(&toml).await?;
        let mut conn = self.conn().await?;
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut conn)
            .await?;
        let elapsed = self.run_until_settled(service, &stream, n).await?;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await?;
        let calls_of = |name: &str| -> f64 {
            info.lines()
                .find(|l| l.starts_with(&format!("cmdstat_{name}:")))
                .and_then(|l| l.split("calls=").nth(1)?.split(',').next()?.parse().ok())
                .unwrap_or(0.0)
        };
        let mut report = Report::new(scenario, n, elapsed);
        report.us_per_delivery = Some(report.seconds * 1e6 / n as f64);
        let journal_commands = calls_of("hlen") + calls_of("hgetall") + calls_of("hset");
        report
            .extra
            .push(("x_journal_commands_per_msg", journal_commands / n as f64));
        Ok(report)
    }
}

/// A server that answers every POST with a small JSON body, as a gateway would.
async fn local_server() -> Result<std::net::SocketAddr> {
    use axum::routing::post;
    let app = axum::Router::new().route("/charge", post(|| async { "{\"charge\":\"ch_1\"}" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}
