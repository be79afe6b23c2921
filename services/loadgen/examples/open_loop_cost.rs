//! What the open-loop generator itself costs: it offers `--rate` requests a second for
//! `--seconds` (after one second of warm-up) to the ceiling (a bare axum handler on threads of
//! its own, answering a quote-sized body), on a one-worker runtime (as `rebate-loadgen chaos`
//! and `soak` run by default; `run` uses two), and prints the rate it kept, how late it ran, and the CPU its threads took (every
//! thread of the process but the ceiling's): requests per generator CPU-second is the figure
//! that says whether a burst can be offered on this machine's spare core.
//!
//! ```sh
//! cargo run --release -p loadgen --example open_loop_cost -- --rate 50000 --seconds 5
//! ```

#![allow(
    clippy::print_stdout,
    reason = "a measurement whose output is the report"
)]

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use loadgen::ceiling::{CEILING_THREAD, CeilingServer};
use loadgen::client::{LoadClient, Target};
use loadgen::generator::{OpenLoop, Workload, run_open_loop};
use loadgen::keys::KeyPicker;
use loadgen::procfs;
use loadgen::recorder::Phase;
use loadgen::schedule::{Schedule, Segment};
use tokio::time::Instant;

/// A quote as the service renders it (about the size of one).
const QUOTE: &[u8] = br#"{"traceId":"0af7651916cd43dd8448eb211c80319c","item":{"platform":"jd","itemId":"100002"},"title":"Item 100002","price":{"amount":"129.00","currency":"CNY"},"rebate":{"rate":"0.0450","amount":"5.81"},"coupons":[{"id":"c-1","discount":"10.00","threshold":"99.00"}],"extras":{"badge":"hot"},"degraded":false,"stale":false}"#;

struct Args {
    rate: f64,
    seconds: f64,
    ceiling_threads: usize,
    max_in_flight: usize,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        rate: 50_000.0,
        seconds: 5.0,
        // One thread of ceiling cannot answer what one of generator sends.
        ceiling_threads: 2,
        max_in_flight: 10_000,
    };
    let mut given = std::env::args().skip(1);
    while let Some(flag) = given.next() {
        let value = given
            .next()
            .with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--rate" => args.rate = value.parse().context("--rate")?,
            "--seconds" => args.seconds = value.parse().context("--seconds")?,
            "--ceiling-threads" => {
                args.ceiling_threads = value.parse().context("--ceiling-threads")?
            }
            "--max-in-flight" => args.max_in_flight = value.parse().context("--max-in-flight")?,
            other => anyhow::bail!(
                "unknown flag {other} (--rate RPS, --seconds S, --ceiling-threads N, --max-in-flight N)"
            ),
        }
    }
    anyhow::ensure!(
        (1.0..=1_000_000.0).contains(&args.rate),
        "--rate must be 1 to 1,000,000"
    );
    anyhow::ensure!(
        (0.5..=120.0).contains(&args.seconds),
        "--seconds must be 0.5 to 120"
    );
    anyhow::ensure!(
        (1..=16).contains(&args.ceiling_threads),
        "--ceiling-threads must be 1 to 16"
    );
    anyhow::ensure!(args.max_in_flight > 0, "--max-in-flight must be at least 1");
    Ok(args)
}

/// CPU ticks of this process's threads not named `name` (the ceiling's threads are all named
/// [`CEILING_THREAD`]: every other thread of this process is the generator's).
fn ticks_of_threads_but(name: &str) -> u64 {
    procfs::own_threads()
        .into_iter()
        .filter(|thread| thread.name != name)
        .map(|thread| thread.ticks)
        .sum()
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let ceiling = CeilingServer::start(
        QUOTE.to_vec(),
        "application/json".to_owned(),
        args.ceiling_threads,
    )?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let ticks_per_second = procfs::clock_ticks_per_second();
    runtime.block_on(async {
        let target = Target::parse(&ceiling.base_url())?;
        let client = LoadClient::new(Duration::from_secs(10))?;
        let workload = Workload::singles(Arc::new(KeyPicker::service_hot_list(1)?));
        let warm_up = Duration::from_secs(1);
        let measured = Duration::from_secs_f64(args.seconds);
        let plan = OpenLoop {
            schedule: Schedule::new(vec![
                Segment::constant(args.rate, warm_up),
                Segment::constant(args.rate, measured),
            ])?,
            measure_from: warm_up,
            phases: vec![Phase {
                name: "all".to_owned(),
                start: Duration::ZERO,
            }],
            max_in_flight: args.max_in_flight,
            drain_timeout: Duration::from_secs(5),
            window: Duration::from_secs(1),
            seed: 7,
        };
        let start = Instant::now() + Duration::from_millis(50);
        let cpu_at_start = ticks_of_threads_but(CEILING_THREAD);
        let output = run_open_loop(&client, &target, &workload, &plan, start).await;
        let cpu_seconds = ticks_of_threads_but(CEILING_THREAD).saturating_sub(cpu_at_start) as f64
            / ticks_per_second;
        let total = output.recorded.total.summary();
        let whole = (warm_up + measured).as_secs_f64();
        // `total_sent` counts the measured part's attempts; the warm-up's were sent as well.
        let requests = output.total_sent as f64 + args.rate * warm_up.as_secs_f64();
        println!("offered            {:>10.0} rps", output.offered_rps);
        println!(
            "answered 2xx       {:>10.0} rps ({} of {})",
            total.ok_2xx as f64 / output.elapsed.as_secs_f64(),
            total.ok_2xx,
            output.offered_requests
        );
        println!("client overflow    {:>10}", total.client_overflow);
        println!(
            "dispatch lag       p99 {:.2} ms, max {:.2} ms",
            output.dispatch.lag_p99_ms, output.dispatch.lag_max_ms
        );
        println!(
            "latency            p50 {:.2} ms, p99 {:.2} ms",
            total.p50_ms.unwrap_or(f64::NAN),
            total.p99_ms.unwrap_or(f64::NAN)
        );
        println!(
            "generator CPU      {cpu_seconds:.2} s over {whole:.2} s ({:.0} % of a core)",
            100.0 * cpu_seconds / whole
        );
        println!(
            "requests per generator CPU-second {:>10.0}",
            requests / cpu_seconds.max(1e-9)
        );
        anyhow::Ok(())
    })
}
