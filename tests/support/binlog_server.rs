//! A MariaDB server of the test's own with the binary log on (`log_bin`, ROW format, full row
//! images), as change capture needs and the machine's server is not: `mariadb-install-db` into
//! a temporary directory, `mariadbd` on a free port below 32768, stopped (and its files removed)
//! when dropped.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tempfile::TempDir;

/// The programs a binlog server needs: change-capture tests check for them first, and fail
/// under CI, or skip elsewhere, without them.
pub const PROGRAMS: &[&str] = &["mariadb-install-db", "mariadbd"];

/// A running `mariadbd` with its binlog on; root without a password on 127.0.0.1.
#[derive(Debug)]
pub struct BinlogServer {
    child: Child,
    port: u16,
    directory: TempDir,
    /// Options beyond the binlog's (TLS), kept for a restart.
    extra: Vec<String>,
}

impl BinlogServer {
    /// Installs and starts a server. Panics, with the server's log, when it does not come up.
    pub async fn start() -> Self {
        Self::start_with(Vec::new()).await
    }

    /// A server with TLS on (its certificate, key and CA from `files`) that refuses plain
    /// connections (`require_secure_transport`).
    pub async fn start_tls(files: &rebate_testkit::tls::PkiFiles) -> Self {
        Self::start_with(vec![
            format!("--ssl-cert={}", files.server_cert.display()),
            format!("--ssl-key={}", files.server_key.display()),
            format!("--ssl-ca={}", files.ca.display()),
            "--require-secure-transport=ON".to_owned(),
        ])
        .await
    }

    async fn start_with(extra: Vec<String>) -> Self {
        rebate_testkit::require_programs("a MariaDB server with a binlog", PROGRAMS);
        let mut directory = tempfile::tempdir().expect("a temporary directory");
        let data = directory.path().join("data");
        // A temporary directory of its own: bootstraps running at once in the shared /tmp
        // collide on their temporary tables' names.
        let scratch = directory.path().join("tmp");
        std::fs::create_dir_all(&scratch).expect("a scratch directory");
        let install = Command::new("mariadb-install-db")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--tmpdir={}", scratch.display()))
            .arg("--auth-root-authentication-method=normal")
            .arg("--skip-test-db")
            .arg("--user=root")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .expect("mariadb-install-db runs");
        assert!(
            install.status.success(),
            "mariadb-install-db failed: {}",
            String::from_utf8_lossy(&install.stderr)
        );
        for _ in 0..20 {
            let port = free_port_below_32768();
            let child = spawn(directory.path(), &data, port, &extra);
            let mut server = Self {
                child,
                port,
                directory,
                extra: extra.clone(),
            };
            match server.wait_ready().await {
                Ok(()) => return server,
                Err(exited) => {
                    let log = server.log();
                    directory = server.take_directory();
                    if !exited || !log.contains("Address already in use") {
                        panic!("mariadbd did not start on port {port}:\n{log}");
                    }
                }
            }
        }
        panic!("no free port for mariadbd after 20 tries");
    }

    /// Kills the server (no clean shutdown: its current log ends without a rotation) and starts
    /// it again on the same files and port; it opens a new log.
    pub async fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let data = self.directory.path().join("data");
        self.child = spawn(self.directory.path(), &data, self.port, &self.extra);
        if self.wait_ready().await.is_err() {
            panic!("mariadbd did not start again:\n{}", self.log());
        }
    }

    /// `mysql://root@127.0.0.1:<port>/<database>`.
    pub fn url(&self, database: &str) -> String {
        format!("mysql://root@127.0.0.1:{}/{database}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.directory.path().join("server.log")).unwrap_or_default()
    }

    /// `Ok` once the server accepts a connection and answers; `Err(true)` when it exited first
    /// (a port taken, say), `Err(false)` when it did not answer within 60 s.
    async fn wait_ready(&mut self) -> Result<(), bool> {
        let url = self.url("mysql");
        for _ in 0..600 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return Err(true);
            }
            if let Ok(mut connection) =
                <sqlx::MySqlConnection as sqlx::Connection>::connect(&url).await
            {
                let answered = sqlx::query("SELECT 1").execute(&mut connection).await;
                let _ = sqlx::Connection::close(connection).await;
                if answered.is_ok() {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(false)
    }

    fn take_directory(mut self) -> TempDir {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::mem::replace(
            &mut self.directory,
            tempfile::tempdir().expect("a temporary directory"),
        )
    }
}

fn spawn(directory: &Path, data: &Path, port: u16, extra: &[String]) -> Child {
    let log = std::fs::File::create(directory.join("server.log")).expect("a log file");
    Command::new("mariadbd")
        .arg("--no-defaults")
        .arg(format!("--datadir={}", data.display()))
        .arg(format!("--port={port}"))
        .arg("--bind-address=127.0.0.1")
        .arg(format!(
            "--socket={}",
            directory.join("mysqld.sock").display()
        ))
        .arg(format!(
            "--pid-file={}",
            directory.join("mysqld.pid").display()
        ))
        .arg(format!("--tmpdir={}", directory.join("tmp").display()))
        .arg(format!("--log-bin={}", data.join("binlog").display()))
        .arg("--binlog-format=ROW")
        .arg("--binlog-row-image=FULL")
        .arg("--server-id=1")
        .arg("--user=root")
        // Small and quick: a test server holds a few thousand rows.
        .arg("--innodb-buffer-pool-size=32M")
        .arg("--innodb-log-file-size=16M")
        .arg("--skip-name-resolve")
        .arg("--performance-schema=OFF")
        .args(extra)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("mariadbd is installed")
}

/// A port in 20000..32768 nobody listens on (bound, then released): below Linux's ephemeral
/// range, so no outgoing connection takes it meanwhile.
fn free_port_below_32768() -> u16 {
    for _ in 0..1_000 {
        let port = 20_000 + rand::random::<u16>() % 12_768;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port below 32768");
}

impl Drop for BinlogServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
