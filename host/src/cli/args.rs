//! What several subcommands' arguments share: a bounded duration, and the `[CONFIG] ID...`
//! list of `requeue` and `retry-now`.

use std::path::PathBuf;

/// A command-line duration ("500ms", "30s", "2m"), at most a day: a deadline, not a schedule.
pub(crate) fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let duration = humantime::parse_duration(text)
        .map_err(|e| format!("{e} (write durations like \"500ms\", \"30s\" or \"2m\")"))?;
    if duration.is_zero() || duration > std::time::Duration::from_secs(86_400) {
        return Err("give a duration above 0 and at most 1 day".to_owned());
    }
    Ok(duration)
}

/// `[CONFIG] ID...`: the first argument is the config when it names a `.toml` or `.wasm`
/// file, else every argument is an id and the config is ./sluice.toml.
pub(crate) fn config_and_ids(
    mut args: Vec<String>,
    all: bool,
) -> anyhow::Result<(PathBuf, Vec<String>)> {
    let is_config = args
        .first()
        .is_some_and(|a| a.ends_with(".toml") || a.ends_with(".wasm"));
    let config = if is_config {
        PathBuf::from(args.remove(0))
    } else {
        PathBuf::from("sluice.toml")
    };
    if all && !args.is_empty() {
        anyhow::bail!("give ids or --all, not both");
    }
    if !all && args.is_empty() {
        anyhow::bail!("give at least one id, or --all");
    }
    Ok((config, args))
}
