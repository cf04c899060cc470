//! Two roles and an audit trail: a read-only token sees what the operator's sees and is refused
//! (403) every action of the API and the page, writing nothing; every action the operator
//! takes is recorded in the audit stream (who, what, how many, when), once per action.

use std::time::Duration;

use crate::common::*;
use crate::scaling::secret_file;
use crate::ui::{csrf, page};

const T: Duration = Duration::from_secs(30);
const READ_TOKEN: &str = "read-only-token-7d3b1f9e5a2c8e6b4d0f";

/// Every call of the API that changes something, on subscription `roles`.
fn actions() -> Vec<(&'static str, String, &'static str)> {
    let base = "/v1/subscriptions/roles/g";
    vec![
        ("PUT", format!("{base}/handler"), ""),
        ("POST", format!("{base}/rollback"), ""),
        (
            "POST",
            format!("{base}/dead-letters/requeue"),
            r#"{"all":true}"#,
        ),
        ("DELETE", format!("{base}/dead-letters/0-1"), ""),
        (
            "POST",
            format!("{base}/parked/retry-now"),
            r#"{"all":true}"#,
        ),
        (
            "POST",
            format!("{base}/parked/dead-letter"),
            r#"{"origin_ids":["0-1"]}"#,
        ),
        ("DELETE", format!("{base}/parked/0-1?due_ms=1"), ""),
        (
            "POST",
            format!("{base}/scheduled"),
            r#"{"in":"1m","payload":"{}"}"#,
        ),
        ("POST", format!("{base}/keys/release"), r#"{"key":"k"}"#),
        ("POST", format!("{base}/pause"), ""),
        ("POST", format!("{base}/resume"), ""),
        ("PUT", format!("{base}/canary?percent=10"), ""),
        ("POST", format!("{base}/canary/abort"), ""),
        (
            "POST",
            format!("{base}/jobs"),
            r#"{"action":"delete","of":"dead-letters"}"#,
        ),
    ]
}

async fn audit_len(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    cmd(conn, &["XLEN", "sluice-audit"]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_token_sees_everything_and_is_refused_every_action() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let secrets = tempfile::tempdir().unwrap();
    let read = secret_file(secrets.path(), "read-token", READ_TOKEN);
    let config = TestConfig::of(Sub::fixture("roles").delayed("roles.delayed"))
        .set("admin_read_token_file", read.as_str());
    let mut host = start_fixture(&redis, config).await;
    let admin = host.admin().await;
    let id = add(
        &mut conn,
        "roles",
        &Control::Dead {
            reason: "kept".into(),
        },
    )
    .await;
    wait_dead_letters(&conn, "roles", 1).await;
    let reader = format!("Bearer {READ_TOKEN}");
    let as_reader = [("Authorization", reader.as_str())];
    // It sees what the operator sees.
    for path in [
        "/v1/subscriptions",
        "/v1/subscriptions/roles/g/dead-letters",
        "/v1/subscriptions/roles/g/parked",
        "/v1/scaling",
        "/v1/audit",
    ] {
        let (code, body) = http_request(admin, "GET", path, &as_reader, b"").await;
        assert_eq!(code, 200, "{path}: {body}");
    }
    // And acts nowhere: 403 before anything runs, and nothing recorded.
    for (method, path, body) in actions() {
        let (code, answer) = http_request(
            admin,
            method,
            &path,
            &[
                ("Authorization", &reader),
                ("Content-Type", "application/json"),
            ],
            body.as_bytes(),
        )
        .await;
        assert_eq!(code, 403, "{method} {path}: {answer}");
        assert!(answer.contains("read-only"), "{answer}");
    }
    assert_eq!(
        audit_len(&mut conn).await,
        0,
        "a refused call writes no record"
    );
    // The page: logged in with it, no action shown, every form refused.
    let session = log_in_with(admin, READ_TOKEN).await;
    let (code, letters) = page(admin, "/ui/s/roles/g/dead-letters", &session).await;
    assert_eq!(code, 200);
    assert!(
        letters.contains("kept") && letters.contains("read-only token"),
        "{letters}"
    );
    assert!(!letters.contains(">Requeue<"), "no actions shown");
    let token = csrf(&letters);
    let mut headers = session.headers();
    headers.push(("Content-Type", "application/x-www-form-urlencoded"));
    for form in [
        format!("csrf={token}&action=delete-dead&id={id}"),
        format!("csrf={token}&action=requeue&id={id}"),
        format!("csrf={token}&action=pause"),
    ] {
        let (code, _) = http_request_bare(
            admin,
            "POST",
            "/ui/s/roles/g/act",
            &headers,
            form.as_bytes(),
        )
        .await;
        assert_eq!(code, 403, "{form}");
    }
    let (code, _) = http_request_bare(
        admin,
        "POST",
        &format!("/ui/s/roles/g/jobs?csrf={token}"),
        &headers,
        format!("csrf={token}&of=dead-letters&action=delete").as_bytes(),
    )
    .await;
    assert_eq!(code, 403, "a bulk job from the page");
    assert_eq!(
        dead_lettered(&mut conn, "roles").await.len(),
        1,
        "nothing moved"
    );
    assert_eq!(audit_len(&mut conn).await, 0);
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operator_action_is_recorded_once_with_who_what_and_how_many() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(&redis, Sub::fixture("audited").delayed("audited.delayed")).await;
    let admin = host.admin().await;
    for _ in 0..3 {
        add(
            &mut conn,
            "audited",
            &Control::Dead {
                reason: "bad".into(),
            },
        )
        .await;
    }
    wait_dead_letters(&conn, "audited", 3).await;
    // The API: a requeue of all three is one record counting three.
    let (code, body) = http_request(
        admin,
        "POST",
        "/v1/subscriptions/audited/g/dead-letters/requeue",
        &[("Content-Type", "application/json")],
        br#"{"all":true}"#,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    // The page: a pause.
    let session = log_in(admin).await;
    let (_, overview) = page(admin, "/ui/", &session).await;
    let token = csrf(&overview);
    let mut headers = session.headers();
    headers.push(("Content-Type", "application/x-www-form-urlencoded"));
    let (code, _) = http_request_bare(
        admin,
        "POST",
        "/ui/s/audited/g/act",
        &headers,
        format!("csrf={token}&action=pause").as_bytes(),
    )
    .await;
    assert_eq!(code, 303);
    let (code, body) = http_request(admin, "GET", "/v1/audit", &[], b"").await;
    assert_eq!(code, 200, "{body}");
    let audit: serde_json::Value = serde_json::from_str(&body).unwrap();
    let items = audit["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "one record per action: {audit}");
    let (page_rec, api_rec) = (&items[0], &items[1]);
    assert_eq!(api_rec["who"], "api operator");
    assert_eq!(
        api_rec["what"],
        "POST /v1/subscriptions/audited/g/dead-letters/requeue"
    );
    assert_eq!(api_rec["stream"], "audited");
    assert_eq!(api_rec["count"], 3, "{api_rec}");
    assert!(api_rec["at_ms"].as_i64().unwrap() > 0);
    assert!(
        page_rec["who"]
            .as_str()
            .unwrap()
            .starts_with("page operator "),
        "{page_rec}"
    );
    assert_eq!(page_rec["what"], "pause");
    // Refused calls (a wrong token) write nothing.
    let (code, _) = http_request(
        admin,
        "POST",
        "/v1/subscriptions/audited/g/resume",
        &[("Authorization", "Bearer wrong")],
        b"",
    )
    .await;
    assert_eq!(code, 401);
    let len: u64 = cmd(&mut conn, &["XLEN", "sluice-audit"]).await;
    assert_eq!(len, 2);
    let _ = T;
    host.stop().await.unwrap();
}

/// The CLI's actions are recorded too: who (the user and machine), what, how many.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clis_actions_are_recorded_with_the_user_and_how_many() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let sub = Sub::fixture("clis").delayed("clis.delayed");
    let host = start_fixture(&redis, sub.clone()).await;
    for _ in 0..2 {
        add(
            &mut conn,
            "clis",
            &Control::Dead {
                reason: "bad".into(),
            },
        )
        .await;
    }
    wait_dead_letters(&conn, "clis", 2).await;
    host.stop().await.unwrap();
    let dir = RunDir::new(&redis, TestConfig::of(sub));
    let url = redis.url();
    let run = |args: Vec<&'static str>| {
        let cwd = dir.path().to_owned();
        let url = url.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                let mut all: Vec<&str> = args;
                all.extend(["sluice.toml", "--redis", &url]);
                run_sluice(&all, &cwd)
            })
            .await
            .unwrap()
        }
    };
    let (ok, _, err) = run(vec!["pause", "--reason", "maintenance"]).await;
    assert!(ok, "{err}");
    let (ok, _, err) = run(vec!["requeue", "--all"]).await;
    assert!(ok, "{err}");
    let rows: Vec<(String, Vec<(String, String)>)> =
        cmd(&mut conn, &["XRANGE", "sluice-audit", "-", "+"]).await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    let (_, pause) = &rows[0];
    let (_, requeue) = &rows[1];
    assert!(
        field(pause, "who").unwrap().starts_with("cli "),
        "{pause:?}"
    );
    assert!(field(pause, "who").unwrap().contains("(sluice pause)"));
    assert_eq!(field(pause, "stream"), Some("clis"));
    assert_eq!(field(requeue, "what"), Some("requeue"));
    assert_eq!(field(requeue, "count"), Some("2"));
    let _ = T;
}
