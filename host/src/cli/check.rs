//! `sluice check`: everything `run` would load and resolve, checked and printed, without
//! starting anything.

use std::path::PathBuf;

use anyhow::{Context as _, Result};

use super::plan;

/// `sluice check`: validate everything and print the resolved plan.
pub async fn check(paths: &[PathBuf], redis: Option<&str>) -> Result<String> {
    let plan = plan(paths, redis).await?;
    // What `run` refuses at start, `check` refuses too: an unreadable or guessable token.
    if let Some(token) = &plan.admin_token {
        token.read().context("the admin token")?;
    }
    if let Some(key) = &plan.rollout_key {
        key.read().context("the rollout key")?;
    }
    Ok(plan.render())
}
