//! RabbitMQ for black-box tests: instances on a private topology of the shared broker, and a
//! proxy a test can cut to take the broker away from some instances.

use std::sync::Arc;
use std::time::Duration;

use crate::{ProductionEnv, TestApp, unique_suffix, wait_until};

/// Instances of one environment on a private RabbitMQ topology.
#[derive(Debug)]
pub struct AmqpFleet {
    pub instances: Vec<TestApp>,
    pub amqp_url: String,
    pub names: String,
}

impl AmqpFleet {
    pub async fn spawn(
        env: &ProductionEnv,
        name: &str,
        size: usize,
        customise: impl Fn(usize, &mut query_api::Settings),
    ) -> Self {
        let names = format!("test.{name}.{}.{:08x}", std::process::id(), unique_suffix());
        let amqp_url = std::env::var("AMQP_URL")
            .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
        let mut instances = Vec::new();
        for index in 0..size {
            instances.push(
                env.spawn_instance(|settings| {
                    let amqp = &mut settings.events.amqp;
                    settings.events.backend = query_api::config::EventBackend::Amqp;
                    amqp.url = amqp_url.clone();
                    amqp.exchange = format!("{names}.events");
                    amqp.shared_queue = format!("{names}.shared");
                    amqp.broadcast_queue_prefix = format!("{names}.instance.");
                    amqp.dead_letter_exchange = format!("{names}.dlx");
                    amqp.dead_letter_queue = format!("{names}.dead");
                    amqp.instance_id = format!("i{index}");
                    customise(index, settings);
                })
                .await,
            );
        }
        wait_until("every instance is connected to the broker", || {
            instances.iter().all(|app| app.state.events.is_ready())
        })
        .await;
        Self {
            instances,
            amqp_url,
            names,
        }
    }

    pub async fn stop(self) {
        for app in self.instances {
            app.stop().await;
        }
        delete_amqp_topology(&self.amqp_url, &self.names).await;
    }
}

/// A TCP proxy the test can cut (every connection closed, new ones refused) and restore: one
/// instance's broker outage while the broker serves the others. With `late_replies` it also
/// holds each chunk the server sends for a random time up to that bound (in order), so that a
/// query the server has already answered reaches the instance late: in front of MariaDB, a
/// rebuild that read a row before a write can finish after that write's event.
#[derive(Debug)]
pub struct CuttableProxy {
    pub address: std::net::SocketAddr,
    open: Arc<std::sync::atomic::AtomicBool>,
    cut: tokio::sync::watch::Sender<u64>,
}

impl CuttableProxy {
    pub async fn start(upstream: std::net::SocketAddr) -> Self {
        Self::with_late_replies(upstream, Duration::ZERO).await
    }

    pub async fn with_late_replies(upstream: std::net::SocketAddr, late_replies: Duration) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let open = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (cut, cuts) = tokio::sync::watch::channel(0u64);
        let accepting = Arc::clone(&open);
        tokio::spawn(async move {
            let mut connections = 0u64;
            while let Ok((client, _)) = listener.accept().await {
                if !accepting.load(std::sync::atomic::Ordering::SeqCst) {
                    continue;
                }
                connections += 1;
                let mut cuts = cuts.clone();
                // Only cuts after this connection opened end it.
                cuts.borrow_and_update();
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = relay(client, server, late_replies, connections) => {}
                        _ = cuts.changed() => {}
                    }
                });
            }
        });
        Self { address, open, cut }
    }
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@{}/%2f", self.address)
    }

    pub fn cut(&self) {
        self.open.store(false, std::sync::atomic::Ordering::SeqCst);
        self.cut.send_modify(|cuts| *cuts += 1);
    }

    pub fn restore(&self) {
        self.open.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Copies both ways until either side closes; replies from the server are held for up to
/// `late_replies` each (seeded per connection), never reordered.
async fn relay(
    mut client: tokio::net::TcpStream,
    mut server: tokio::net::TcpStream,
    late_replies: Duration,
    seed: u64,
) {
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    if late_replies.is_zero() {
        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
        return;
    }
    let (mut client_reads, mut client_writes) = client.split();
    let (mut server_reads, mut server_writes) = server.split();
    let requests = tokio::io::copy(&mut client_reads, &mut server_writes);
    let replies = async {
        let mut rng = SmallRng::seed_from_u64(0x1a7e + seed);
        let mut chunk = vec![0u8; 16 * 1024];
        loop {
            let read = match server_reads.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(read) => read,
            };
            let hold_ms = rng.random_range(0..=late_replies.as_millis() as u64);
            tokio::time::sleep(Duration::from_millis(hold_ms)).await;
            if client_writes.write_all(&chunk[..read]).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        _ = requests => {}
        _ = replies => {}
    }
}

pub async fn delete_amqp_topology(url: &str, names: &str) {
    use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
    let Ok(connection) =
        lapin::Connection::connect(url, lapin::ConnectionProperties::default()).await
    else {
        return;
    };
    let Ok(channel) = connection.create_channel().await else {
        return;
    };
    for queue in [format!("{names}.shared"), format!("{names}.dead")] {
        let _ = channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    for exchange in [format!("{names}.events"), format!("{names}.dlx")] {
        let _ = channel
            .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
            .await;
    }
    let _ = connection.close(200, "cleanup".into()).await;
}
