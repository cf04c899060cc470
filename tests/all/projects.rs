//! A team starts from an empty directory, in any of the three languages: `sluice new` writes a
//! project that `sluice build` turns into a component and `sluice check` accepts with no edits.
//! The Rust one builds against the SDK as `cargo package` packs it (the WIT travels inside the
//! crate), not against this checkout. `sluice dev` rebuilds on every save and hot-swaps the
//! build into the running host; a broken build leaves the last good handler serving.

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
    check
}

#[test]
fn new_projects_build_and_pass_check_in_python_and_javascript() {
    let parent = tempfile::tempdir().unwrap();
    std::thread::scope(|s| {
        let py = s.spawn(|| new_build_check(parent.path(), "orders-py", "python", &[]));
        new_build_check(parent.path(), "orders-js", "js", &[]);
        py.join().expect("python");
    });
    // A second project of the same name is refused, naming what exists.
    let (ok, _, err) = run_sluice_with(
        &["new", "orders-py", "--lang", "python"],
        parent.path(),
        &[],
    );
    assert!(!ok && err.contains("already exists"), "{err}");
}

/// The three SDK crates as `cargo package` packs them, unpacked into `dir`.
fn packaged_sdk(dir: &Path) -> PathBuf {
    let status = Command::new(std::env::var("CARGO").unwrap_or("cargo".into()))
        .current_dir(root())
        .args(["package", "--allow-dirty", "--quiet"])
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
        manifest.contains("sluice-guest = \"0.1\"") && manifest.contains(&sdk),
        "by version, patched to the packaged crates: {manifest}"
    );
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
    // The first build (componentize-py) and its compile come before the host starts: minutes
    // on a loaded 2-core machine, so this waits for the fact, with room.
    wait_for(SLOW_BUILD, "the first build and the host", || {
        let log = host.log_text();
        async move { log.contains("admin server listening").then_some(()) }
    })
    .await;
    let admin = host.admin_addr().await;
    let mut c = conn.clone();
    let first = add(&mut c, "devloop", &serde_json::json!({"id": "1"})).await;
    wait_acked(&conn, "devloop", "devloop", &first).await;
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
