//! The admin listener's bearer token: the configured one, or a generated one written to
//! `admin.token_file` for `rebatectl` to read.
//!
//! The file is written so that only the service's user can read it, whatever was there before:
//! opened with `O_NOFOLLOW` (a symbolic link planted at the path is refused, never followed, so
//! the token cannot be written through it into a file someone else can read), refused unless it
//! is a regular file, and forced to mode 0600 with `fchmod` on the open file on every start (an
//! existing 0644 file does not keep its mode). If any of that fails, the service does not start.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;

use crate::config::Settings;

/// The admin token, compared in constant time.
#[derive(Clone)]
pub struct AdminToken(Arc<str>);

impl AdminToken {
    pub fn new(token: impl Into<Arc<str>>) -> Self {
        Self(token.into())
    }

    /// Constant-time in the token's length: no early exit on the first differing byte, so the
    /// answer's timing says nothing of how much of a guess was right.
    pub(crate) fn matches(&self, offered: &str) -> bool {
        equal_in_constant_time(self.0.as_bytes(), offered.as_bytes(), |_| {})
    }
}

/// Compares every byte of `expected` whatever `offered` holds; `visit` sees each index
/// compared (a no-op in the service; tests count with it).
fn equal_in_constant_time(expected: &[u8], offered: &[u8], mut visit: impl FnMut(usize)) -> bool {
    let mut difference = expected.len() ^ offered.len();
    for (index, byte) in expected.iter().enumerate() {
        visit(index);
        difference |= usize::from(byte ^ offered.get(index).copied().unwrap_or(!byte));
    }
    difference == 0
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("AdminToken(***)")
    }
}

/// Why the token file could not be written safely.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    /// The path is a symbolic link; following it could put the token anywhere.
    #[error(
        "{} is a symbolic link; refusing to follow it (remove it, or point admin.token_file at a regular file)",
        path.display()
    )]
    Symlink { path: PathBuf },
    /// A directory, socket, FIFO or device: not a place to keep a secret.
    #[error(
        "{} is not a regular file; refusing to write the admin token there",
        path.display()
    )]
    NotRegular { path: PathBuf },
    #[error("opening {}: {source}", path.display())]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The mode could not be forced to 0600 (e.g. the file belongs to another user).
    #[error("setting mode 0600 on {}: {source}", path.display())]
    Permissions {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("writing {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The configured admin token, or a generated one written to `admin.token_file` (mode 0600) for
/// `rebatectl` to read. The token itself is never logged.
pub fn load_or_create(settings: &Settings) -> anyhow::Result<AdminToken> {
    let admin = &settings.admin;
    if !admin.token.is_empty() {
        return Ok(AdminToken::new(admin.token.expose()));
    }
    // 128 bits from the thread's cryptographic generator, as 32 hex characters. Not a trace id:
    // those come from a small fast generator, and every response shows one.
    let token = String::from_utf8(rebate_telemetry::hex_128(rand::random::<[u8; 16]>()).to_vec())
        .expect("hex digits are ASCII");
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
    write_private(path, &token).context("writing admin.token_file")?;
    tracing::info!(token_file = %path.display(), "admin token generated");
    Ok(AdminToken::new(token))
}

/// Writes `contents` to `path`, readable and writable by the owner only.
///
/// The file is opened without truncation first, so that nothing is changed before it is known
/// to be a regular file; `O_NONBLOCK` keeps a FIFO planted at the path from blocking the start
/// (it fails with `ENXIO` instead). Then: `fstat` (regular file?), `fchmod` 0600, `ftruncate`,
/// write — all on the open descriptor, so a path swapped in between cannot redirect any step.
#[cfg(unix)]
pub fn write_private(path: &Path, contents: &str) -> Result<(), TokenFileError> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};

    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|source| match source.raw_os_error() {
            Some(libc::ELOOP) => TokenFileError::Symlink {
                path: path.to_owned(),
            },
            Some(libc::EISDIR | libc::ENXIO) => TokenFileError::NotRegular {
                path: path.to_owned(),
            },
            _ => TokenFileError::Open {
                path: path.to_owned(),
                source,
            },
        })?;
    let metadata = file.metadata().map_err(|source| TokenFileError::Open {
        path: path.to_owned(),
        source,
    })?;
    if !metadata.is_file() {
        return Err(TokenFileError::NotRegular {
            path: path.to_owned(),
        });
    }
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(|source| TokenFileError::Permissions {
            path: path.to_owned(),
            source,
        })?;
    let write_error = |source| TokenFileError::Write {
        path: path.to_owned(),
        source,
    };
    file.set_len(0).map_err(write_error)?;
    file.write_all(contents.as_bytes()).map_err(write_error)?;
    file.sync_all().map_err(write_error)
}

/// Without Unix permissions there is no mode to force; the file is written as is.
#[cfg(not(unix))]
pub fn write_private(path: &Path, contents: &str) -> Result<(), TokenFileError> {
    std::fs::write(path, contents).map_err(|source| TokenFileError::Write {
        path: path.to_owned(),
        source,
    })
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path)
            .expect("metadata")
            .permissions()
            .mode()
            & 0o777
    }

    #[test]
    fn the_compare_reads_every_byte_of_the_token_however_early_a_guess_differs() {
        let token = "0123456789abcdef0123456789abcdef";
        let guesses = [
            ("the token itself", token.to_owned(), true),
            ("wrong first byte", format!("X{}", &token[1..]), false),
            ("wrong last byte", format!("{}X", &token[..31]), false),
            ("a prefix", token[..8].to_owned(), false),
            ("longer", format!("{token}0"), false),
            ("empty", String::new(), false),
        ];
        for (what, guess, expected) in guesses {
            let mut compared = Vec::new();
            let matched = equal_in_constant_time(token.as_bytes(), guess.as_bytes(), |index| {
                compared.push(index);
            });
            assert_eq!(matched, expected, "{what}");
            assert_eq!(compared, (0..token.len()).collect::<Vec<_>>(), "{what}");
            assert_eq!(AdminToken::new(token).matches(&guess), expected, "{what}");
        }
    }

    #[test]
    fn a_new_file_is_created_with_mode_0600() {
        let directory = tempfile::tempdir().expect("temporary directory");
        let path = directory.path().join("admin-token");
        write_private(&path, "secret").expect("written");
        assert_eq!(std::fs::read_to_string(&path).expect("readable"), "secret");
        assert_eq!(mode(&path), 0o600);
    }

    #[test]
    fn an_existing_0644_file_becomes_0600_and_is_replaced() {
        let directory = tempfile::tempdir().expect("temporary directory");
        let path = directory.path().join("admin-token");
        std::fs::write(&path, "an older, longer token from the last start").expect("seeded");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        assert_eq!(mode(&path), 0o644);

        write_private(&path, "new").expect("written");
        assert_eq!(mode(&path), 0o600);
        assert_eq!(std::fs::read_to_string(&path).expect("readable"), "new");
    }

    #[test]
    fn a_symlink_is_refused_and_its_target_untouched() {
        let directory = tempfile::tempdir().expect("temporary directory");
        let target = directory.path().join("world-readable");
        std::fs::write(&target, "unrelated").expect("seeded");
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let link = directory.path().join("admin-token");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");

        let error = write_private(&link, "secret").expect_err("a symlink is refused");
        assert!(matches!(error, TokenFileError::Symlink { .. }), "{error:?}");
        assert!(
            error
                .to_string()
                .contains("is a symbolic link; refusing to follow it"),
            "{error}"
        );
        assert_eq!(
            std::fs::read_to_string(&target).expect("readable"),
            "unrelated"
        );
        assert_eq!(mode(&target), 0o644);
    }

    #[test]
    fn a_dangling_symlink_is_refused_and_nothing_is_created() {
        let directory = tempfile::tempdir().expect("temporary directory");
        let target = directory.path().join("would-be-created");
        let link = directory.path().join("admin-token");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");

        let error = write_private(&link, "secret").expect_err("a symlink is refused");
        assert!(matches!(error, TokenFileError::Symlink { .. }), "{error:?}");
        assert!(!target.exists(), "the link's target must not be created");
    }

    #[test]
    fn directories_and_sockets_are_not_regular_files() {
        let directory = tempfile::tempdir().expect("temporary directory");
        let error = write_private(directory.path(), "secret").expect_err("a directory");
        assert!(
            matches!(error, TokenFileError::NotRegular { .. }),
            "{error:?}"
        );

        let socket = directory.path().join("admin-token.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).expect("socket");
        let error = write_private(&socket, "secret").expect_err("a socket");
        assert!(
            matches!(error, TokenFileError::NotRegular { .. }),
            "{error:?}"
        );
        assert!(
            error.to_string().contains("is not a regular file"),
            "{error}"
        );
    }

    #[test]
    fn the_service_refuses_to_start_on_a_symlinked_token_file() {
        let directory = tempfile::tempdir().expect("temporary directory");
        let target = directory.path().join("elsewhere");
        std::fs::write(&target, "unrelated").expect("seeded");
        let link = directory.path().join("admin-token");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        let mut settings = Settings::defaults().expect("embedded defaults");
        settings.admin.token_file = link;

        let error = load_or_create(&settings).expect_err("refused");
        let message = format!("{error:#}");
        assert!(message.contains("admin.token_file"), "{message}");
        assert!(message.contains("symbolic link"), "{message}");
        assert_eq!(
            std::fs::read_to_string(&target).expect("readable"),
            "unrelated"
        );
    }

    #[test]
    fn a_generated_token_lands_in_the_file_with_mode_0600() {
        let directory = tempfile::tempdir().expect("temporary directory");
        let path = directory.path().join("nested").join("admin-token");
        let mut settings = Settings::defaults().expect("embedded defaults");
        settings.admin.token_file = path.clone();
        let token = load_or_create(&settings).expect("generated");
        let written = std::fs::read_to_string(&path).expect("readable");
        assert_eq!(written.len(), 32);
        assert_eq!(format!("{token:?}"), "AdminToken(***)");
        assert_eq!(mode(&path), 0o600);
    }
}
