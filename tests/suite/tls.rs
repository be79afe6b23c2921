//! TLS to MariaDB: a test-owned `mariadbd` with a certificate the test's own CA signed, which
//! refuses plain connections. The store connects through it with `ssl-mode` and `ssl-ca` in its
//! URL (what `DATABASE_URL` carries in production), checks the server's certificate, and is
//! refused with another CA's.

use rebate_store::mysql::{MySqlConfig, MySqlStore};
use rebate_testkit::tls::TestPki;
use rebate_tests::binlog_server::BinlogServer;
use sqlx::Connection as _;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_speaks_tls_to_mariadb_and_checks_its_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let files = TestPki::new().write(dir.path());
    let server = BinlogServer::start_tls(&files).await;
    let verified = |ca: &std::path::Path| {
        format!(
            "{}?ssl-mode=VERIFY_IDENTITY&ssl-ca={}",
            server.url("mysql"),
            ca.display()
        )
    };

    // The session is encrypted: the server says which cipher it uses.
    let mut connection = sqlx::MySqlConnection::connect(&verified(&files.ca))
        .await
        .expect("the CA checks the server's certificate and its name");
    let (_, cipher): (String, String) = sqlx::query_as("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        .fetch_one(&mut connection)
        .await
        .unwrap();
    assert!(!cipher.is_empty(), "no TLS cipher in use");
    sqlx::query("CREATE DATABASE catalogue_tls")
        .execute(&mut connection)
        .await
        .unwrap();
    connection.close().await.unwrap();

    // The store's own path: its migrations and pool over TLS.
    let url = format!(
        "{}?ssl-mode=VERIFY_IDENTITY&ssl-ca={}",
        server.url("catalogue_tls"),
        files.ca.display()
    );
    MySqlStore::connect(&MySqlConfig::new(url))
        .await
        .expect("the store connects over TLS");

    // A plain connection is refused by the server; another CA's check refuses the server.
    let plain = format!("{}?ssl-mode=DISABLED", server.url("mysql"));
    assert!(sqlx::MySqlConnection::connect(&plain).await.is_err());
    let other_dir = tempfile::tempdir().unwrap();
    let other = TestPki::new().write(other_dir.path());
    assert!(
        sqlx::MySqlConnection::connect(&verified(&other.ca))
            .await
            .is_err(),
        "a certificate another CA signed is refused"
    );
}
