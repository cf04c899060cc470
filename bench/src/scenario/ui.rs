//! How long the admin page takes on big data: 1,000,000 parked retries and 100,000 dead
//! letters in one subscription, each page fetched a few times over HTTP from a running host.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio_util::sync::CancellationToken;

use super::{Bench, Report};

impl Bench {
    /// `ui`: fill the set and the dead-letter stream, start a host, time each page.
    pub async fn ui(&self, parked: usize, dead: usize) -> Result<Report> {
        let stream = "bench-ui";
        let set = "bench-ui.delayed";
        let mut conn = self.conn().await?;
        let fill_started = Instant::now();
        // Due in an hour, so nothing moves while the pages are timed.
        let due = super::now_ms() as i64 + 3_600_000;
        for chunk in (0..parked).collect::<Vec<_>>().chunks(5_000) {
            let mut pipe = redis::pipe();
            for &i in chunk {
                let fields = vec![(b"payload".to_vec(), Self::payment(i).into_bytes())];
                let member = super::parked_member(stream, i + 1, &fields);
                pipe.cmd("ZADD")
                    .arg(set)
                    .arg(due + i as i64)
                    .arg(member)
                    .ignore();
            }
            pipe.query_async::<()>(&mut conn).await?;
        }
        for chunk in (0..dead).collect::<Vec<_>>().chunks(5_000) {
            let mut pipe = redis::pipe();
            for &i in chunk {
                let id = format!("{}-0", i + 1);
                pipe.cmd("XADD")
                    .arg(sluice_descriptor::default_dead_letter(stream, "g"))
                    .arg("*")
                    .arg("payload")
                    .arg(Self::payment(i))
                    .arg("sluice-reason")
                    .arg(if i % 10 == 0 {
                        "gateway declined"
                    } else {
                        "timed out"
                    })
                    .arg("sluice-origin-stream")
                    .arg(stream)
                    .arg("sluice-origin-group")
                    .arg("g")
                    .arg("sluice-origin-id")
                    .arg(&id)
                    .arg("sluice-entry-id")
                    .arg(&id)
                    .arg("sluice-retry-count")
                    .arg("3")
                    .arg("sluice-delivery-count")
                    .arg("1")
                    .ignore();
            }
            pipe.query_async::<()>(&mut conn).await?;
        }
        eprintln!(
            "  filled {parked} parked and {dead} dead letters in {:.1}s",
            fill_started.elapsed().as_secs_f64()
        );
        let toml = format!(
            "admin = \"127.0.0.1:0\"\nadmin_open_on_loopback = true\n[[subscription]]\ncomponent = {:?}\nstream = {stream:?}\ngroup = \"g\"\nblock = \"100ms\"\ndelayed_retry = {{ key = {set:?} }}\n",
            self.fixture.display().to_string()
        );
        let service = self.service(&toml).await?;
        let mut admin = service.admin_addr();
        let stop = CancellationToken::new();
        let task = tokio::spawn(service.run(None, stop.clone()));
        let addr = tokio::time::timeout(Duration::from_secs(30), admin.wait_for(Option::is_some))
            .await
            .context("the admin server did not start")??
            .context("no admin address")?;
        let pages = [
            ("overview_ms", "/ui/".to_owned()),
            ("parked_ms", format!("/ui/s/{stream}/g/parked")),
            ("dead_letters_ms", format!("/ui/s/{stream}/g/dead-letters")),
            (
                "dead_letters_by_reason_ms",
                format!("/ui/s/{stream}/g/dead-letters?reason=declined"),
            ),
        ];
        let mut timings = Vec::new();
        let started = Instant::now();
        for (name, path) in pages {
            let url = format!("http://{addr}{path}");
            let mut times = Vec::new();
            for _ in 0..5 {
                let get = url.clone();
                let t = Instant::now();
                let (status, len) = tokio::task::spawn_blocking(move || -> Result<(u16, usize)> {
                    let mut response = ureq::get(&get).call()?;
                    let body = response.body_mut().read_to_string()?;
                    Ok((response.status().as_u16(), body.len()))
                })
                .await??;
                if status != 200 || len < 500 {
                    bail!("{url} answered {status} with {len} bytes");
                }
                times.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            times.sort_by(f64::total_cmp);
            timings.push((name, times[times.len() / 2]));
        }
        // `messages` is the number of page loads timed.
        let mut report = Report::new("ui", timings.len() * 5, started.elapsed());
        report.extra = timings;
        stop.cancel();
        task.await?.context("the host failed")?;
        Ok(report)
    }
}
