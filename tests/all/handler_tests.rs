//! Handler tests without Redis: `sluice test` runs a handler, in each language, on made-up
//! deliveries (fixtures) in its real sandbox, with its subscription's grants, limits and config
//! values, and checks each outcome against the fixture's `expect`. No Redis runs in this test.
//!
//! The payment gateway here refuses a body sent without a `Content-Length` (411), as simple
//! servers and many real gateways do, so a charge acked shows that each language's SDK says
//! the length of a body it knows whole.

use std::path::Path;

use crate::common::*;

/// A payment the gateway charges at once.
const SMALL: &str = r#"{"id": "p1", "account": "a-1", "amount_cents": 1000, "currency": "EUR", "created_at_ms": 1}"#;

/// The fixtures every language runs: a charge, an undecodable payload, a declined charge, a
/// call to a host the subscription does not grant (the same sandbox as in production), and a
/// retry's second attempt; and a granted host where nothing listens (`down`): the handler sees
/// the refused connection (a JavaScript `fetch` with a body rejects, it does not trap).
fn fixtures(dir: &Path, down: u16) -> std::path::PathBuf {
    let declined = SMALL.replace("1000", "0");
    let text = format!(
        r#"[
  {{"name": "charged", "payload": {SMALL}, "expect": "ack"}},
  {{"name": "not a payment", "payload": "{{not json", "expect": "dead-letter"}},
  {{"name": "declined", "payload": {declined}, "expect": "dead-letter"}},
  {{"name": "ungranted host", "payload": {SMALL}, "config": {{"gateway_url": "http://127.0.0.1:9"}}, "expect": "retry"}},
  {{"name": "gateway down", "payload": {SMALL}, "config": {{"gateway_url": "http://127.0.0.1:{down}"}}, "expect": "retry"}},
  {{"name": "a second attempt", "payload": {SMALL}, "retry_count": 1, "fields": {{"note": "x"}}, "expect": "ack"}}
]"#
    );
    let path = dir.join("payments.json");
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_test_runs_each_language_on_made_up_deliveries_in_its_sandbox() {
    let gateway = start_gateway().await;
    let dir = tempfile::tempdir().unwrap();
    let down = free_port();
    let fixtures = fixtures(dir.path(), down);
    for component in ["bank", "bank_python", "bank_js"] {
        let config = write_config(
            dir.path(),
            &format!("{component}.toml"),
            &format!(
                r#"[[subscription]]
component = "{{{component}}}"
allowed_outbound_hosts = ["http://{gateway}", "http://127.0.0.1:{down}"]
[subscription.config]
gateway_url = "http://{gateway}"
gateway_timeout_ms = "5000"
"#
            ),
        );
        let args = [
            "test".to_owned(),
            config.display().to_string(),
            fixtures.display().to_string(),
        ];
        let (ok, stdout, stderr) = tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run_sluice(&args, Path::new("."))
        })
        .await
        .unwrap();
        assert!(ok, "{component}:\n{stdout}\n{stderr}");
        for case in [
            "charged",
            "not a payment",
            "declined",
            "ungranted host",
            "gateway down",
            "a second attempt",
        ] {
            assert!(
                stdout
                    .lines()
                    .any(|l| l.starts_with(&format!("ok    {case}: "))),
                "{component}: {case}:\n{stdout}\n{stderr}"
            );
        }
        assert!(
            stdout.contains("declined: dead-letter: ") && stdout.contains("400"),
            "{component}: the gateway's answer is in the reason:\n{stdout}"
        );
        assert!(
            stderr.contains("not on this subscription's allowed_outbound_hosts"),
            "{component}: the grant refused the call:\n{stderr}"
        );
    }

    // An outcome other than the one expected fails the run and names the case.
    let wrong = dir.path().join("wrong.json");
    std::fs::write(
        &wrong,
        format!(r#"{{"name": "wrong", "payload": {SMALL}, "expect": "dead-letter"}}"#),
    )
    .unwrap();
    let config = dir.path().join("bank.toml");
    let args = ["test", config.to_str().unwrap(), wrong.to_str().unwrap()];
    let (ok, stdout, stderr) = run_sluice(&args, Path::new("."));
    assert!(!ok, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("FAIL  wrong: ack") && stdout.contains("expected DeadLetter"),
        "{stdout}"
    );
    assert!(
        stderr.contains("1 case(s) did not get the outcome they expect"),
        "{stderr}"
    );

    // A fixture with a misspelt key is refused, naming the file and the key.
    let typo = dir.path().join("typo.json");
    std::fs::write(&typo, r#"{"payload": {}, "expcet": "ack"}"#).unwrap();
    let args = ["test", config.to_str().unwrap(), typo.to_str().unwrap()];
    let (ok, _, stderr) = run_sluice(&args, Path::new("."));
    assert!(
        !ok && stderr.contains("typo.json") && stderr.contains("expcet"),
        "{stderr}"
    );
}
