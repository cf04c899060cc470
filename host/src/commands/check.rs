//! `sluice check`: everything `run` would load and resolve, checked and printed, without
//! starting anything.

use std::path::PathBuf;

use anyhow::Result;

use super::plan;

/// `sluice check`: validate everything and print the resolved plan.
pub async fn check(paths: &[PathBuf], redis: Option<&str>) -> Result<String> {
    let plan = plan(paths, redis).await?;
    Ok(plan.render())
}
