//! Crashes under load: thousands of entries, each retried twice through the delayed set before
//! it is dead-lettered, while the `sluice` binary is SIGKILLed and restarted at random moments.
//! Every entry must reach its final outcome (one dead letter) exactly once in Redis; attempts
//! that a kill made repeat are counted and reported (at-least-once), and nothing is lost.

use std::time::Duration;

use crate::common::*;

const STREAM: &str = "crash";
const ENTRIES: usize = 3000;
const KILLS: usize = 10;

/// A small deterministic generator, so a failing run can be repeated with its seed.
pub(crate) struct Lcg(pub(crate) u64);

impl Lcg {
    pub(crate) fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % below
    }
}

/// The seed in `var`, else one from the clock (printed by the test, to repeat a failing run).
pub(crate) fn seed(var: &str) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_under_a_retry_heavy_load_loses_nothing_and_settles_each_entry_once() {
    let seed = seed("SLUICE_CRASH_SEED");
    let mut rng = Lcg(seed);
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    // Every attempt traps: two retries wait in the delayed set, the third attempt dead-letters.
    // The consumer name stays the same across restarts, as a deployment should keep it.
    let run = RunDir::new(
        &redis,
        TestConfig::of(
            Sub::fixture(STREAM)
                .set("max_retries", 2)
                .set(
                    "failure_backoff",
                    Raw(r#"{ initial = "200ms", max = "400ms" }"#),
                )
                .delayed(&format!("{STREAM}.delayed")),
        )
        .set("shutdown_timeout", "1s"),
    );
    let mut ids = Vec::with_capacity(ENTRIES);
    let mut pipe = redis::pipe();
    for _ in 0..ENTRIES {
        pipe.cmd("XADD")
            .arg(STREAM)
            .arg("*")
            .arg("payload")
            .arg(Control::Trap.to_string());
    }
    let added: Vec<String> = pipe.query_async(&mut conn).await.unwrap();
    ids.extend(added);
    for kill in 0..KILLS {
        let mut host = run.spawn();
        let after = Duration::from_millis(150 + rng.next(600));
        let started = std::time::Instant::now();
        // The kill lands at a random moment of the run: the wait is the behaviour under test.
        wait_for(Duration::from_secs(10), "the kill moment", || async move {
            (started.elapsed() >= after).then_some(())
        })
        .await;
        host.kill();
        println!("crash: kill {} after {} ms", kill + 1, after.as_millis());
    }
    let _last = run.spawn();
    // Let the last host finish everything.
    let out = wait_all_dead_lettered(&conn, STREAM, &ids, Duration::from_secs(120)).await;
    println!(
        "crash: seed {seed}, {ENTRIES} entries, {KILLS} kills: {} settled once, {} attempts repeated after a kill (at-least-once), {} settled twice, {} lost",
        out.settled, out.repeated, out.twice, out.lost
    );
    assert_eq!(out.lost, 0, "entries lost (seed {seed})");
    assert_eq!(out.twice, 0, "entries dead-lettered twice (seed {seed})");
    assert_eq!(
        out.foreign, 0,
        "dead letters naming no produced entry (seed {seed})"
    );
    assert_eq!(out.dead, ENTRIES);
}
