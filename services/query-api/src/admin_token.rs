//! The admin listener's bearer token: the configured one, or a generated one written to
//! `admin.token_file` for `rebatectl` to read.

use anyhow::Context;

use crate::config::Settings;
use crate::http::admin::AdminToken;

/// The configured admin token, or a generated one written to `admin.token_file` (mode 0600) for
/// `rebatectl` to read. The token itself is never logged.
pub fn load_or_create(settings: &Settings) -> anyhow::Result<AdminToken> {
    let admin = &settings.admin;
    if !admin.token.is_empty() {
        return Ok(AdminToken::new(admin.token.expose()));
    }
    // 128 random bits, as 32 hex characters.
    let token = rebate_telemetry::TraceId::generate().to_hex();
    let path = &admin.token_file;
    if let Some(parent) = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    {
        std::fs::create_dir_all(parent).with_context(|| {
            format!(
                "creating the directory of admin.token_file {}",
                path.display()
            )
        })?;
    }
    write_private(path, &token)
        .with_context(|| format!("writing admin.token_file {}", path.display()))?;
    tracing::info!(token_file = %path.display(), "admin token generated");
    Ok(AdminToken::new(token))
}

#[cfg(unix)]
fn write_private(path: &std::path::Path, contents: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(contents.as_bytes())
}

#[cfg(not(unix))]
fn write_private(path: &std::path::Path, contents: &str) -> std::io::Result<()> {
    std::fs::write(path, contents)
}

