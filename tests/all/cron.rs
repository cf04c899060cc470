//! Cron schedules (`[[subscription.schedule]]`): each tick becomes exactly one entry for the
//! group however many hosts run it, through SIGKILLs, a Redis restart and host clocks an hour
//! off; missed ticks are skipped or fired once, as configured.

use std::collections::HashMap;
use std::time::Duration;

use crate::common::*;

/// A fixture subscription to `stream` whose schedule `cron` dead-letters each tick's entry
/// with a report (so each entry handled leaves one dead letter naming its origin id).
fn scheduled(stream: &str, cron: &str, missed: &str) -> Sub {
    Sub::fixture(stream).delayed(&format!("{stream}.delayed")).set(
        "schedule",
        Raw(&format!(
            r#"[{{ name = "tick", cron = "{cron}", missed = "{missed}", payload = {{ mode = "report", key = "x" }} }}]"#
        )),
    )
}

/// Each tick's entries (by the tick, from the origin id `<tick ms>-<seq>`), from the dead
/// letters of `stream`.
async fn ticks(conn: &mut redis::aio::MultiplexedConnection, stream: &str) -> HashMap<i64, usize> {
    let mut ticks = HashMap::new();
    for (_, fields) in dead_lettered(conn, stream).await {
        let origin = field(&fields, "sluice-origin-id").unwrap_or_default();
        let tick: i64 = origin.split('-').next().unwrap_or("0").parse().unwrap_or(0);
        *ticks.entry(tick).or_insert(0) += 1;
    }
    ticks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cron_every_second_on_three_hosts_fires_each_tick_once_through_kills_skew_and_a_redis_restart()
 {
    const RUN: Duration = Duration::from_secs(60);
    let seed = crate::crash::seed("SLUICE_CRON_SEED");
    let mut rng = crate::crash::Lcg(seed);
    let mut redis = Redis::start();
    let mut conn = redis.conn().await;
    let stream = "cron";
    let runs: Vec<RunDir> = (0..3)
        .map(|n| {
            let sub = scheduled(stream, "* * * * * *", "skip").set("consumer", format!("host-{n}"));
            RunDir::new(&redis, TestConfig::of(sub).set("shutdown_timeout", "1s"))
        })
        .collect();
    // One host an hour ahead, one an hour behind: Redis's clock rules.
    let skews = [
        ("SLUICE_CLOCK_SKEW", "+1h"),
        ("SLUICE_CLOCK_SKEW", "-1h"),
        ("SLUICE_CLOCK_SKEW", ""),
    ];
    let mut hosts: Vec<HostProcess> = runs
        .iter()
        .zip(skews)
        .map(|(run, skew)| run.spawn_env(&[skew]))
        .collect();
    let started = std::time::Instant::now();
    let ms_now = |conn: &mut redis::aio::MultiplexedConnection| {
        let mut conn = conn.clone();
        async move {
            let (s, us): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
            s * 1000 + us / 1000
        }
    };
    let first_ms = ms_now(&mut conn).await;
    let mut outage = (0, 0);
    let mut kills = 0;
    while started.elapsed() < RUN {
        let pause = Duration::from_millis(2_000 + rng.next(4_000));
        let until = std::time::Instant::now() + pause;
        wait_for(Duration::from_secs(10), "the next moment", || async move {
            (std::time::Instant::now() >= until).then_some(())
        })
        .await;
        if outage == (0, 0) && started.elapsed() > RUN / 2 {
            // Redis restarts (SHUTDOWN writes the AOF): the hosts reconnect.
            let before = ms_now(&mut conn).await;
            redis.server.restart().unwrap();
            conn = redis.conn().await;
            outage = (before, ms_now(&mut conn).await);
            println!("cron: Redis restarted ({} ms)", outage.1 - outage.0);
            continue;
        }
        let victim = rng.next(3) as usize;
        hosts[victim].kill();
        kills += 1;
        hosts[victim] = runs[victim].spawn_env(&[skews[victim]]);
    }
    let last_ms = ms_now(&mut conn).await;
    // Every tick up to the end handled (its entry dead-lettered with its report).
    let want_until = last_ms - 3_000;
    wait_for(Duration::from_secs(30), "the last ticks handled", || {
        let mut conn = conn.clone();
        async move {
            let ticks = ticks(&mut conn, stream).await;
            ticks.keys().any(|t| *t >= want_until).then_some(())
        }
    })
    .await;
    for mut host in hosts {
        host.terminate();
        host.wait_exit().await;
    }
    let ticks = ticks(&mut conn, stream).await;
    let twice: Vec<_> = ticks.iter().filter(|(_, n)| **n > 1).collect();
    // The whole seconds after the first full one, up to three seconds before the end: each
    // once, except while Redis was away (a tick more than GRACE late is skipped, as
    // configured).
    let from = (first_ms / 1000 + 2) * 1000;
    let missing: Vec<i64> = (from / 1000..want_until / 1000)
        .map(|s| s * 1000)
        .filter(|t| !ticks.contains_key(t))
        .filter(|t| *t < outage.0 - 1_000 || *t > outage.1 + 6_000)
        .collect();
    println!(
        "cron: seed {seed}, {} ticks in {:?}, {kills} kills, Redis away {} ms, {} twice, {} missing",
        ticks.len(),
        RUN,
        outage.1 - outage.0,
        twice.len(),
        missing.len()
    );
    assert!(
        twice.is_empty(),
        "ticks fired twice (seed {seed}): {twice:?}"
    );
    assert!(
        missing.is_empty(),
        "ticks never fired (seed {seed}): {missing:?}"
    );
    assert!(
        ticks.keys().all(|t| t % 1000 == 0),
        "ticks on whole seconds: {ticks:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ticks_missed_while_every_host_was_down_are_skipped_or_fired_once() {
    let redis = Redis::start();
    let conn = redis.conn().await;
    // Every 10 s: a host killed after one tick and started again after the next is due.
    let one = |stream: &'static str, missed: &'static str| {
        let run = RunDir::new(
            &redis,
            TestConfig::of(scheduled(stream, "*/10 * * * * *", missed)),
        );
        let conn = conn.clone();
        async move {
            let mut host = run.spawn();
            let first = wait_for(Duration::from_secs(30), "a first tick", || {
                let mut conn = conn.clone();
                async move { ticks(&mut conn, stream).await.keys().max().copied() }
            })
            .await;
            host.kill();
            host.wait_exit().await;
            let missed_tick = first + 10_000;
            wait_for(
                Duration::from_secs(30),
                "the next tick's time, and two seconds",
                || {
                    let mut conn = conn.clone();
                    async move {
                        let (s, us): (i64, i64) =
                            redis::cmd("TIME").query_async(&mut conn).await.unwrap();
                        (s * 1000 + us / 1000 > missed_tick + 7_000).then_some(())
                    }
                },
            )
            .await;
            let mut host = run.spawn();
            wait_for(Duration::from_secs(30), "the tick after", || {
                let mut conn = conn.clone();
                async move {
                    ticks(&mut conn, stream)
                        .await
                        .contains_key(&(missed_tick + 10_000))
                        .then_some(())
                }
            })
            .await;
            host.terminate();
            host.wait_exit().await;
            let mut conn = conn.clone();
            let after = ticks(&mut conn, stream).await;
            (after.contains_key(&missed_tick), after)
        }
    };
    let ((skipped, skip), (fired, once)) =
        tokio::join!(one("cron-skip", "skip"), one("cron-once", "once"));
    assert!(!skipped, "skip: the missed tick fired: {skip:?}");
    assert!(fired, "once: the missed tick did not fire: {once:?}");
    assert!(
        skip.values().chain(once.values()).all(|n| *n == 1),
        "{skip:?} {once:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn editing_a_schedules_expression_during_a_rolling_restart_fires_no_tick_twice() {
    let redis = Redis::start();
    let conn = redis.conn().await;
    let stream = "cron-edit";
    // The same schedule (its name) every second on the old config, every other second on the
    // new: while both run, each even second is proposed by both.
    let old = RunDir::new(
        &redis,
        TestConfig::of(scheduled(stream, "* * * * * *", "skip").set("consumer", "old")),
    );
    let new = RunDir::new(
        &redis,
        TestConfig::of(scheduled(stream, "*/2 * * * * *", "skip").set("consumer", "new")),
    );
    let server_ms = || {
        let mut conn = conn.clone();
        async move {
            let (s, us): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
            s * 1000 + us / 1000
        }
    };
    let wait_until = |at: i64| async move {
        wait_for(Duration::from_secs(30), "a moment", || async move {
            (server_ms().await >= at).then_some(())
        })
        .await;
    };
    let mut old_host = old.spawn();
    wait_for(
        Duration::from_secs(30),
        "the old config's first tick",
        || {
            let mut conn = conn.clone();
            async move { (!ticks(&mut conn, stream).await.is_empty()).then_some(()) }
        },
    )
    .await;
    let mut new_host = new.spawn();
    wait_until(server_ms().await + 6_000).await;
    old_host.terminate();
    old_host.wait_exit().await;
    let switched = server_ms().await + 1_500;
    wait_until(switched + 6_000).await;
    new_host.terminate();
    new_host.wait_exit().await;
    let mut conn = conn.clone();
    let ticks = ticks(&mut conn, stream).await;
    assert!(
        ticks.values().all(|n| *n == 1),
        "a tick fired twice: {ticks:?}"
    );
    let after: Vec<i64> = ticks.keys().copied().filter(|t| *t > switched).collect();
    assert!(
        after.len() >= 2 && after.iter().all(|t| t % 2_000 == 0),
        "the new expression: {after:?}"
    );
}
