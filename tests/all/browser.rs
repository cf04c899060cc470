//! The admin page in a real browser: headless Chromium (Debian's `chromium`, installed by
//! `scripts/setup`), driven over the DevTools protocol. It logs in, opens a running host's
//! dead letters, clicks "Requeue" on one, and the handler runs it; a payload with `<script>`
//! shows as text and never runs. Screenshots of each page go to `target/ui-screenshots/`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use futures::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use sluice_host::EventKind;
use tokio_tungstenite::tungstenite::Message;

use crate::common::*;

const T: Duration = Duration::from_secs(60);

/// A headless Chromium and one page of it, killed (by PID) when dropped.
struct Browser {
    child: Child,
    page: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    next_id: u64,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Browser {
    async fn start() -> Self {
        let profile = tempfile::tempdir().unwrap();
        let port = free_port();
        let child = Command::new("chromium")
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                // Containers often give /dev/shm only 64 MiB.
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--window-size=1280,900",
                &format!("--remote-debugging-port={port}"),
                &format!("--user-data-dir={}", profile.path().display()),
                "about:blank",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromium is installed by scripts/setup");
        let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        // The page target's WebSocket, once the DevTools endpoint answers.
        let ws = wait_for(T, "Chromium's DevTools endpoint", || async move {
            let body = tokio::task::spawn_blocking(move || {
                let mut reply = ureq::get(format!("http://{addr}/json/list")).call().ok()?;
                reply.body_mut().read_to_string().ok()
            })
            .await
            .ok()??;
            let targets: Vec<Value> = serde_json::from_str(&body).ok()?;
            targets
                .iter()
                .find(|t| t["type"] == "page")
                .and_then(|t| t["webSocketDebuggerUrl"].as_str())
                .map(str::to_owned)
        })
        .await;
        let (page, _) = tokio_tungstenite::connect_async(ws.as_str())
            .await
            .expect("connect to the page");
        Self {
            child,
            page,
            next_id: 0,
            _profile: profile,
        }
    }

    /// Call a DevTools method and return its result (events in between are skipped). An
    /// evaluation that lands while the page swaps its document (a navigation) is tried again,
    /// a few times.
    async fn call(&mut self, method: &str, params: Value) -> Value {
        for _ in 0..5 {
            match self.try_call(method, params.clone()).await {
                Ok(result) => return result,
                Err(reply) if method == "Runtime.evaluate" => {
                    eprintln!("{method} failed, trying again: {reply}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(reply) => panic!("{method}: {reply}"),
            }
        }
        let reply = self.try_call(method, params).await;
        reply.unwrap_or_else(|reply| panic!("{method}: {reply}"))
    }

    async fn try_call(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        self.next_id += 1;
        let id = self.next_id;
        let request = json!({ "id": id, "method": method, "params": params }).to_string();
        self.page.send(Message::text(request)).await.unwrap();
        loop {
            let message = tokio::time::timeout(T, self.page.next())
                .await
                .expect("Chromium answers")
                .expect("the page is open")
                .unwrap();
            let Message::Text(text) = message else {
                continue;
            };
            let reply: Value = serde_json::from_str(&text).unwrap();
            if reply["id"] == id {
                if !reply["error"].is_null() {
                    return Err(reply);
                }
                return Ok(reply["result"].clone());
            }
        }
    }

    /// Evaluate `js` in the page and return its value.
    async fn eval(&mut self, js: &str) -> Value {
        let result = self
            .call(
                "Runtime.evaluate",
                json!({ "expression": js, "returnByValue": true, "awaitPromise": true }),
            )
            .await;
        result["result"]["value"].clone()
    }

    /// Wait until `js` is true in the page (a page load, a redirect, a rendered row).
    async fn wait_until(&mut self, js: &str, what: &str) {
        let deadline = tokio::time::Instant::now() + T;
        loop {
            if self.eval(js).await == json!(true) {
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                let at = self
                    .eval("location.href + '\\n' + document.body.outerHTML.slice(0, 2000)")
                    .await;
                panic!("timed out waiting for {what}; the page is at {at}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Open `url` again until `js` is true there: the page shows what the host knew when it
    /// was rendered.
    async fn wait_until_reloading(&mut self, url: &str, js: &str, what: &str) {
        let deadline = tokio::time::Instant::now() + T;
        loop {
            self.open(url).await;
            // A navigation gets the loader; the page's script fetches the real one.
            self.wait_until(
                "document.body.hasAttribute('data-keyed') && !document.body.hasAttribute('data-loader')",
                what,
            )
                .await;
            if self.eval(js).await == json!(true) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}"
            );
        }
    }

    async fn open(&mut self, url: &str) {
        self.call("Page.navigate", json!({ "url": url })).await;
        // Page.navigate answers once the new document is committed; then wait for its load.
        self.wait_until("document.readyState === 'complete'", url)
            .await;
    }

    /// A browser logged in to the page at `base`, on the overview (a screenshot of the login
    /// form with `shoot`).
    async fn logged_in(base: &str, shoot: bool) -> Self {
        Self::logged_in_with(base, shoot, TEST_TOKEN).await
    }

    /// [`Browser::logged_in`] with `token` (the operator's or the read-only one).
    async fn logged_in_with(base: &str, shoot: bool, token: &str) -> Self {
        let mut browser = Browser::start().await;
        browser.call("Page.enable", json!({})).await;
        browser.open(&format!("{base}/ui/")).await;
        browser
            .wait_until("location.pathname === '/ui/login'", "the login form")
            .await;
        if shoot {
            browser.screenshot("login").await;
        }
        browser
            .eval(&format!(
                "document.querySelector('input[name=token]').value = {token:?}; \
                 document.querySelector('form button').click(); true"
            ))
            .await;
        browser
            .wait_until(
                "location.pathname === '/ui/' && document.readyState === 'complete'",
                "the overview after logging in",
            )
            .await;
        browser
    }

    /// Put the file at `path` in the file input `selector` finds.
    async fn choose_file(&mut self, selector: &str, path: &std::path::Path) {
        let doc = self.call("DOM.getDocument", json!({})).await;
        let root = doc["root"]["nodeId"].clone();
        let node = self
            .call(
                "DOM.querySelector",
                json!({ "nodeId": root, "selector": selector }),
            )
            .await;
        self.call(
            "DOM.setFileInputFiles",
            json!({ "files": [path.display().to_string()], "nodeId": node["nodeId"] }),
        )
        .await;
    }

    /// Save a PNG of the page as `target/ui-screenshots/<name>.png`.
    async fn screenshot(&mut self, name: &str) -> PathBuf {
        let shot = self
            .call("Page.captureScreenshot", json!({ "format": "png" }))
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap())
            .unwrap();
        let dir = root().join("target/ui-screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
        path
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_logs_in_and_requeues_a_dead_letter_in_a_browser() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host =
        start_fixture(&redis, Sub::fixture("payments").delayed("payments.delayed")).await;
    let admin = host.admin().await;
    for _ in 0..20 {
        add(&mut conn, "payments", &Control::Ack).await;
    }
    for _ in 0..3 {
        add(
            &mut conn,
            "payments",
            &Control::Retry {
                ms: 3_600_000,
                times: 1,
            },
        )
        .await;
    }
    // What an attacker might send: a payload that would run if the page printed it as HTML.
    let hostile = serde_json::json!({
        "mode": "dead",
        "reason": "declined <img src=x onerror=window.__owned=1>",
        "note": "<script>window.__owned=1</script>",
    });
    add(&mut conn, "payments", &hostile).await;
    let fixed = add(
        &mut conn,
        "payments",
        &Control::DeadUntilRequeued {
            reason: "gateway timed out".into(),
        },
    )
    .await;
    wait_dead_letters(&conn, "payments", 2).await;
    wait_for(T, "3 parked", || {
        let mut conn = conn.clone();
        async move { (parked(&mut conn, "payments.delayed").await == 3).then_some(()) }
    })
    .await;

    let base = format!("http://{admin}");
    let mut browser = Browser::logged_in(&base, true).await;
    // The chart needs two samples of the host's counts (5 s apart): reload until it is drawn.
    let deadline = tokio::time::Instant::now() + T;
    while browser
        .eval("document.querySelector('svg polyline') !== null")
        .await
        != json!(true)
    {
        assert!(tokio::time::Instant::now() < deadline, "the chart is drawn");
        add(&mut conn, "payments", &Control::Ack).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        browser.open(&format!("{base}/ui/")).await;
    }
    let overview = browser.eval("document.body.innerText").await;
    assert!(
        overview.as_str().unwrap().contains("Stream payments"),
        "{overview}"
    );
    browser.screenshot("overview").await;

    browser
        .eval("document.querySelector('a[href$=\"/parked\"]').click(); true")
        .await;
    browser
        .wait_until(
            "location.pathname.endsWith('/parked') && document.querySelectorAll('tr').length === 4",
            "the parked page",
        )
        .await;
    browser.screenshot("parked").await;

    browser
        .open(&format!("{base}/ui/s/payments/g/dead-letters"))
        .await;
    browser
        .wait_until(
            "document.body.innerText.includes('gateway timed out')",
            "the dead letters",
        )
        .await;
    // The hostile payload is text on the page, and nothing of it ran.
    let text = browser.eval("document.body.innerText").await;
    assert!(
        text.as_str()
            .unwrap()
            .contains("<script>window.__owned=1</script>"),
        "{text}"
    );
    assert_eq!(
        browser.eval("window.__owned === undefined").await,
        json!(true)
    );
    assert_eq!(
        browser
            .eval("document.querySelectorAll('script').length")
            .await,
        json!(1),
        "only the page's own script"
    );
    assert_eq!(
        browser
            .eval("document.querySelectorAll('img').length")
            .await,
        json!(0)
    );
    browser.screenshot("dead-letters").await;

    // Click "Requeue" on the row of the fixed entry.
    browser
        .eval(&format!(
            "[...document.querySelectorAll('tr')].find(r => r.innerText.includes({fixed:?}))\
             .querySelector('button.primary').click(); true"
        ))
        .await;
    browser
        .wait_until(
            "document.querySelector('.flash') !== null && document.readyState === 'complete'",
            "the requeue's confirmation",
        )
        .await;
    host.event(T, "the requeued entry acked", |e| {
        e.kind == EventKind::Acked && e.origin_id == fixed
    })
    .await;
    let flash = browser
        .eval("document.querySelector('.flash').innerText")
        .await;
    assert!(flash.as_str().unwrap().contains("requeued"), "{flash}");
    let shot = browser.screenshot("after-requeue").await;
    eprintln!("screenshots in {}", shot.parent().unwrap().display());
    assert_eq!(dead_lettered(&mut conn, "payments").await.len(), 1);

    // The session's key is in this origin's storage; the cookie alone (what any server on
    // this host name gets from the browser) fetches the empty loader page.
    assert_eq!(
        browser
            .eval("(localStorage.getItem('sluice-key') || '').length")
            .await,
        json!(64)
    );
    assert_eq!(
        browser
            .eval(
                "fetch('/ui/s/payments/g/dead-letters').then(r => r.text())\
                 .then(t => t.includes('data-loader') && !t.includes('gateway'))"
            )
            .await,
        json!(true)
    );
    // A link from another site: the browser leaves the SameSite=Strict cookie out of that
    // navigation, so the server answers with the login form; the page, holding the key, tries
    // it with the cookie (a fetch from the page sends it) and the operator stays logged in.
    browser
        .open(&format!(
            "data:text/html,%3Ca%20id=go%20href={base}/ui/s/payments/g/dead-letters%3Ego%3C/a%3E"
        ))
        .await;
    browser
        .eval("document.getElementById('go').click(); true")
        .await;
    browser
        .wait_until(
            "location.pathname === '/ui/' && document.body.hasAttribute('data-keyed') \
             && (localStorage.getItem('sluice-key') || '').length === 64",
            "the overview after a link from another site",
        )
        .await;
    // Pause from the overview: the button asks first (the dialog is answered here, and what
    // it asked is kept), every host stops, the card says who paused and why; then resume.
    browser
        .eval(
            "window.__asked = []; window.confirm = m => (window.__asked.push(m), true); \
             document.querySelector('div.flow input[name=reason]').value = 'gateway <b>down</b>'; \
             document.querySelector('div.flow button').click(); true",
        )
        .await;
    browser
        .wait_until(
            "document.querySelector('.flash') !== null && document.querySelector('.flash').innerText.includes('paused by the admin page') && document.readyState === 'complete'",
            "the pause's confirmation",
        )
        .await;
    let asked = browser.eval("window.__asked.join('|')").await;
    assert!(
        asked
            .as_str()
            .unwrap_or_default()
            .contains("Pause stream payments group g on every host?"),
        "{asked}"
    );
    let paused = sluice_host::pipeline::admit::state(&mut conn, "payments", "g")
        .await
        .unwrap()
        .expect("paused in Redis");
    assert_eq!(paused.by, "the admin page");
    assert_eq!(paused.reason.as_deref(), Some("gateway <b>down</b>"));
    // The overview shows the pause once this host has seen it.
    browser.wait_until_reloading(&format!("{base}/ui/"), "document.querySelector('p.paused') !== null && document.querySelector('p.paused').innerText.includes('gateway <b>down</b>')", "the paused card").await;
    browser.screenshot("paused").await;
    browser
        .eval(
            "window.__asked = []; window.confirm = m => (window.__asked.push(m), true); \
             document.querySelector('div.flow button').click(); true",
        )
        .await;
    browser
        .wait_until(
            "document.querySelector('.flash') !== null && document.querySelector('.flash').innerText.includes('resumed') && document.readyState === 'complete'",
            "the resume's confirmation",
        )
        .await;
    assert_eq!(
        sluice_host::pipeline::admit::state(&mut conn, "payments", "g")
            .await
            .unwrap(),
        None
    );
    // The overview refreshes itself while nobody is filling anything in...
    browser.open(&format!("{base}/ui/")).await;
    browser
        .wait_until(
            "document.body.hasAttribute('data-keyed') && !document.body.hasAttribute('data-loader')",
            "the overview",
        )
        .await;
    // The pause and the resume are in the flow journal's fold, newest first.
    let journal = browser
        .eval("document.querySelector('details.journal summary').innerText")
        .await;
    assert!(
        journal
            .as_str()
            .unwrap_or_default()
            .starts_with("Flow journal: resumed"),
        "{journal}"
    );
    let first = browser.eval("document.body.dataset.rendered").await;
    browser
        .wait_until(
            &format!("document.body.dataset.rendered !== {first}"),
            "the overview to refresh itself",
        )
        .await;
    // ... and not while a field holds what the operator typed: watched for two refresh
    // periods (a refresh would replace the field and its text).
    browser
        .eval("document.querySelector('div.flow input[name=reason]').value = 'half typed'; true")
        .await;
    let typed_at = browser.eval("document.body.dataset.rendered").await;
    let watch_until = tokio::time::Instant::now() + Duration::from_secs(11);
    while tokio::time::Instant::now() < watch_until {
        assert_eq!(
            browser.eval("document.body.dataset.rendered").await,
            typed_at,
            "the page refreshed over a form being filled in"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        browser
            .eval("document.querySelector('div.flow input[name=reason]').value")
            .await,
        json!("half typed")
    );

    // Entries in flight per consumer: this host's consumer is listed.
    browser
        .open(&format!("{base}/ui/s/payments/g/pending?consumer=c1"))
        .await;
    browser
        .wait_until(
            "document.body.innerText.includes('this host') && document.body.innerText.includes('Oldest entries pending to c1')",
            "the in-flight page",
        )
        .await;
    browser.screenshot("pending").await;

    // Bulk actions on parked retries: two ticked and retried now, then the rest dead-lettered
    // with one press; each asks first, with the count.
    browser
        .open(&format!("{base}/ui/s/payments/g/parked"))
        .await;
    browser
        .wait_until(
            "document.querySelectorAll('input[name=pick]').length === 3",
            "three parked retries to tick",
        )
        .await;
    let ticked: Vec<String> = serde_json::from_value(
        browser
            .eval(
                "window.__asked = []; window.confirm = m => (window.__asked.push(m), true); \
                 const boxes = [...document.querySelectorAll('input[name=pick]')].slice(0, 2); \
                 boxes.forEach(b => { b.checked = true; }); \
                 document.querySelector('#bulk select').value = 'retry-selected'; \
                 const picked = boxes.map(b => b.value.split('|').slice(1).join('|')); \
                 document.querySelector('#bulk button').click(); picked",
            )
            .await,
    )
    .unwrap();
    browser
        .wait_until(
            "document.querySelector('.flash') !== null && document.querySelector('.flash').innerText.includes('2 of 2 selected made due now')",
            "the bulk retry's confirmation",
        )
        .await;
    // Both handled, in whichever order.
    let mut handled = std::collections::HashSet::new();
    while handled.len() < ticked.len() {
        let e = host
            .event(T, "the ticked retries handled", |e| {
                e.kind == EventKind::Acked && ticked.contains(&e.origin_id)
            })
            .await;
        handled.insert(e.origin_id);
    }
    browser.screenshot("parked-bulk").await;
    // The page as it is now: one retry left.
    browser
        .wait_until_reloading(
            &format!("{base}/ui/s/payments/g/parked"),
            "document.querySelectorAll('input[name=pick]').length === 1",
            "one parked retry left",
        )
        .await;
    // Its page, from its link: where it waits now and its history.
    browser
        .eval("document.querySelector('a[href*=\"/entry?id=\"]').click(); true")
        .await;
    browser
        .wait_until(
            "location.search.startsWith('?id=') && document.querySelector('#history tr td') !== null && document.querySelector('#now').innerText.includes('parked')",
            "the entry's page with its history",
        )
        .await;
    browser.screenshot("entry").await;
    browser
        .wait_until_reloading(
            &format!("{base}/ui/s/payments/g/parked"),
            "document.querySelectorAll('input[name=pick]').length === 1",
            "the parked page again",
        )
        .await;
    browser
        .eval(
            "window.__asked = []; window.confirm = m => (window.__asked.push(m), true); \
             const form = document.querySelector('input[value=dead-letter-all]').form; \
             form.querySelector('input[name=reason]').value = 'cleared by the test'; \
             form.querySelector('button').click(); true",
        )
        .await;
    browser
        .wait_until(
            "document.querySelector('.flash') !== null && document.querySelector('.flash').innerText.includes('1 parked retries dead-lettered')",
            "the dead-letter-all's confirmation",
        )
        .await;
    let asked = browser.eval("window.__asked.join('|')").await;
    assert!(
        asked
            .as_str()
            .unwrap_or_default()
            .contains("Dead-letter all 1 parked retries"),
        "{asked}"
    );
    assert_eq!(parked(&mut conn, "payments.delayed").await, 0);
    assert!(
        dead_lettered(&mut conn, "payments")
            .await
            .iter()
            .any(|(_, fields)| field(fields, "sluice-reason") == Some("cleared by the test"))
    );
    // Logging out ends the session and forgets the key.
    browser
        .eval("document.querySelector('form[action=\"/ui/logout\"] button').click(); true")
        .await;
    browser
        .wait_until(
            "location.pathname === '/ui/login' && localStorage.getItem('sluice-key') === null",
            "the login form after logging out",
        )
        .await;
    host.stop().await.unwrap();
}

/// An operator starts a canary from the page with a component file, sees both versions side
/// by side, aborts it (every host rolls back), then tries the candidate on dead letters and
/// reads what it would do with each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_runs_a_canary_and_a_replay_from_the_page() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(&redis, Sub::fixture("web")).await;
    let admin = host.admin().await;
    let fixable = Control::ByVersion {
        v1: Box::new(Control::Dead {
            reason: "v1 bug".into(),
        }),
        v2: Box::new(Control::Ack),
    };
    for _ in 0..3 {
        add(&mut conn, "web", &fixable).await;
    }
    wait_dead_letters(&conn, "web", 3).await;
    let base = format!("http://{admin}");
    let mut browser = Browser::logged_in(&base, false).await;
    // No dialog in a headless run: every "are you sure?" says yes.
    browser
        .eval("window.confirm = function () { return true; }; true")
        .await;
    browser
        .choose_file("form.start-canary input[type=file]", &guests().fixture_v2)
        .await;
    browser
        .eval(
            "document.querySelector('form.start-canary input[name=percent]').value = '25'; \
             document.querySelector('form.start-canary button').click(); true",
        )
        .await;
    browser
        .wait_until(
            "document.body.innerText.includes('canary started') && document.querySelector('.canary-table') !== null",
            "the running canary, side by side",
        )
        .await;
    browser
        .eval("document.querySelector('.canary').scrollIntoView(); true")
        .await;
    browser.screenshot("canary").await;
    let (_, state) = http_get(admin, "/v1/subscriptions/web/g/canary").await;
    let state: Value = serde_json::from_str(&state).unwrap();
    assert_eq!(state["running"], true, "{state}");
    assert_eq!(state["record"]["share_percent"], 25.0, "{state}");
    browser
        .eval("window.confirm = function () { return true; }; document.querySelector('.canary button.danger').click(); true")
        .await;
    browser
        .wait_until(
            "document.body.innerText.includes('aborted')",
            "the abort's answer",
        )
        .await;
    let (_, state) = http_get(admin, "/v1/subscriptions/web/g/canary").await;
    let state: Value = serde_json::from_str(&state).unwrap();
    assert_eq!(state["verdict"]["verdict"], "rolled-back", "{state}");

    browser
        .eval("window.confirm = function () { return true; }; true")
        .await;
    browser
        .choose_file("form.replay input[type=file]", &guests().fixture_v2)
        .await;
    browser
        .eval(
            "document.querySelector('form.replay input[name=reason]').value = 'v1 bug'; \
             document.querySelector('form.replay button').click(); true",
        )
        .await;
    browser
        .wait_until(
            "document.body.innerText.includes('replayed 3 dead letter(s): 3 ack')",
            "the replay's result",
        )
        .await;
    browser.screenshot("replay").await;
    assert_eq!(
        dead_lettered(&mut conn, "web").await.len(),
        3,
        "a replay moves nothing"
    );
    host.stop().await.unwrap();
}

/// Filters and a bulk job in a browser: the operator filters dead letters by a payload field,
/// sees the count, is asked to confirm with that count, starts the job, watches it end with
/// what it moved, and finds it in the audit trail. Screenshots of each step go to
/// `target/ui-screenshots/` (and the docs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_filters_dead_letters_and_requeues_every_match_after_confirming() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let secrets = tempfile::tempdir().unwrap();
    let read_token = "read-only-token-4e1d7c9b2a6f8e3d5c0b";
    let read = crate::scaling::secret_file(secrets.path(), "read-token", read_token);
    let config = TestConfig::of(Sub::fixture("cards").delayed("cards.delayed"))
        .set("admin_read_token_file", read.as_str());
    let mut host = start_fixture(&redis, config).await;
    let admin = host.admin().await;
    for n in 0..30 {
        let reason = if n % 3 == 0 {
            format!("gateway {n}")
        } else {
            format!("card {n}")
        };
        add(&mut conn, "cards", &Control::DeadUntilRequeued { reason }).await;
    }
    wait_dead_letters(&conn, "cards", 30).await;
    let base = format!("http://{admin}");
    let mut browser = Browser::logged_in(&base, false).await;
    browser
        .open(&format!(
            "{base}/ui/s/cards/g/find?of=dead-letters&field=%2Freason&prefix=gateway"
        ))
        .await;
    browser
        .wait_until(
            "document.querySelector('[data-matches]') !== null",
            "the count",
        )
        .await;
    assert_eq!(
        browser
            .eval("document.querySelector('[data-matches]').dataset.matches")
            .await,
        json!("10")
    );
    browser.screenshot("find").await;
    browser
        .eval("document.querySelector('form[data-bulk] button').click(); true")
        .await;
    browser
        .wait_until(
            "document.querySelector('[data-confirm]') !== null",
            "the confirmation",
        )
        .await;
    let text = browser
        .eval("document.querySelector('[data-confirm]').innerText")
        .await;
    assert!(
        text.as_str().unwrap().contains("requeue 10 dead letters"),
        "{text}"
    );
    browser.screenshot("confirm").await;
    browser
        .eval("document.querySelector('[data-confirm] button').click(); true")
        .await;
    browser
        .wait_until_reloading(
            &format!("{base}/ui/s/cards/g/job"),
            "document.querySelector('[data-job-state]')?.dataset.jobState === 'done'",
            "the job done",
        )
        .await;
    assert_eq!(
        browser
            .eval("document.querySelector('[data-job-state]').dataset.jobMoved")
            .await,
        json!("10")
    );
    browser.screenshot("job").await;
    wait_for(T, "20 dead letters left", || {
        let mut conn = conn.clone();
        async move { (dead_lettered(&mut conn, "cards").await.len() == 20).then_some(()) }
    })
    .await;
    browser.open(&format!("{base}/ui/audit")).await;
    browser
        .wait_until(
            "document.querySelector('[data-audit]') !== null",
            "the audit trail",
        )
        .await;
    let audit = browser
        .eval("document.querySelector('[data-audit]').innerText")
        .await;
    let audit = audit.as_str().unwrap();
    assert!(
        audit.contains("job: requeue dead letters matching /reason starts with"),
        "{audit}"
    );
    assert!(audit.contains("page operator"), "{audit}");
    browser.screenshot("audit").await;
    // The overview draws the last hour from the host's own samples.
    browser.open(&format!("{base}/ui/")).await;
    browser
        .wait_until(
            "document.querySelector('[data-last-hour]') !== null",
            "the last hour's card",
        )
        .await;
    // The read-only token: the same find page, its count, and no form that acts.
    let mut reader = Browser::logged_in_with(&base, false, read_token).await;
    reader
        .open(&format!(
            "{base}/ui/s/cards/g/find?of=dead-letters&field=%2Freason&prefix=card"
        ))
        .await;
    reader
        .wait_until(
            "document.querySelector('[data-matches]') !== null",
            "the reader's count",
        )
        .await;
    assert_eq!(
        reader
            .eval("document.querySelector('[data-matches]').dataset.matches")
            .await,
        json!("20")
    );
    assert_eq!(
        reader.eval("document.querySelector('form[data-bulk]') === null && document.body.innerText.includes('read-only token')").await,
        json!(true),
        "a reader sees no bulk form and is told why"
    );
    let _ = host
        .event(T, "a requeued entry acked", |e| e.kind == EventKind::Acked)
        .await;
    host.stop().await.unwrap();
}
