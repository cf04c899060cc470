//! A team starts from an empty directory, in any of the three languages: `sluice new` writes a
//! project that `sluice build` turns into a component and `sluice check` accepts with no edits
//! (for Python and JavaScript, `scripts/newcomer` shows it, from the installed binary, in a new
//! user's HOME). The Rust one builds against the SDK as `cargo package` packs it (the WIT
//! travels inside the crate), not against this checkout. `sluice dev` rebuilds on every save
//! and hot-swaps the build into the running host; a broken build leaves the last good handler
//! serving.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::*;

const T: Duration = Duration::from_secs(60);
/// A Python build and its compile, on a machine whose two cores other tests keep busy.
const SLOW_BUILD: Duration = Duration::from_secs(240);

/// `sluice` with `args` in `dir` (tools on PATH, `env` added); stdout and stderr, after
/// asserting success.
fn sluice(args: &[&str], dir: &Path, env: &[(&str, &str)]) -> String {
    let (ok, stdout, stderr) = run_sluice_with(args, dir, env);
    assert!(
        ok,
        "sluice {args:?} failed in {}:\n{stdout}\n{stderr}",
        dir.display()
    );
    stdout + &stderr
}

/// `sluice new` → `sluice build` → `sluice check`, and what the check said.
fn new_build_check(parent: &Path, name: &str, lang: &str, env: &[(&str, &str)]) -> String {
    sluice(&["new", name, "--lang", lang], parent, env);
    let dir = parent.join(name);
    for file in ["sluice.toml", "README.md", ".gitignore"] {
        assert!(dir.join(file).is_file(), "{lang}: {file} written");
    }
    let built = sluice(&["build"], &dir, env);
    let component = dir
        .join("target")
        .join(format!("{}.wasm", name.replace('-', "_")));
    assert!(component.is_file(), "{lang}: {built}");
    let check = sluice(&["check", "sluice.toml"], &dir, env);
    assert!(
        check.contains(&format!("stream `{name}`, group `{name}`"))
            && check.contains(&format!("retries wait in sorted set `{name}.delayed`")),
        "{lang}: {check}"
    );
    // The scaffold's own example test: its fixtures, run on the component, without Redis.
    let tested = sluice(&["test", "fixtures/example.json"], &dir, env);
    assert_eq!(
        tested.lines().filter(|l| l.starts_with("ok    ")).count(),
        4,
        "{lang}: {tested}"
    );
    check
}

/// `cargo test` in a Rust project: its example tests run natively, without a host or Redis.
fn cargo_test(dir: &Path, env: &[(&str, &str)]) -> String {
    let out = Command::new(std::env::var("CARGO").unwrap_or("cargo".into()))
        .current_dir(dir)
        .args(["test", "--quiet"])
        .envs(env.iter().copied())
        .output()
        .expect("cargo runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "cargo test in {}:\n{text}",
        dir.display()
    );
    text
}

/// The three SDK crates as `cargo package` packs them, unpacked into `dir`. Without cargo's
/// verify build (a native build of each, a minute of CPU): the project the caller builds
/// against them compiles them for their real target, which is the verification that counts.
fn packaged_sdk(dir: &Path) -> PathBuf {
    let status = Command::new(std::env::var("CARGO").unwrap_or("cargo".into()))
        .current_dir(root())
        .args(["package", "--allow-dirty", "--quiet", "--no-verify"])
        .args([
            "-p",
            "sluice-descriptor",
            "-p",
            "sluice-guest-macros",
            "-p",
            "sluice-guest",
        ])
        .status()
        .expect("cargo package runs");
    assert!(status.success(), "cargo package of the SDK crates");
    let packaged = target_dir().join("package");
    let crates = dir.join("crates");
    std::fs::create_dir_all(&crates).unwrap();
    for name in ["sluice-descriptor", "sluice-guest-macros", "sluice-guest"] {
        let file = packaged.join(format!("{name}-0.1.0.crate"));
        let status = Command::new("tar")
            .arg("xzf")
            .arg(&file)
            .arg("-C")
            .arg(&crates)
            .status()
            .expect("tar runs");
        assert!(status.success(), "unpack {}", file.display());
    }
    let wit = crates.join("sluice-guest-0.1.0/wit");
    assert!(
        wit.join("sluice.wit").is_file() && wit.join("deps/http.wit").is_file(),
        "the WIT travels inside the sluice-guest crate"
    );
    crates
}

#[test]
fn a_new_rust_project_builds_against_the_packaged_sdk() {
    let parent = tempfile::tempdir().unwrap();
    let crates = packaged_sdk(parent.path());
    // A shared target directory: the SDK's dependencies compile once per machine.
    let target = root().join("target/scaffold");
    let sdk = crates.display().to_string();
    let target = target.display().to_string();
    let env = [
        ("SLUICE_SDK_PATH", sdk.as_str()),
        ("CARGO_TARGET_DIR", target.as_str()),
    ];
    new_build_check(parent.path(), "orders-rs", "rust", &env);
    let manifest = std::fs::read_to_string(parent.path().join("orders-rs/Cargo.toml")).unwrap();
    assert!(
        manifest.contains("sluice-guest = \"0.1\"")
            && manifest.contains("path = \"../crates/sluice-guest-0.1.0\"")
            && !manifest.contains(&sdk),
        "by version, patched to the packaged crates by a path relative to the project: {manifest}"
    );
    let tested = cargo_test(&parent.path().join("orders-rs"), &env);
    assert!(tested.contains("2 passed"), "{tested}");
}

/// A Rust project carries the SDK it builds against: moved to another directory (another
/// machine, a clone, another name), it builds there what its config names, and nothing in it
/// names the checkout `sluice` was built from. The `http` template builds too, and brings a
/// stand-in for its API.
#[test]
fn a_new_rust_project_carries_its_sdk_and_builds_where_it_is_moved() {
    let parent = tempfile::tempdir().unwrap();
    let target = root().join("target/scaffold").display().to_string();
    let env = [("CARGO_TARGET_DIR", target.as_str())];
    sluice(
        &["new", "calls-api", "--lang", "rust", "--template", "http"],
        parent.path(),
        &env,
    );
    let checkout = root().canonicalize().unwrap().display().to_string();
    for file in ["Cargo.toml", ".gitignore", "sluice.toml"] {
        let text = std::fs::read_to_string(parent.path().join("calls-api").join(file)).unwrap();
        assert!(
            !text.contains(&checkout),
            "{file} names the checkout: {text}"
        );
    }
    assert!(parent.path().join("calls-api/stub_api.py").is_file());
    let ignored = std::fs::read_to_string(parent.path().join("calls-api/.gitignore")).unwrap();
    assert!(
        ignored.lines().any(|l| l == ".sluice/") && ignored.lines().any(|l| l == "target/"),
        "{ignored}"
    );
    // Moved and renamed (a copy, a clone under another name): it builds the component its
    // sluice.toml names, not one named after the new directory.
    let elsewhere = tempfile::tempdir().unwrap();
    let moved = elsewhere.path().join("renamed-api");
    std::fs::rename(parent.path().join("calls-api"), &moved).unwrap();
    let built = sluice(&["build"], &moved, &env);
    assert!(
        built.contains("target/calls_api.wasm") && moved.join("target/calls_api.wasm").is_file(),
        "{built}"
    );
    let tested = cargo_test(&moved, &env);
    assert!(tested.contains("2 passed"), "{tested}");
    let check = sluice(&["check"], &moved, &env);
    assert!(
        check.contains("stream `calls-api`, group `calls-api`")
            && check.contains("http://127.0.0.1:8080"),
        "{check}"
    );
}

/// A JavaScript syntax error names the file, line and column and says what is wrong, as cargo
/// does, instead of componentize-js's count of errors.
#[test]
fn a_javascript_syntax_error_points_at_the_line() {
    let parent = tempfile::tempdir().unwrap();
    sluice(&["new", "typo-js", "--lang", "js"], parent.path(), &[]);
    let dir = parent.path().join("typo-js");
    let app = dir.join("src/app.js");
    let source = std::fs::read_to_string(&app).unwrap();
    let (line, _) = source
        .lines()
        .enumerate()
        .find(|(_, l)| l.trim() == "return ack();")
        .unwrap();
    std::fs::write(&app, source.replace("return ack();", "return ack(;")).unwrap();
    let (ok, _, err) = run_sluice_with(&["build"], &dir, &[]);
    assert!(!ok, "{err}");
    let at = format!("--> src/app.js:{}:", line + 1);
    assert!(
        err.contains("syntax error: Unexpected token ';'") && err.contains(&at),
        "{err}"
    );
    assert!(!err.contains("encountered [1] errors"), "{err}");

    // `sluice dev` with that error waits for a fix; `sluice send` meanwhile says why nothing
    // can be sent, instead of waiting for the fix.
    let unused = format!("redis://127.0.0.1:{}", free_port());
    let mut dev = HostProcess::spawn_with(&["dev", "--redis", &unused], &dir, &[]);
    let deadline = std::time::Instant::now() + T;
    while !dir.join(".sluice/dev.pid").is_file() {
        assert!(std::time::Instant::now() < deadline, "{}", dev.log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
    let (ok, out, err) = run_sluice_with(&["send", "--redis", &unused, r#"{"id":"1"}"#], &dir, &[]);
    dev.kill();
    assert!(!ok, "{out}{err}");
    assert!(
        err.contains("the first build of `sluice dev`") && err.contains("failed"),
        "{err}\n{}",
        dev.log_text()
    );
}

/// Without the Python tools, a build names the one command that installs them.
#[test]
fn a_missing_toolchain_names_the_command_that_installs_it() {
    let parent = tempfile::tempdir().unwrap();
    sluice(&["new", "no-tools", "--lang", "python"], parent.path(), &[]);
    let empty = parent.path().join("no-tools-dir").display().to_string();
    let (ok, _, err) = run_sluice_with(
        &["build"],
        &parent.path().join("no-tools"),
        &[
            ("SLUICE_TOOLS_DIR", empty.as_str()),
            ("PATH", "/usr/bin:/bin"),
        ],
    );
    assert!(!ok && err.contains("run `sluice tools install`"), "{err}");
}

/// The digest `/metrics` says serves `stream` now.
async fn serving(addr: std::net::SocketAddr, stream: &str) -> Option<String> {
    let (_, metrics) = http_get(addr, "/metrics").await;
    metrics.lines().find_map(|line| {
        let rest = line.strip_prefix("sluice_handler_info{")?;
        (line.ends_with("} 1") && rest.contains(&format!("stream=\"{stream}\"")))
            .then(|| {
                rest.split("digest=\"")
                    .nth(1)?
                    .split('"')
                    .next()
                    .map(str::to_owned)
            })
            .flatten()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_dev_rebuilds_and_swaps_and_keeps_the_last_good_build() {
    let redis = Redis::start();
    let conn = redis.conn().await;
    let parent = tempfile::tempdir().unwrap();
    sluice(&["new", "devloop", "--lang", "python"], parent.path(), &[]);
    let dir = parent.path().join("devloop");
    let config = dir.join("sluice.toml");
    let toml = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("admin = \"127.0.0.1:0\"\n{toml}")).unwrap();
    let url = redis.url();
    let path = tools_path();
    let host = HostProcess::spawn_with(&["dev", "--redis", &url], &dir, &[("PATH", path.as_str())]);
    // `sluice send` while the first build runs waits for it, saying so, then sends.
    wait_for(T, "sluice dev to start its first build", || {
        let marked = dir.join(".sluice/dev.pid").is_file();
        async move { marked.then_some(()) }
    })
    .await;
    let (send_dir, send_url) = (dir.clone(), url.clone());
    let sent = tokio::task::spawn_blocking(move || {
        let args = ["send", "--redis", send_url.as_str(), r#"{"id":"1"}"#];
        run_sluice(&args, &send_dir)
    });
    // The first build (componentize-py) and its compile come before the host starts: minutes
    // on a loaded 2-core machine, so this waits for the fact, with room.
    wait_for(SLOW_BUILD, "the first build and the host", || {
        let log = host.log_text();
        async move { log.contains("admin server listening").then_some(()) }
    })
    .await;
    let (ok, stdout, stderr) = tokio::time::timeout(SLOW_BUILD, sent)
        .await
        .expect("sluice send returns once dev serves")
        .unwrap();
    assert!(ok, "{stdout}\n{stderr}");
    assert!(
        stderr.contains("is building the handler here; waiting for it to serve"),
        "{stderr}"
    );
    let first = stdout
        .split_whitespace()
        .nth(1)
        .expect("sluice send names the entry it added")
        .to_owned();
    // Without a token, dev binds the page to whoever started it: a key for this session.
    assert!(
        host.log_text().contains("admin key  "),
        "{}",
        host.log_text()
    );
    let admin = host.admin_addr().await;
    let mut c = conn.clone();
    wait_acked(&conn, "devloop", "devloop", &first).await;
    // A working handler is visible in the dev log: a line for the ack, with its time.
    wait_for(T, "the ack's line in the dev log", || {
        let log = host.log_text();
        let id = format!("id={first}");
        async move {
            log.lines()
                .any(|l| l.contains(&id) && l.contains("acked") && l.contains("elapsed="))
                .then_some(())
        }
    })
    .await;
    let v1 = wait_for(T, "the first build serving", || serving(admin, "devloop")).await;

    // A change to the source: rebuilt, swapped in, and the next delivery sees it.
    let app = dir.join("app.py");
    let source = std::fs::read_to_string(&app).unwrap();
    let edited = source.replace("    return ack()\n", "    return dead_letter(\"edited\")\n");
    let edited = edited.replace("import DelayedRetry,", "import DelayedRetry, dead_letter,");
    assert_ne!(source, edited);
    std::fs::write(&app, &edited).unwrap();
    let v2 = wait_for(SLOW_BUILD, "the edited build serving", || {
        let v1 = v1.clone();
        async move { serving(admin, "devloop").await.filter(|d| *d != v1) }
    })
    .await;
    let second = add(&mut c, "devloop", &serde_json::json!({"id": "2"})).await;
    let dead_letters = sluice_descriptor::default_dead_letter("devloop", "devloop");
    let dead = wait_dead_letters_in(&conn, &dead_letters, 1).await;
    assert_eq!(field(&dead[0].1, "sluice-origin-id"), Some(second.as_str()));
    assert_eq!(field(&dead[0].1, "sluice-reason"), Some("edited"));

    // A broken build: the errors are shown, the last good handler keeps serving.
    std::fs::write(&app, format!("{edited}\ndef broken(:\n")).unwrap();
    wait_for(SLOW_BUILD, "the failed build reported", || {
        let log = host.log_text();
        async move {
            log.contains("the last good handler keeps serving")
                .then_some(())
        }
    })
    .await;
    assert!(
        host.log_text().contains("SyntaxError"),
        "{}",
        host.log_text()
    );
    let third = add(&mut c, "devloop", &serde_json::json!({"id": "3"})).await;
    let dead = wait_dead_letters_in(&conn, &dead_letters, 2).await;
    assert_eq!(field(&dead[1].1, "sluice-origin-id"), Some(third.as_str()));
    assert_eq!(field(&dead[1].1, "sluice-reason"), Some("edited"));
    assert_eq!(serving(admin, "devloop").await, Some(v2));
}

#[test]
fn a_big_component_runs_on_defaults_compiles_once_and_names_the_limit_to_raise() {
    let python = &polyglot().python;
    let dir = tempfile::tempdir().unwrap();
    let config = |extra: &str| {
        let path = dir.path().join("sluice.toml");
        std::fs::write(
            &path,
            format!(
                "cache_dir = \"{}\"\n[[subscription]]\ncomponent = \"{}\"\n{extra}",
                dir.path().join("cache").display(),
                python.display()
            ),
        )
        .unwrap();
        path
    };
    let check = |path: &Path| {
        let (ok, stdout, stderr) = run_sluice_with(
            &["check", &path.display().to_string()],
            dir.path(),
            &[("RUST_LOG", "info")],
        );
        (ok, stdout + &stderr)
    };
    // Defaults: it loads, and the first load says it compiled and how long it took.
    let defaults = config("");
    let (ok, first) = check(&defaults);
    assert!(ok, "{first}");
    assert!(
        first.contains("compiled the") && first.contains("MiB component in"),
        "{first}"
    );
    // The second start reads the cache.
    let (ok, second) = check(&defaults);
    assert!(ok && !second.contains("compiled the"), "{second}");
    // A fresh instance per delivery of a big component is allowed, with a warning saying what
    // it costs.
    let (ok, isolated) = check(&config("isolation = \"per-delivery\"\n"));
    assert!(
        ok && isolated.contains("warning") && isolated.contains("instantiates it anew"),
        "{isolated}"
    );
    // Too little memory: the check fails naming the setting to raise.
    let (ok, small) = check(&config("memory_limit = \"8MiB\"\n"));
    assert!(
        !ok && small.contains("raise `memory_limit`") && small.contains("minimum byte size"),
        "{small}"
    );
}

/// A JavaScript handler that throws: the attempt fails with the error's type, message and
/// place in one line (the dead letter's reason), and the stack is kept apart, in the dead
/// letter's `sluice-trace` field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_javascript_exception_names_its_type_message_and_line() {
    let parent = tempfile::tempdir().unwrap();
    sluice(&["new", "throws-js", "--lang", "js"], parent.path(), &[]);
    let dir = parent.path().join("throws-js");
    let app = dir.join("src/app.js");
    let source = std::fs::read_to_string(&app).unwrap();
    let thrown = source.replace(
        "    return ack();\n",
        "    throw new TypeError(`no account ${event.id}`);\n",
    );
    assert_ne!(source, thrown);
    std::fs::write(&app, thrown).unwrap();
    sluice(&["build"], &dir, &[]);
    let component = dir.join("target/throws_js.wasm").display().to_string();
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let host = HostProcess::run(
        &redis,
        TestConfig::of(Sub::new(&component, "throws-js").set("max_retries", 0)),
    );
    wait_for(SLOW_BUILD, "the host to serve", || {
        let log = host.log_text();
        async move { log.contains("admin server listening").then_some(()) }
    })
    .await;
    let id = add(&mut conn, "throws-js", &serde_json::json!({"id": "acct-9"})).await;
    let dead = wait_dead_letters(&conn, "throws-js", 1).await;
    let fields = &dead[0].1;
    assert_eq!(field(fields, "sluice-origin-id"), Some(id.as_str()));
    let reason = field(fields, "sluice-reason").unwrap();
    assert!(
        reason.contains("last attempt: handler threw TypeError: no account acct-9 (src/app.js:"),
        "{reason}"
    );
    let trace = field(fields, "sluice-trace").unwrap_or_default();
    assert!(
        trace.contains("src/app.js:"),
        "the stack, apart, naming the source: {trace}"
    );
    // The dead letter may land before the host's log line is written: wait for the line.
    wait_for(T, "the host to log the exception", || {
        let logged = host.log_text().contains("TypeError: no account acct-9");
        async move { logged.then_some(()) }
    })
    .await;
    let log = host.log_text();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("TypeError: no account acct-9"))
        .collect();
    assert_eq!(lines.len(), 1, "logged once: {lines:?}");
}

/// Kills a process this test started, by PID, however the test ends.
struct Started(std::process::Child);

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The `http` template runs green on a developer's machine: its stand-in API (`stub_api.py`,
/// which like many servers refuses a body without a Content-Length) gets the event, the dev
/// log shows the ack with its trace id, and `--traces` writes that trace's spans to the
/// terminal with no collector.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_template_runs_green_against_its_stub_with_traces_in_the_terminal() {
    let redis = Redis::start();
    let conn = redis.conn().await;
    let parent = tempfile::tempdir().unwrap();
    let new = ["new", "calls", "--lang", "js", "--template", "http"];
    sluice(&new, parent.path(), &[]);
    let dir = parent.path().join("calls");
    // The stub on a free port (8080 may be taken here): the config follows it.
    let port = free_port();
    let config = dir.join("sluice.toml");
    let toml = std::fs::read_to_string(&config)
        .unwrap()
        .replace("127.0.0.1:8080", &format!("127.0.0.1:{port}"))
        // One instance takes every delivery (see below).
        .replace(
            "[subscription.config]",
            "max_in_flight = 1\n\n[subscription.config]",
        );
    std::fs::write(&config, format!("admin = \"127.0.0.1:0\"\n{toml}")).unwrap();
    let stub_log = dir.join("stub.log");
    let _stub = Started(
        Command::new("python3")
            .args(["stub_api.py", "--port", &port.to_string()])
            .current_dir(&dir)
            .stdout(std::fs::File::create(&stub_log).unwrap())
            .spawn()
            .expect("python3 runs the stub"),
    );
    let listening = format!("stub API on http://127.0.0.1:{port}/events");
    wait_for(T, "the stub listening", || {
        let log = std::fs::read_to_string(&stub_log).unwrap_or_default();
        let listening = listening.clone();
        async move { log.contains(&listening).then_some(()) }
    })
    .await;
    let url = redis.url();
    let path = tools_path();
    let args = ["dev", "--traces", "--redis", &url];
    let host = HostProcess::spawn_with(&args, &dir, &[("PATH", path.as_str())]);
    wait_for(SLOW_BUILD, "the first build and the host", || {
        let log = host.log_text();
        async move { log.contains("admin server listening").then_some(()) }
    })
    .await;
    let mut c = conn.clone();
    let id = add(
        &mut c,
        "calls",
        &serde_json::json!({"id": "t1", "message": "hi"}),
    )
    .await;
    wait_acked(&conn, "calls", "calls", &id).await;
    let got = std::fs::read_to_string(&stub_log).unwrap();
    assert!(
        got.contains("idempotency-key=t1") && got.contains(r#""id":"t1""#),
        "the stub got the event whole: {got}"
    );
    // The ack's line carries the trace id; the console writes that trace's delivery span.
    let trace = wait_for(T, "the ack's line with its trace id", || {
        let log = host.log_text();
        let id = format!("id={id}");
        async move {
            let line = log
                .lines()
                .find(|l| l.contains(&id) && l.contains("acked"))?
                .to_owned();
            let trace = line.split("trace_id=").nth(1)?.trim_start_matches('"');
            let trace = trace.get(..32)?.to_owned();
            Some(trace)
        }
    })
    .await;
    // Many deliveries on reused instances: the JavaScript runtime frees its HTTP handles only
    // when it collects garbage, so an instance whose resource table fills up is not reused
    // (it used to fail about every 64th attempt on the table's limit).
    let mut ids = Vec::new();
    for n in 0..150 {
        ids.push(add(&mut c, "calls", &serde_json::json!({"id": format!("m{n}")})).await);
    }
    for id in &ids {
        wait_acked(&conn, "calls", "calls", id).await;
    }
    assert!(
        !host.log_text().contains("attempt failed"),
        "{}",
        host.log_text()
    );
    // The scaffold's own example test passes against the stub, without Redis.
    let tested = sluice(&["test", "fixtures/example.json"], &dir, &[]);
    let passed = tested.lines().filter(|l| l.starts_with("ok    ")).count();
    assert_eq!(passed, 2, "{tested}");
    wait_for(T, "the delivery span on the terminal", || {
        let log = host.log_text();
        let span = format!("trace {trace} delivery ");
        async move { log.lines().any(|l| l.starts_with(&span)).then_some(()) }
    })
    .await;
}
